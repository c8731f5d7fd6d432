/**
 * A blocked event loop on the real RabbitMQ (issue 35): a worker with the default settings, run by
 * the `async-task-worker` CLI as a real process, whose handler blocks the loop for 45 s with a
 * synchronous busy loop. Its task must conclude `success` on its first run (one `started`, one
 * decision line), and one WARNING must name the block and the task. With the heartbeat of 10 s of
 * 0.2 the broker dropped the connection during the block, and the task ran again. Real time,
 * bounded: the block is the process's own.
 */
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { declaredQueues } from "./broker.ts"
import { oncePerBroker, platformForSuite, spawnCliWorker } from "./cliWorker.ts"
import { ROOT } from "../support/runtimes.ts"
import { pollUntil, sleep } from "../support/waits.ts"

const WORKER = join(ROOT, "test/fixtures/event-loop/worker.mjs")
const BLOCK_MS = 45_000
const STARTED = /Worker event-loop-fixture started in service mode/

describe.runIf(oncePerBroker())("a blocked event loop on RabbitMQ", () => {
  const platformOf = platformForSuite()

  it(
    "a handler blocking the loop for 45 s with the default settings: success on the first run, one WARNING naming the block and the task",
    async () => {
      const broker = platformOf()
      const { name, inQueue, outQueue } = await declaredQueues(broker, "event-loop")
      const worker = spawnCliWorker(WORKER, inQueue, outQueue)
      try {
        await pollUntil("the worker's start", () => STARTED.test(worker.stdout()), { ms: 30_000 })
        const taskId = `${name}-task`
        broker.publish(inQueue, broker.envelope(taskId, { block_ms: BLOCK_MS }))
        await broker.confirmed()
        const out = await broker.readUntil(
          outQueue,
          (all) => all.some((m) => m.type === "success" || m.type === "failure"),
          110_000,
        )
        expect(out.map((m) => m.type)).toEqual(["started", "success"])
        await pollUntil(
          "the decision line",
          () => worker.records().some((r) => r.task_id === taskId && r.outcome !== undefined),
          { ms: 10_000 },
        )
        const decisions = worker.records().filter((r) =>
          String(r.msg).startsWith("Delivery settled:")
        )
        expect(decisions.map((r) => [r.task_id, r.outcome])).toEqual([[taskId, "success"]])
        const blocks = worker.records().filter((r) =>
          String(r.msg).startsWith("The event loop was blocked")
        )
        expect(blocks).toHaveLength(1)
        expect(blocks[0]!.level).toMatch(/^WARN/)
        expect(String(blocks[0]!.msg)).toContain(`with the task ${taskId} in flight`)
        expect(blocks[0]!.blocked_s).toBeGreaterThanOrEqual(44)
        expect(blocks[0]!.blocked_s).toBeLessThan(60)
        // The connection held through the block.
        expect(worker.stdout()).not.toContain("was lost")
      } finally {
        worker.child.kill("SIGTERM")
        await Promise.race([worker.exited, sleep(30_000)])
        worker.child.kill("SIGKILL")
        await broker.remove(inQueue, outQueue)
      }
    },
    150_000,
  )
})
