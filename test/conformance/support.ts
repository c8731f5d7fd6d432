/**
 * A worker process for the conformance kit to check: the SDK's conformance worker or a raw
 * fixture, on the service's own queues of the quorum vhost, until stopped.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { QUORUM_VHOST, urlFor } from "../integration/broker.ts"
import { baseEnv, ROOT } from "../support/runtimes.ts"

/** The size limit the tests' workers are run with: a poison case of one byte more stays small. */
export const MAX_MESSAGE_BYTES = 65_536

export interface ServedWorker {
  /** Resolves once the worker says it consumes; rejects if it exits first. */
  readonly started: Promise<void>
  readonly stop: () => Promise<void>
}

export const serveWorker = (
  command: string,
  args: ReadonlyArray<string>,
  service: string,
  env: Record<string, string> = {},
): ServedWorker => {
  const child: ChildProcess = spawn(command, args, {
    cwd: ROOT,
    env: {
      ...baseEnv(),
      BROKER_URL: urlFor(QUORUM_VHOST),
      IN_QUEUE_NAME: `${service}_queue_in`,
      OUT_QUEUE_NAME: `${service}_queue_out`,
      HEALTH_CHECK_HOST: "127.0.0.1",
      HEALTH_CHECK_PORT: "0",
      WORKER_DELIVERY_LIMIT: "3",
      WORKER_MAX_MESSAGE_BYTES: String(MAX_MESSAGE_BYTES),
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
      else if (child.exitCode !== null) clearInterval(timer), reject(new Error(`exited: ${output}`))
    }, 50)
  })
  const stop = () =>
    new Promise<void>((resolve) => {
      if (child.exitCode !== null) return resolve()
      child.once("exit", () => resolve())
      child.kill("SIGTERM")
    })
  return { started, stop }
}
