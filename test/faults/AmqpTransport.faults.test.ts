/**
 * The at-least-once promise under faults, on the real broker: connections closed under load and
 * a broker restart lose no task, and no terminal message goes out for a task whose lease is
 * gone. Run alone (vitest.alone.config.ts): it restarts the broker.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Effect, Fiber, Layer, References, Schema } from "effect"
import * as AmqpTransport from "../../src/AmqpTransport.ts"
import * as Settings from "../../src/Settings.ts"
import { Transport } from "../../src/Transport.ts"
import * as Worker from "../../src/Worker.ts"
import {
  ensureBrokerRunning,
  ensureVhosts,
  platform,
  QUORUM_VHOST,
  rabbitmqctl,
  uniqueName,
  urlFor,
} from "../integration/broker.ts"
import { textOf } from "../support/builders.ts"
import { sleep } from "../support/waits.ts"

/** A broker's stop and start take longer than most `rabbitmqctl` calls. */
const SLOW = { timeout: 120_000 }

const worker = (name: string) =>
  Worker.make({
    name,
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ n: Schema.Number }),
    timeout: "20 seconds",
    handler: (input) => Effect.as(Effect.sleep(`${2 + (input.n % 7)} millis`), { n: input.n }),
  })

/**
 * Wraps the transport to watch fencing: for each task, whether the lease of its latest delivery
 * is lost when a terminal message for it is published.
 */
const fencingWatch = () => {
  const lost = new Map<string, boolean>()
  let violations = 0
  const wrap = (transport: Transport["Service"]): Transport["Service"] => ({
    ...transport,
    take: Effect.map(transport.take, (next) => {
      if (next._tag === "None") return next
      const delivery = next.value
      try {
        const taskId = JSON.parse(textOf(delivery.body)).task_id as string
        lost.set(taskId, false)
        delivery.lease.onLost(() => lost.set(taskId, true))
      } catch {
        // Not a task: nothing to watch.
      }
      return next
    }),
    publish: (body, type) =>
      Effect.suspend(() => {
        if (type === "success" || type === "failure") {
          const taskId = JSON.parse(textOf(body)).task_id as string
          if (lost.get(taskId) === true) violations++
        }
        return transport.publish(body, type)
      }),
  })
  return { wrap, violations: () => violations }
}

const runWorker = (
  name: string,
  wrap: (t: Transport["Service"]) => Transport["Service"],
  concurrency: number,
) => {
  const settings = Settings.layer({ name, timeout: worker(name).timeout }, {
    brokerUrl: urlFor(QUORUM_VHOST),
    concurrency,
    retryBackoffBase: "10 millis",
    retryBackoffMax: "50 millis",
  })
  const transport = Layer.effect(
    Transport,
    Effect.map(
      Effect.flatMap(Settings.Settings, (s) =>
        AmqpTransport.make({
          url: s.brokerUrl._tag === "Some" ? s.brokerUrl.value : (() => {
            throw new Error("no url")
          })(),
          inQueue: s.inQueue,
          outQueue: s.outQueue,
          capacity: s.concurrency,
          reconnectBase: "50 millis",
          reconnectMax: "1 second",
        })),
      wrap,
    ),
  )
  const fiber = Effect.runFork(
    Worker.serve(worker(name)).pipe(
      Effect.provide(transport.pipe(Layer.provideMerge(settings))),
      Effect.provideService(References.MinimumLogLevel, "Error"),
    ),
  )
  return { stop: () => Effect.runPromise(Fiber.interrupt(fiber)) }
}

beforeAll(() => {
  ensureBrokerRunning()
  ensureVhosts()
}, 120_000)
afterAll(() => ensureBrokerRunning(), 120_000)

describe("AmqpTransport under faults", () => {
  it("2 000 tasks at concurrency 20 through 5 closed connections and a broker restart: none lost, none concluded after its lease", async () => {
    const TASKS = 2000
    const name = uniqueName("faults")
    const watch = fencingWatch()
    const running = runWorker(name, watch.wrap, 20)
    let broker = await platform(QUORUM_VHOST)
    try {
      await broker.waitForQueues(name)
      for (let i = 0; i < TASKS; i++) {
        broker.publish(`${name}_queue_in`, broker.envelope(`t-${i}`, { n: i }))
      }
      await broker.close()
      for (let i = 0; i < 5; i++) {
        await sleep(300)
        rabbitmqctl("close_all_connections", "fault test", SLOW)
      }
      await sleep(300)
      rabbitmqctl("stop_app", SLOW)
      rabbitmqctl("start_app", SLOW)
      rabbitmqctl("await_startup", SLOW)
      broker = await platform(QUORUM_VHOST)
      const concluded = new Map<string, number>()
      const deadline = Date.now() + 90_000
      while (concluded.size < TASKS && Date.now() < deadline) {
        for (const m of await broker.drain(`${name}_queue_out`)) {
          if (m.type === "success" || m.type === "failure") {
            const taskId = JSON.parse(m.text).task_id as string
            concluded.set(taskId, (concluded.get(taskId) ?? 0) + 1)
          }
        }
        await sleep(100)
      }
      await running.stop()
      const stillQueued = await broker.count(`${name}_queue_in`)
      const duplicates = [...concluded.values()].reduce((sum, n) => sum + n - 1, 0)
      const lost = TASKS - concluded.size - stillQueued
      console.log(
        `faults: ${TASKS} tasks, concluded ${concluded.size}, still queued ${stillQueued}, lost ${lost}, ` +
          `duplicate terminal messages ${duplicates}, terminal messages after a lost lease ${watch.violations()}`,
      )
      expect(lost).toBeLessThanOrEqual(0)
      expect(concluded.size + stillQueued).toBeGreaterThanOrEqual(TASKS)
      // A duplicate is a task run again after its lease was lost mid-flight: at most what was in
      // flight (20) at each of the 6 faults.
      expect(duplicates).toBeLessThanOrEqual(20 * 6)
      expect(watch.violations()).toBe(0)
    } finally {
      await running.stop()
      ensureBrokerRunning()
      await broker.remove(`${name}_queue_in`, `${name}_queue_out`).catch(() => undefined)
      await broker.close().catch(() => undefined)
    }
  })

  it("a worker started while the broker is down consumes within 5 s of its return", async () => {
    const name = uniqueName("down")
    rabbitmqctl("stop_app", SLOW)
    let running: { stop: () => Promise<unknown> } | undefined
    try {
      running = runWorker(name, (t) => t, 1)
      await sleep(2000)
    } finally {
      rabbitmqctl("start_app", SLOW)
      rabbitmqctl("await_startup", SLOW)
    }
    const back = Date.now()
    const broker = await platform(QUORUM_VHOST)
    try {
      await broker.waitForQueues(name, 10_000)
      broker.publish(`${name}_queue_in`, broker.envelope("t-after", { n: 1 }))
      const out = await broker.readUntil(
        `${name}_queue_out`,
        (all) => all.some((m) => m.type === "success"),
        10_000,
      )
      const seconds = (Date.now() - back) / 1000
      console.log(`down: consumed a task ${seconds.toFixed(2)} s after the broker returned`)
      expect(out.some((m) => m.type === "success")).toBe(true)
      expect(seconds).toBeLessThan(5)
    } finally {
      await running?.stop()
      await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      await broker.close()
    }
  })
})
