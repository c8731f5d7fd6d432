/**
 * The conformance kit against the SDK's own conformance worker (examples/conformance/worker.ts),
 * run by the CLI as a real process on the runtime running this file (Deno from the sources, Node
 * from dist/), on a quorum vhost of the real RabbitMQ: every rule passes.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { join } from "node:path"
import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Conformance from "../../src/Conformance.ts"
import { ensureVhosts, QUORUM_VHOST, uniqueName, urlFor } from "../integration/broker.ts"
import { baseEnv, checkBuild, ROOT, type Runtime, runtimeSpec } from "../support/runtimes.ts"

const runtime: Runtime = "deno" in process.versions ? "deno" : "node"
const WORKER = join(ROOT, "examples/conformance/worker.ts")

/** The conformance worker of the SDK, as the CLI runs it, until `stop`. */
const serve = (service: string, env: Record<string, string>) => {
  const spec = runtimeSpec(runtime)
  const child: ChildProcess = spawn(spec.command, [...spec.args, "run", WORKER], {
    cwd: ROOT,
    env: {
      ...baseEnv(),
      BROKER_URL: urlFor(QUORUM_VHOST),
      IN_QUEUE_NAME: `${service}_queue_in`,
      OUT_QUEUE_NAME: `${service}_queue_out`,
      HEALTH_CHECK_HOST: "127.0.0.1",
      HEALTH_CHECK_PORT: "0",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  })
  let output = ""
  child.stdout!.on("data", (chunk) => (output += chunk))
  child.stderr!.on("data", (chunk) => (output += chunk))
  const started = new Promise<void>((resolve, reject) => {
    const timer = setInterval(() => {
      if (output.includes("started in service mode")) clearInterval(timer), resolve()
      if (child.exitCode !== null) clearInterval(timer), reject(new Error(`exited: ${output}`))
    }, 50)
  })
  const stop = () =>
    new Promise<void>((resolve) => {
      if (child.exitCode !== null) return resolve()
      child.once("exit", () => resolve())
      child.kill("SIGTERM")
    })
  return { started, stop, output: () => output }
}

beforeAll(() => {
  ensureVhosts()
  if (runtime === "node") checkBuild()
}, 60_000)

const running: Array<ReturnType<typeof serve>> = []
afterAll(() => Promise.all(running.map((w) => w.stop())), 30_000)

describe(`the conformance kit, ${runtime}`, () => {
  it("passes every rule against the SDK's conformance worker", async () => {
    const service = uniqueName("conformance")
    const worker = serve(service, { WORKER_DELIVERY_LIMIT: "3" })
    running.push(worker)
    await worker.started
    const report = await Conformance.run({
      brokerUrl: urlFor(QUORUM_VHOST),
      service,
      deliveryLimit: 3,
      unacked: Conformance.rabbitmqctlUnacked(QUORUM_VHOST, `${service}_queue_in`),
    })
    console.log(Conformance.format(report))
    expect(report.rules.filter((r) => r.verdict !== "pass")).toEqual([])
    expect(report.passed).toBe(true)
  }, 120_000)
})
