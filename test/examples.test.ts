/**
 * The deployment examples are parsed and checked against the SDK itself: the settings they set
 * validate, and each pod's grace period covers the worker's bounded shutdown.
 */
import { readFileSync } from "node:fs"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, Exit } from "effect"
import { parseAllDocuments } from "yaml"
import { shutdownBound } from "../src/Lifecycle.ts"
import * as Settings from "../src/Settings.ts"

const deploy = new URL("../examples/deploy/", import.meta.url)
const read = (path: string) => readFileSync(new URL(path, deploy), "utf8")

const documents = (path: string): Array<any> =>
  parseAllDocuments(read(path)).map((doc) => {
    expect(doc.errors).toEqual([])
    return doc.toJS()
  })

interface EnvVar {
  readonly name: string
  readonly value?: string
  readonly valueFrom?: unknown
}

const literalEnv = (container: { env: Array<EnvVar> }): Map<string, string> =>
  new Map(
    container.env.flatMap((e) => (e.value === undefined ? [] : [[e.name, e.value] as const])),
  )

const settingsOf = (env: Map<string, string>) =>
  Settings.make(
    { name: "count-words", timeout: Duration.seconds(30) },
    { brokerUrl: "amqp://user:secret@rabbitmq:5672/" },
  ).pipe(
    Effect.provideService(
      ConfigProvider.ConfigProvider,
      ConfigProvider.fromEnv({ env: Object.fromEntries(env) }),
    ),
  )

const checkPod = (pod: any) =>
  Effect.gen(function* () {
    const [container] = pod.containers
    const brokerUrl = container.env.find((e: EnvVar) => e.name === "BROKER_URL")
    expect(brokerUrl.value).toBeUndefined()
    expect(brokerUrl.valueFrom.secretKeyRef).toBeDefined()
    const settings = yield* settingsOf(literalEnv(container))
    const bound = Duration.toSeconds(shutdownBound(settings.shutdownGrace))
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThan(bound)
    expect(container.ports).toContainEqual({ name: "probes", containerPort: 8083 })
    return settings
  })

describe("examples/deploy", () => {
  it.effect("the Deployment's settings validate and its grace period covers the shutdown", () =>
    Effect.gen(function* () {
      const [deployment] = documents("kubernetes/deployment.yaml")
      expect(deployment.kind).toBe("Deployment")
      const pod = deployment.spec.template.spec
      const settings = yield* checkPod(pod)
      expect(settings.mode).toBe("service")
      const [container] = pod.containers
      expect(container.livenessProbe.httpGet).toEqual({ path: "/health", port: "probes" })
      expect(container.readinessProbe.httpGet).toEqual({ path: "/ready", port: "probes" })
    }))

  it.effect("the ScaledJob runs job mode on the worker's input queue", () =>
    Effect.gen(function* () {
      const [scaledJob, auth] = documents("kubernetes/scaledjob.yaml")
      expect(scaledJob.kind).toBe("ScaledJob")
      const pod = scaledJob.spec.jobTargetRef.template.spec
      expect(pod.restartPolicy).toBe("Never")
      const settings = yield* checkPod(pod)
      expect(settings.mode).toBe("job")
      expect(settings.concurrency).toBe(1)
      const [trigger] = scaledJob.spec.triggers
      expect(trigger.type).toBe("rabbitmq")
      expect(trigger.metadata.queueName).toBe(settings.inQueue)
      expect(trigger.authenticationRef.name).toBe(auth.metadata.name)
    }))

  it("an invalid setting in a manifest would be caught", () => {
    const exit = Effect.runSyncExit(settingsOf(new Map([["WORKER_MODE", "batch"]])))
    expect(Exit.isFailure(exit)).toBe(true)
  })

  it.each([
    ["Dockerfile.deno", "worker.ts"],
    ["Dockerfile.node", "worker.mjs"],
  ])("%s starts %s in exec form, so that the runtime receives SIGTERM", (file, script) => {
    const entrypoint = read(file).split("\n").find((line) => line.startsWith("ENTRYPOINT "))
    expect(entrypoint).toBeDefined()
    const argv: Array<string> = JSON.parse(entrypoint!.slice("ENTRYPOINT ".length))
    expect(["deno", "node"]).toContain(argv[0])
    expect(argv.some((arg) => arg.endsWith(script))).toBe(true)
    expect(read(file)).toMatch(new RegExp(`^COPY (--chown=\\S+ )?${script} \\.$`, "m"))
    expect(read(script).length).toBeGreaterThan(0)
  })

  it("Dockerfile.deno warms Deno's code cache as the worker's user, with the entrypoint's permissions", () => {
    const text = read("Dockerfile.deno")
    const lines = text.split("\n")
    const entrypoint: Array<string> = JSON.parse(
      lines.find((line) => line.startsWith("ENTRYPOINT "))!.slice("ENTRYPOINT ".length),
    )
    const user = lines.indexOf("USER deno")
    const warm = lines.findIndex((line) => line.includes("WORKER_TRANSPORT=memory"))
    expect(user).toBeGreaterThan(-1)
    expect(warm).toBeGreaterThan(user)
    // The warm-up runs one task in job mode, so that it exits, with the entrypoint's command line.
    const warmUp = lines.slice(warm - 1, warm + 2).join("\n")
    expect(warmUp).toContain("WORKER_MODE=job WORKER_JOB_MAX_TASKS=1")
    expect(warmUp).toContain(entrypoint.join(" "))
    expect(warmUp).toMatch(/echo '\{"task_id": "warm-up"/)
  })

  it("Dockerfile.node-bundle builds worker.mjs into one file, warms its cache, and runs it in exec form", () => {
    const lines = read("Dockerfile.node-bundle").split("\n")
    const stages = lines.filter((line) => line.startsWith("FROM "))
    // The cache is V8's of the build stage: the image must run the same Node.
    expect(stages.map((line) => line.split(" ")[1])).toEqual(["node:22-slim", "node:22-slim"])
    expect(lines).toContain("COPY worker.mjs bundle/build.mjs bundle/start.cjs ./")
    expect(lines).toContain("RUN node build.mjs ./worker.mjs worker bundle")
    expect(lines.some((line) => line.includes("node bundle/start.cjs --warm"))).toBe(true)
    const entrypoint = lines.find((line) => line.startsWith("ENTRYPOINT "))!
    expect(JSON.parse(entrypoint.slice("ENTRYPOINT ".length))).toEqual(["node", "bundle/start.cjs"])
    for (const copied of ["worker.mjs", "bundle/build.mjs", "bundle/start.cjs"]) {
      expect(read(copied).length).toBeGreaterThan(0)
    }
  })

  it("Dockerfile.deno-bundle builds worker.ts into one file, warms its cache on Deno as the worker's user, and runs it in exec form", () => {
    const lines = read("Dockerfile.deno-bundle").split("\n")
    const stages = lines.filter((line) => line.startsWith("FROM "))
    expect(stages.map((line) => line.split(" ")[1])).toEqual([
      "node:22-slim",
      read("Dockerfile.deno").split("\n").find((line) => line.startsWith("FROM "))!.split(" ")[1],
    ])
    expect(lines).toContain("COPY worker.ts bundle/build.mjs bundle/start.cjs ./")
    expect(lines).toContain("RUN node build.mjs ./worker.ts worker bundle")
    const entrypoint: Array<string> = JSON.parse(
      lines.find((line) => line.startsWith("ENTRYPOINT "))!.slice("ENTRYPOINT ".length),
    )
    expect(entrypoint.slice(0, 2)).toEqual(["deno", "run"])
    expect(entrypoint.at(-1)).toBe("bundle/start.cjs")
    // V8 takes a cache only from its own version: the warm-up runs in the Deno stage, as the
    // user the worker runs as, with the entrypoint's permissions and the right to write the cache.
    const final = lines.findLastIndex((line) => line.startsWith("FROM "))
    const user = lines.indexOf("USER deno")
    const warm = lines.findIndex((line) => line.includes("bundle/start.cjs --warm"))
    expect(user).toBeGreaterThan(final)
    expect(warm).toBeGreaterThan(user)
    const warmUp = lines[warm]!.trim().split(/\s+/)
    for (const arg of entrypoint) expect(warmUp).toContain(arg)
    expect(warmUp).toContain("--allow-write=bundle")
    expect(lines.slice(warm - 1, warm + 1).join("\n")).toMatch(/echo '\{"task_id": "warm-up"/)
  })
})
