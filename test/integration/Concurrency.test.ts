/**
 * Concurrency control on the real RabbitMQ (issue 6, acceptance 2): a resize under load changes
 * the number of deliveries the broker counts as unacknowledged, and `onIdle` fires once a backlog
 * is drained. The broker's own figures are read with `rabbitmqctl`.
 */
import { execFileSync } from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Effect, Exit, Fiber, Logger, Schema } from "effect"
import * as Settings from "../../src/Settings.ts"
import * as Worker from "../../src/Worker.ts"
import { ensureVhosts, platform, QUORUM_VHOST, uniqueName, urlFor } from "./broker.ts"
import { serveInProcess } from "./worker.ts"
import { pollUntil, sleep } from "../support/waits.ts"

const TIMEOUT = 90_000

/** The broker's count of unacknowledged and ready messages of `queue`. */
const queueStats = (queue: string): { readonly unacked: number; readonly ready: number } => {
  const out = execFileSync(
    "rabbitmqctl",
    ["-q", "list_queues", "-p", QUORUM_VHOST, "name", "messages_unacknowledged", "messages_ready"],
    { encoding: "utf8", timeout: 30_000 },
  )
  const line = out.split("\n").map((l) => l.split("\t")).find(([name]) => name === queue)
  if (line === undefined) throw new Error(`${queue} is not listed by rabbitmqctl`)
  return { unacked: Number(line[1]), ready: Number(line[2]) }
}

/**
 * Polls `probe` every 100 ms until `done` holds of what it reads, within `ms`; fails with the last
 * value read.
 */
const waitFor = async <A>(
  what: string,
  probe: () => A | Promise<A>,
  done: (a: A) => boolean,
  ms = 20_000,
): Promise<A> => {
  let last: A | undefined
  const found = await pollUntil(what, async () => {
    const value = await probe()
    last = value
    return done(value) && { value }
  }, { ms, every: 100, said: () => `; last ${JSON.stringify(last)}` })
  return found.value
}

/** Runs `worker` on RabbitMQ (quorum vhost) until stopped; `fiber` ends when `serve` does. */
const serveOnQuorum = <A, I, O>(
  worker: Worker.Worker<A, I, O, never>,
  overrides: Settings.SettingsOverrides,
) =>
  serveInProcess(
    worker,
    Settings.layer({ name: worker.name, timeout: worker.timeout }, {
      brokerUrl: urlFor(QUORUM_VHOST),
      shutdownGrace: "2 seconds",
      ...overrides,
    }),
    // Decision lines are INFO: only warnings and errors are printed.
    { logger: Logger.defaultLogger, level: "Warn" },
  )

const Input = Schema.Struct({ n: Schema.Number })
const Output = Schema.Struct({ n: Schema.Number })

/**
 * A worker whose tasks each wait on their own gate: `running` holds the tasks started and not yet
 * let go, `release` lets the ones running now finish, `openAll` lets every task through.
 */
const gated = (name: string) => {
  const running = new Map<number, () => void>()
  let open = false
  let started = 0
  let peak = 0
  const worker = Worker.make({
    name,
    input: Input,
    output: Output,
    timeout: "60 seconds",
    handler: async (input, ctx) => {
      started++
      if (!open) {
        await new Promise<void>((resolve, reject) => {
          running.set(input.n, resolve)
          peak = Math.max(peak, running.size)
          ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason), { once: true })
        }).finally(() => running.delete(input.n))
      }
      return { n: input.n }
    },
  })
  return {
    worker,
    running,
    started: () => started,
    peak: () => peak,
    resetPeak: () => void (peak = running.size),
    release: () => {
      for (const resolve of [...running.values()]) resolve()
    },
    openAll: () => {
      open = true
      for (const resolve of [...running.values()]) resolve()
    },
  }
}

beforeAll(() => ensureVhosts(), TIMEOUT)

describe("Concurrency on RabbitMQ (quorum queues)", () => {
  let broker: Awaited<ReturnType<typeof platform>>
  beforeAll(async () => {
    broker = await platform(QUORUM_VHOST)
  })
  afterAll(() => broker.close())

  it(
    "a resize under load changes the unacked deliveries: grow, shrink without cancelling, pause, resume",
    async () => {
      const name = uniqueName("resize")
      const inQueue = `${name}_queue_in`
      const tasks = gated(name)
      const w = serveOnQuorum(tasks.worker, { concurrency: 5 })
      const unacked = (expected: (n: number) => boolean, what: string) =>
        waitFor(what, () => queueStats(inQueue), (s) => expected(s.unacked))
      try {
        await broker.waitForQueues(name)
        for (let i = 0; i < 200; i++) broker.publish(inQueue, broker.envelope(`t-${i}`, { n: i }))
        await broker.confirmed()

        // At 5: five tasks run, five deliveries unacked, the rest ready.
        await waitFor("5 running", () => tasks.running.size, (n) => n === 5)
        let stats = await unacked((n) => n === 5, "unacked 5")
        expect(stats.ready).toBe(195)
        await sleep(500)
        expect(queueStats(inQueue).unacked).toBe(5)
        expect(tasks.running.size).toBe(5)
        expect(tasks.peak()).toBe(5)

        // Growing to 20 grants capacity at once, with the 5 still running.
        await tasks.worker.setConcurrency(20)
        expect(await Effect.runPromise([...tasks.worker.instances][0]!.concurrency)).toBe(20)
        await waitFor("20 running", () => tasks.running.size, (n) => n === 20)
        stats = await unacked((n) => n >= 20, "unacked 20")
        await sleep(500)
        stats = queueStats(inQueue)
        expect({ unacked: stats.unacked, running: tasks.running.size }).toEqual({
          unacked: 20,
          running: 20,
        })
        expect(tasks.peak()).toBe(20)

        // Shrinking to 2 cancels nothing: the 20 go on, and no task starts while 2 or more run.
        const before = tasks.started()
        await tasks.worker.setConcurrency(2)
        await sleep(1_000)
        expect(tasks.running.size).toBe(20)
        expect(tasks.started()).toBe(before)
        // Once they settle, at most 2 deliveries stay unacked (and 2 tasks run).
        tasks.resetPeak()
        tasks.release()
        await waitFor("2 running", () => tasks.running.size, (n) => n === 2)
        stats = await unacked((n) => n <= 2, "unacked <= 2")
        await sleep(500)
        expect(queueStats(inQueue).unacked).toBeLessThanOrEqual(2)
        expect(tasks.running.size).toBe(2)

        // 0 pauses: the two running finish, nothing new is delivered.
        await tasks.worker.setConcurrency(0)
        const paused = tasks.started()
        tasks.release()
        await unacked((n) => n === 0, "unacked 0 while paused")
        const readyWhilePaused = queueStats(inQueue).ready
        await sleep(1_500)
        expect(queueStats(inQueue)).toEqual({ unacked: 0, ready: readyWhilePaused })
        expect(tasks.started()).toBe(paused)
        expect(tasks.running.size).toBe(0)

        // Resuming at 3: three deliveries again.
        await tasks.worker.setConcurrency(3)
        await waitFor("3 running", () => tasks.running.size, (n) => n === 3)
        await unacked((n) => n === 3, "unacked 3 after resume")
        expect(queueStats(inQueue).ready).toBe(readyWhilePaused - 3)

        // Let everything through: the backlog drains.
        tasks.openAll()
        await tasks.worker.setConcurrency(50)
        await waitFor(
          "backlog drained",
          () => queueStats(inQueue),
          (s) => s.ready === 0 && s.unacked === 0,
          30_000,
        )
        expect(tasks.started()).toBe(200)
      } finally {
        tasks.openAll()
        await w.stop()
        await broker.remove(inQueue, `${name}_queue_out`)
      }
    },
    TIMEOUT,
  )

  it(
    "rejects an invalid concurrency and leaves the target as it was",
    async () => {
      const name = uniqueName("invalid")
      const tasks = gated(name)
      const w = serveOnQuorum(tasks.worker, { concurrency: 4 })
      try {
        await broker.waitForQueues(name)
        await waitFor("instance", () => tasks.worker.instances.size, (n) => n === 1)
        for (const bad of [-1, 1.5, 2 ** 31, Number.NaN]) {
          await expect(tasks.worker.setConcurrency(bad)).rejects.toThrow(
            /A concurrency must be an integer from 0 to 2147483647/,
          )
          const running = [...tasks.worker.instances][0]!
          const failure = await Effect.runPromise(Effect.flip(running.setConcurrency(bad)))
          expect(failure._tag).toBe("ConcurrencyError")
        }
        expect(await Effect.runPromise([...tasks.worker.instances][0]!.concurrency)).toBe(4)
      } finally {
        await w.stop()
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      }
    },
    TIMEOUT,
  )

  it(
    "onIdle fires once, after the last task of a backlog settled and the queue is empty",
    async () => {
      const name = uniqueName("idle")
      const inQueue = `${name}_queue_in`
      const outQueue = `${name}_queue_out`
      const N = 60
      // The backlog is there before the worker starts.
      await broker.declare(inQueue, { durable: true })
      await broker.declare(outQueue, { durable: true })
      for (let i = 0; i < N; i++) broker.publish(inQueue, broker.envelope(`t-${i}`, { n: i }))
      await broker.confirmed()

      let settled = 0
      let lastSettledAt = 0
      const idle: Array<
        { at: number; settled: number; queue: { unacked: number; ready: number } }
      > = []
      type N = { readonly n: number }
      const worker: Worker.Worker<N, N, N, never> = Worker.make({
        name,
        input: Input,
        output: Output,
        timeout: "30 seconds",
        handler: (input) =>
          Effect.sleep("25 millis").pipe(
            Effect.as({ n: input.n }),
            Effect.ensuring(Effect.sync(() => {
              settled++
              lastSettledAt = Date.now()
            })),
          ),
        onIdle: () => {
          idle.push({ at: Date.now(), settled, queue: queueStats(inQueue) })
          // A batch script's use: drain the backlog, then stop.
          return worker.stop()
        },
      })
      const w = serveOnQuorum(worker, { concurrency: 4 })
      try {
        // `serve` ends by itself: onIdle asked the worker to stop.
        const exit = await Promise.race([
          Effect.runPromise(Fiber.await(w.fiber)),
          sleep(45_000).then(() => "timed out" as const),
        ])
        expect(exit !== "timed out" && Exit.isSuccess(exit)).toBe(true)
        expect(idle).toHaveLength(1)
        const [fired] = idle
        expect(fired!.settled).toBe(N)
        expect(fired!.queue).toEqual({ unacked: 0, ready: 0 })
        // After a quiet second, not before the last task settled.
        expect(fired!.at - lastSettledAt).toBeGreaterThanOrEqual(900)
        const out = await broker.readUntil(
          outQueue,
          (all) => all.filter((m) => m.type === "success").length === N,
        )
        expect(out.filter((m) => m.type === "success")).toHaveLength(N)
      } finally {
        await w.stop()
        await broker.remove(inQueue, outQueue)
      }
    },
    TIMEOUT,
  )

  it(
    "onIdle does not fire while a task runs, even with the queue empty",
    async () => {
      const name = uniqueName("busy")
      const tasks = gated(name)
      let fired = 0
      const worker = Worker.make({
        ...definition(tasks.worker),
        onIdle: () => void fired++,
      })
      const w = serveOnQuorum(worker, { concurrency: 2 })
      try {
        await broker.waitForQueues(name)
        broker.publish(`${name}_queue_in`, broker.envelope("t-long", { n: 1 }))
        await waitFor("running", () => tasks.running.size, (n) => n === 1)
        await sleep(2_500)
        expect(fired).toBe(0)
        tasks.release()
        await waitFor("idle", () => fired, (n) => n === 1, 10_000)
        await sleep(1_500)
        expect(fired).toBe(1)
      } finally {
        tasks.openAll()
        await w.stop()
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      }
    },
    TIMEOUT,
  )
})

/** The definition behind a worker, to make another from it. */
const definition = <A, I, O>(worker: Worker.Worker<A, I, O, never>) => ({
  name: worker.name,
  input: worker.input,
  output: worker.output,
  timeout: worker.timeout,
  handler: worker.handler,
})
