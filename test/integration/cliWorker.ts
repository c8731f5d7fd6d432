/**
 * A worker run by the `async-task-worker` CLI as a real process on Node, on the broker under test:
 * a fixture module importing the SDK from `WORKER_SDK` (so that the CLI and the worker share one
 * copy), its JSON log read back as records.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { QUORUM_VHOST, urlFor } from "./broker.ts"
import { baseEnv, ROOT, runtimeSpec } from "../support/runtimes.ts"

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

/** Waits until `check` holds, polling every 50 ms; throws naming `what` after `ms`. */
export const waitUntil = async (check: () => boolean, ms: number, what: string) => {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}
