/**
 * `TaskContext.logFields` through pino, as a Node team logs: a `mixin` puts the running task's
 * `task_id`, `service` and `attempt` on the lines of a library logging inside a handler, wherever
 * the handler's code runs (an `async` handler's awaits and timers, an Effect handler's fibers and
 * Promises, a thread), and on no line of a later delivery.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Logger, Schema } from "effect"
import process from "node:process"
import pino from "pino"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as Settings from "../src/Settings.ts"
import { type LogFields, logFields } from "../src/TaskContext.ts"
import * as WorkerHarness from "../src/testing.ts"
import * as Thread from "../src/Thread.ts"
import * as Worker from "../src/Worker.ts"
import * as WorkerProgram from "../src/WorkerProgram.ts"
import { memoryEnvironment } from "./support/environment.ts"
import { waitUntil } from "./support/logs.ts"
import type { Handler } from "../src/WorkerDefinition.ts"
import { sleep } from "./support/waits.ts"

/** A pino logger with the task's fields mixed in, writing its JSON lines to `lines`. */
const logging = () => {
  const lines: Array<Record<string, unknown>> = []
  const logger = pino({ base: null, timestamp: false, mixin: logFields }, {
    write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>),
  })
  const said = (msg: string) => lines.filter((line) => line.msg === msg)
  return { logger, lines, said }
}

const Input = Schema.Struct({ n: Schema.Number })
const Output = Schema.Struct({ n: Schema.Number })
/** A worker of `handler`, as each test below defines one. */
const defined = (name: string, handler: Handler<typeof Input.Type, typeof Output.Type, never>) =>
  Worker.make({ name, input: Input, output: Output, timeout: "5 seconds", handler })

/** A task's envelope, as the platform publishes it. */
const submission = (taskId: string, body: unknown) =>
  JSON.stringify({ task_id: taskId, data: { message_type: "submission", body } })

const fieldsOf = (taskId: string, service: string, attempt = 1) => ({
  task_id: taskId,
  service,
  attempt,
})

describe("TaskContext.logFields", () => {
  it("an async handler's lines carry them, after its awaits and in its timers' callbacks", async () => {
    const { logger, said } = logging()
    const worker = defined("fields-async", async ({ n }) => {
      logger.info("start")
      await sleep(n)
      logger.info("after an await")
      await new Promise<void>((resolve) =>
        setTimeout(() => {
          logger.info("in a timer")
          resolve()
        }, 1)
      )
      return { n }
    })
    await using harness = await WorkerHarness.start(worker)
    // Two tasks at once, their awaits interleaved: each line carries its own task.
    const [a, b] = await Promise.all([
      harness.submit({ n: 20 }, { taskId: "a" }),
      harness.submit({ n: 1 }, { taskId: "b", deliveryCount: 2 }),
    ])
    a.assertSucceeded()
    b.assertSucceeded()
    for (const msg of ["start", "after an await", "in a timer"]) {
      expect(said(msg).map(({ task_id, service, attempt }) => ({ task_id, service, attempt })))
        .toEqual(expect.arrayContaining([
          fieldsOf("a", "fields-async"),
          fieldsOf("b", "fields-async", 3),
        ]))
      expect(said(msg)).toHaveLength(2)
    }
    logger.info("outside")
    expect(said("outside")[0]).not.toHaveProperty("task_id")
  })

  it("an Effect handler's lines carry them: in its code, its forked fibers and its Promises", async () => {
    const { logger, said } = logging()
    const worker = defined("fields-effect", ({ n }) =>
      Effect.gen(function* () {
        logger.info("in the handler")
        const forked = yield* Effect.forkChild(
          Effect.andThen(Effect.sleep(2), Effect.sync(() => logger.info("in a forked fiber"))),
        )
        yield* Effect.promise(async () => {
          await sleep(n)
          logger.info("in a Promise, after an await")
        })
        yield* Fiber.join(forked)
        return { n }
      }))
    await using harness = await WorkerHarness.start(worker)
    const [a, b] = await Promise.all([
      harness.submit({ n: 20 }, { taskId: "a" }),
      harness.submit({ n: 1 }, { taskId: "b" }),
    ])
    a.assertSucceeded()
    b.assertSucceeded()
    for (const msg of ["in the handler", "in a forked fiber", "in a Promise, after an await"]) {
      expect(said(msg).map((line) => line.task_id).sort(), msg).toEqual(["a", "b"])
      expect(said(msg)[0]).toMatchObject({ service: "fields-effect", attempt: 1 })
    }
  })

  it.live("a later delivery on the same fiber does not inherit an earlier task's fields", () => {
    const settled: Array<Partial<LogFields>> = []
    // A logger whose work goes on in a Promise, as a library's does: outside the fiber, it has the
    // async context of the code that logged alone.
    const recording = Logger.make(({ message }) => {
      if (!String(message).startsWith("Delivery settled")) return
      void Promise.resolve().then(() => void settled.push(logFields()))
    })
    const worker = defined(
      "fields-reused",
      ({ n }) => Effect.promise(() => sleep(n).then(() => ({ n }))),
    )
    return Effect.gen(function* () {
      const broker = yield* MemoryBroker.MemoryBroker
      const settings = yield* Settings.Settings
      // One task at a time: one fiber takes both deliveries.
      yield* WorkerProgram.consume(worker)
      yield* broker.publish(settings.inQueue, submission("a", { n: 5 })).pipe(Effect.orDie)
      yield* waitUntil(() => settled.length === 1, "the task settles")
      // A poison message: nothing of the task runs for it, the engine alone settles it.
      yield* broker.publish(settings.inQueue, "not a task").pipe(Effect.orDie)
      yield* waitUntil(() => settled.length === 2, "the poison message settles")
      expect(settled[1]).toEqual({})
    }).pipe(
      Effect.scoped,
      Effect.provide(memoryEnvironment(worker, { concurrency: 1 })),
      Effect.provide(Logger.layer([recording])),
    )
  })

  it("a threaded handler's module finds them on its thread", async () => {
    const Fields = Schema.Struct({
      task_id: Schema.String,
      service: Schema.String,
      attempt: Schema.Number,
      workerId: Schema.String,
      deadlineIn: Schema.Number,
    })
    const worker = Worker.make({
      name: "fields-thread",
      input: Input,
      output: Fields,
      timeout: "20 seconds",
      handler: Thread.handler<typeof Input.Type, typeof Fields.Type>(
        new URL("./fixtures/threads/fields.mjs", import.meta.url),
        "fields",
      ),
    })
    await using harness = await WorkerHarness.start(worker, {
      settingsOverrides: { hostname: "pod-1" },
    })
    const run = await harness.submit({ n: 1 }, { taskId: "on-a-thread", deliveryCount: 1 })
    run.assertSucceeded()
    const { deadlineIn, workerId, ...fields } = run.response!
    expect(fields).toEqual(fieldsOf("on-a-thread", "fields-thread", 2))
    // The context's plain values cross too.
    expect(workerId).toBe(`pod-1:${process.pid}`)
    expect(deadlineIn).toBeGreaterThan(0)
    expect(deadlineIn).toBeLessThanOrEqual(20_000)
  }, 30_000)
})
