/**
 * CPU-bound handlers on threads, on the real RabbitMQ (issue 36), scaled down from the issue's
 * 60 s: a worker run by the CLI as a real process, concurrency 2, default heartbeat, whose threaded
 * handler burns 8 s of CPU per task. Every task concludes once, on its first attempt; `/health`
 * answers every poll meanwhile; progress flows during the computation; a SIGTERM in the middle of
 * a task exits within the documented bound. Real time, bounded.
 */
import { spawn } from "node:child_process"
import { createServer } from "node:net"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { declaredQueues, QUORUM_VHOST, urlFor } from "./broker.ts"
import { oncePerBroker, platformForSuite, spawnCliWorker } from "./cliWorker.ts"
import { baseEnv, denoBinary, ROOT } from "../support/runtimes.ts"
import { pollUntil, sleep } from "../support/waits.ts"

const WORKER = join(ROOT, "test/fixtures/threads/worker.mjs")
const BURN_MS = 8_000
const STARTED = /Worker threads-fixture started in service mode/

/** A port free now on 127.0.0.1, for the probes. */
const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port
      server.close(() => resolve(port))
    })
  })

/** Polls `/health` every 250 ms until `stop` says so: each answer's status and time. */
const pollHealth = async (port: number, stop: () => boolean) => {
  const polls: Array<{ readonly status: number; readonly ms: number }> = []
  while (!stop()) {
    const started = Date.now()
    const status = await fetch(`http://127.0.0.1:${port}/health`, {
      signal: AbortSignal.timeout(5_000),
    }).then((r) => r.status, () => 0)
    polls.push({ status, ms: Date.now() - started })
    await sleep(250)
  }
  return polls
}

describe.runIf(oncePerBroker())("threaded handlers on RabbitMQ", () => {
  const platformOf = platformForSuite()

  it(
    "two 8 s CPU-bound tasks at concurrency 2: each concluded once, attempt 1; /health answers every poll; progress flows; a SIGTERM mid-task exits within the bound",
    async () => {
      const broker = platformOf()
      const { name, inQueue, outQueue } = await declaredQueues(broker, "threads")
      const port = await freePort()
      const worker = spawnCliWorker(WORKER, inQueue, outQueue, {
        HEALTH_CHECK_PORT: String(port),
        WORKER_SHUTDOWN_GRACE_S: "2",
      })
      try {
        await pollUntil("the worker's start", () => STARTED.test(worker.stdout()), { ms: 30_000 })
        for (const id of ["t-a", "t-b"]) {
          broker.publish(inQueue, broker.envelope(`${name}-${id}`, { ms: BURN_MS }))
        }
        await broker.confirmed()
        const settled = () =>
          worker.records().filter((r) => String(r.msg).startsWith("Delivery settled:"))
        const polls = await pollHealth(port, () => settled().length >= 2)
        expect(settled().map((r) => [r.outcome, r.attempt])).toEqual([
          ["success", 1],
          ["success", 1],
        ])
        // Polled all along the computation, and answered each time at once: the loop was free.
        expect(polls.length).toBeGreaterThan(BURN_MS / 1000)
        expect(polls.filter((p) => p.status !== 200 || p.ms > 1_000)).toEqual([])
        const out = await broker.drain(outQueue)
        for (const id of ["t-a", "t-b"]) {
          const types = out.filter((m) => m.text.includes(`"${name}-${id}"`)).map((m) => m.type)
          expect(types[0]).toBe("started")
          expect(types.at(-1)).toBe("success")
          // About one a second for 8 s, the throttle's interval.
          expect(types.filter((t) => t === "progress").length).toBeGreaterThanOrEqual(4)
        }
        // A SIGTERM while a task computes: the drain's grace (2 s), then its thread is
        // terminated and the task requeued; exit 0 within max(grace, 5) + 17 s.
        broker.publish(inQueue, broker.envelope(`${name}-t-long`, { ms: 60_000 }))
        await broker.confirmed()
        await broker.readUntil(
          outQueue,
          (all) => all.some((m) => m.type === "started" && m.text.includes(`${name}-t-long`)),
          10_000,
        )
        // Computing on its thread now.
        await sleep(1_000)
        const signalled = Date.now()
        worker.child.kill("SIGTERM")
        const code = await Promise.race([worker.exited, sleep(22_000).then(() => "late")])
        expect(code).toBe(0)
        expect(Date.now() - signalled).toBeLessThan(22_000)
        expect(settled().at(-1)).toMatchObject({ outcome: "shutdown_requeued" })
      } finally {
        worker.child.kill("SIGKILL")
        await broker.remove(inQueue, outQueue)
      }
    },
    120_000,
  )

  it(
    "the example runs as a Deno script (Worker.run), its handler on a thread",
    async () => {
      const broker = platformOf()
      const { name, inQueue, outQueue } = await declaredQueues(broker, "threads-deno")
      const script = spawn(denoBinary(), ["run", "-A", join(ROOT, "examples/threads/worker.ts")], {
        cwd: ROOT,
        env: {
          ...baseEnv(),
          BROKER_URL: urlFor(QUORUM_VHOST),
          IN_QUEUE_NAME: inQueue,
          OUT_QUEUE_NAME: outQueue,
          HEALTH_CHECK_HOST: "127.0.0.1",
          HEALTH_CHECK_PORT: "0",
        },
        stdio: "ignore",
      })
      try {
        broker.publish(inQueue, broker.envelope(`${name}-t`, { text: "hello", rounds: 1000 }))
        await broker.confirmed()
        const out = await broker.readUntil(outQueue, (all) => all.some((m) => m.type === "success"))
        expect(JSON.parse(out.at(-1)!.text).data.response.score).toEqual(expect.any(Number))
      } finally {
        script.kill("SIGKILL")
        await broker.remove(inQueue, outQueue)
      }
    },
    60_000,
  )
})
