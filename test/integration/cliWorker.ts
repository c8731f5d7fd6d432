/**
 * A worker run by the `async-task-worker` CLI as a real process on Node, on the broker under test:
 * a fixture module importing the SDK from `WORKER_SDK` (so that the CLI and the worker share one
 * copy), its JSON log read back as records.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { afterAll, beforeAll } from "vitest"
import { ensureVhosts, isRabbitMQ4, platform, QUORUM_VHOST, urlFor } from "./broker.ts"
import { onNode22 } from "../support/nodes.ts"
import { baseEnv, checkBuild, ROOT, runtimeSpec } from "../support/runtimes.ts"

/**
 * Whether this pass runs the suites of a CLI worker: its process is Node whatever runs the suite,
 * so once per broker, in the Node 22 pass and in the RabbitMQ 4.3 one.
 */
export const oncePerBroker = (): boolean => onNode22() || isRabbitMQ4()

/** The platform's side on the quorum vhost for the describe block it is called in, built once. */
export const platformForSuite = () => {
  let broker: Awaited<ReturnType<typeof platform>> | undefined
  beforeAll(async () => {
    checkBuild()
    ensureVhosts()
    broker = await platform(QUORUM_VHOST)
  })
  afterAll(() => broker?.close())
  return () => broker!
}

/** Runs the worker `module` exports, consuming `inQueue` on the quorum vhost; `env` adds settings. */
export const spawnCliWorker = (
  module: string,
  inQueue: string,
  outQueue: string,
  env: Readonly<Record<string, string>> = {},
) => {
  const spec = runtimeSpec("node")
  const child: ChildProcess = spawn(spec.command, [...spec.args, "run", module], {
    cwd: ROOT,
    env: {
      ...baseEnv(),
      WORKER_SDK: spec.sdk,
      BROKER_URL: urlFor(QUORUM_VHOST),
      IN_QUEUE_NAME: inQueue,
      OUT_QUEUE_NAME: outQueue,
      HEALTH_CHECK_HOST: "127.0.0.1",
      HEALTH_CHECK_PORT: "0",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  })
  let stdout = ""
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => void (stdout += chunk))
  child.stderr!.resume()
  const exited = new Promise<number | null>((resolve) => child.once("close", resolve))
  /** The log records written so far, whole lines only. */
  const records = (): Array<Record<string, unknown>> =>
    stdout.split("\n").slice(0, -1).filter((l) => l.startsWith("{")).map((l) => JSON.parse(l))
  return { child, exited, stdout: () => stdout, records }
}
