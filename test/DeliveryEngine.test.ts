import { describe, expect, it } from "@effect/vitest"
import {
  Cause,
  Clock,
  Context,
  Data,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Logger,
  Option,
  Random,
  Schema,
  Scope,
} from "effect"
import { TestClock } from "effect/testing"
import * as Concurrency from "../src/Concurrency.ts"
import * as DeliveryEngine from "../src/DeliveryEngine.ts"
import * as EventLoop from "../src/EventLoop.ts"
import { DeliveryHandle } from "../src/internal/delivery/take.ts"
import * as WorkerProgram from "../src/WorkerProgram.ts"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import type { MessageType } from "../src/Protocol.ts"
import * as Settings from "../src/Settings.ts"
import type { TaskContext } from "../src/TaskContext.ts"
import * as Transient from "../src/Transient.ts"
import * as WorkerHarness from "../src/testing.ts"
import { type Delivery, type PublishOptions, Redeliveries, Transport } from "../src/Transport.ts"
import * as Worker from "../src/Worker.ts"
import { FatalError, LeaseLost, PublishError, RetryableError } from "../src/WorkerError.ts"
import { blockedLoop } from "./support/blockedLoop.ts"
import { memoryEnvironment } from "./support/environment.ts"
import {
  captureLogs,
  isDone,
  type LogLine,
  type Logs,
  waitUntil,
  withLogs,
} from "./support/logs.ts"
import { envelope, textOf, wireOf } from "./support/builders.ts"
import { countWords, Text, Words } from "./support/countWords.ts"

// ---------------------------------------------------------------------------------------------
// Workers

/** A `count-words` worker with the given handler. */
const define = (
  handler: Worker.Handler<Text, Words, never>,
  options: {
    readonly timeout?: Duration.Input
    readonly retryOn?: Transient.Rule | ReadonlyArray<Transient.Rule>
  } = {},
) =>
  Worker.make({
    name: "count-words",
    input: Text,
    output: Words,
    timeout: options.timeout ?? "10 seconds",
    handler,
    retryOn: options.retryOn,
  })

/** A worker whose handler returns no words, and how many times it was called. */
const runsCounted = () => {
  let runs = 0
  const worker = define(() => {
    runs++
    return Effect.succeed({ words: 0 })
  })
  return { worker, runs: () => runs }
}

const counting = define(({ text }) => Effect.succeed({ words: countWords(text) }))

const INTERNAL_SENTENCE = "The worker failed while running the task."

// ---------------------------------------------------------------------------------------------
// Log lines (captured by test/support/logs.ts)

/** The harness logs nothing unless asked: the tests that read its lines ask for all of them. */
const LOGGED = { logLevel: "debug" } as const

interface ExpectedDecision {
  readonly outcome: string
  readonly action: string
  readonly taskId?: string
  readonly code?: string
  readonly attempt?: number
  readonly deliveryLimit?: number
  readonly reason?: string
}

/** Exactly one decision line for the task (for the whole test when `taskId` is absent). */
const expectSettled = (logs: Logs, expected: ExpectedDecision): LogLine => {
  const lines = logs.settled(expected.taskId)
  expect(lines.map((l) => l.message), "exactly one decision line per delivery").toHaveLength(1)
  const line = lines[0]!
  expect(line.level).toBe("Info")
  let text = `Delivery settled: outcome=${expected.outcome} action=${expected.action}`
  if (expected.code !== undefined) text += ` code=${expected.code}`
  expect(line.message.startsWith(text), `${line.message} starts with ${text}`).toBe(true)
  expect(line.annotations.outcome).toBe(expected.outcome)
  expect(line.annotations.action).toBe(expected.action)
  expect(line.annotations.code).toBe(expected.code)
  expect(line.annotations.task_id).toBe(expected.taskId)
  expect(line.annotations.service).toBe("count-words")
  if (expected.attempt !== undefined) {
    expect(line.annotations.attempt).toBe(expected.attempt)
    expect(line.annotations.delivery_limit).toBe(expected.deliveryLimit ?? 5)
    expect(line.message).toContain(`attempt=${expected.attempt}/${expected.deliveryLimit ?? 5}`)
  }
  if (expected.reason !== undefined) expect(line.annotations.reason).toBe(expected.reason)
  return line
}

// ---------------------------------------------------------------------------------------------
// Helpers

/** Random numbers that are always `r`. */
const fixedRandom = (r: number): Random.Random => ({
  nextDoubleUnsafe: () => r,
  nextIntUnsafe: () => Math.floor(r * Number.MAX_SAFE_INTEGER),
})

/**
 * The engine of `worker` built by hand over a MemoryBroker, for what the harness does not
 * expose: leases, classic queues, and a transport or delivery wrapped to watch the order of
 * publishes and acks.
 */
const makeEngine = <A, I, O>(
  worker: Worker.Worker<A, I, O, never>,
  options: {
    readonly overrides?: Settings.SettingsOverrides
    readonly wrap?: (transport: Transport["Service"]) => Transport["Service"]
  } = {},
) =>
  Effect.gen(function* () {
    const settings = yield* Settings.make(
      { name: worker.name, timeout: worker.timeout, concurrency: worker.concurrency },
      options.overrides,
    )
    // Leases are reaped each second: fine enough for the lease tests, and few enough sleeps
    // for the TestClock to step through.
    const broker = yield* MemoryBroker.make({ reapInterval: "1 second" })
    const inner = yield* broker.transport({
      inQueue: settings.inQueue,
      outQueue: settings.outQueue,
      capacity: 0,
    })
    const transport = options.wrap === undefined ? inner : options.wrap(inner)
    // The worker program every runner uses, built in the test's scope; the test hands it each
    // delivery itself.
    const program = yield* Layer.build(
      WorkerProgram.layer(worker).pipe(
        Layer.provide(Layer.succeed(Settings.Settings, settings)),
        Layer.provide(Layer.succeed(Transport, transport)),
      ),
    )
    const engine = {
      ...Context.get(program, DeliveryEngine.DeliveryEngine),
      ...Context.get(program, DeliveryHandle),
    }
    /** Publishes a task on the input queue and takes it back as a delivery, as basic.get does. */
    const take = (
      taskId: string,
      body: unknown,
      o: {
        readonly deliveryCount?: number
        readonly leaseDuration?: Duration.Input
        readonly classic?: boolean
      } = {},
    ) =>
      Effect.gen(function* () {
        yield* broker.publish(settings.inQueue, envelope(taskId, body), {
          ...(o.deliveryCount === undefined ? {} : { deliveryCount: o.deliveryCount }),
        }).pipe(Effect.orDie)
        const delivery = yield* broker.get(settings.inQueue, {
          ...(o.leaseDuration === undefined ? {} : { leaseDuration: o.leaseDuration }),
          ...(o.classic === undefined ? {} : { classic: o.classic }),
        })
        return Option.getOrThrow(delivery)
      })
    /** Takes a task on a consumer's channel of its own, whose closing (`lose`) loses its lease. */
    const takeLosable = (taskId: string, body: unknown) =>
      Effect.gen(function* () {
        const channel = yield* Scope.make()
        const consumer = yield* broker.transport({
          inQueue: settings.inQueue,
          outQueue: settings.outQueue,
          capacity: 1,
        }).pipe(Scope.provide(channel))
        yield* broker.publish(settings.inQueue, envelope(taskId, body))
        const delivery = Option.getOrThrow(yield* consumer.take)
        return { delivery, lose: Scope.close(channel, Exit.void) }
      }).pipe(Effect.orDie)
    const outbound = Effect.map(
      broker.published(settings.outQueue),
      (messages) => messages.map((m) => wireOf(m.body)),
    )
    return { settings, broker, engine, take, takeLosable, outbound }
  })

/** A delivery whose settlements are recorded in `log`. */
const recorded = (delivery: Delivery, log: Array<string>): Delivery => ({
  ...delivery,
  ack: Effect.sync(() => log.push("ack")).pipe(Effect.andThen(delivery.ack)),
  requeue: Effect.sync(() => log.push("requeue")).pipe(Effect.andThen(delivery.requeue)),
  release: Effect.sync(() => log.push("release")).pipe(Effect.andThen(delivery.release)),
})

// ---------------------------------------------------------------------------------------------

describe("DeliveryEngine", () => {
  describe("failure codes the SDK itself emits", () => {
    it.effect("an Effect handler's FatalError concludes with its own code and message", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = define(() =>
            Effect.fail(
              new FatalError({ code: "EMPTY_TEXT", message: "There is nothing to count." }),
            )
          )
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          const run = yield* harness.submit({ text: "" }, { taskId: "t-fatal" })
          run.assertFailed({ code: "EMPTY_TEXT" })
          expect(run.messageTypes).toEqual(["started", "failure"])
          expect(run.error).toEqual({ code: "EMPTY_TEXT", message: "There is nothing to count." })
          expect(textOf(run.raw[1]!)).toBe(
            '{"task_id":"t-fatal","data":{"message_type":"failure","error_message":{"code":"EMPTY_TEXT","message":"There is nothing to count."}}}',
          )
          const line = expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-fatal",
            code: "EMPTY_TEXT",
            attempt: 1,
          })
          expect(line.message).toBe(
            "Delivery settled: outcome=failure action=conclude code=EMPTY_TEXT attempt=1/5",
          )
        })
      ))

    it.effect("an async handler's thrown FatalError concludes with its own code and message", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = define(async () => {
            await Promise.resolve()
            throw new FatalError({ code: "NOT_ALLOWED", message: "This text may not be counted." })
          })
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          const run = yield* harness.submit({ text: "x" }, { taskId: "t-fatal-async" })
          run.assertFailed({ code: "NOT_ALLOWED" })
          expect(run.error).toEqual({
            code: "NOT_ALLOWED",
            message: "This text may not be counted.",
          })
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-fatal-async",
            code: "NOT_ALLOWED",
            attempt: 1,
          })
        })
      ))

    it.effect("a FatalError whose code breaks the code pattern concludes INTERNAL_ERROR", () =>
      Effect.gen(function* () {
        const worker = define(() =>
          Effect.fail(new FatalError({ code: "not-a-code", message: "lower case" }))
        )
        const harness = yield* WorkerHarness.make(worker)
        const run = yield* harness.submit({ text: "x" })
        run.assertFailed({ code: "INTERNAL_ERROR" })
        expect(run.error?.message).toBe(INTERNAL_SENTENCE)
      }))

    it.effect("a RetryableError at the last attempt concludes with its own code and message", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let runs = 0
          const worker = define(() => {
            runs++
            return Effect.fail(
              new RetryableError({ code: "UPSTREAM_DOWN", message: "The OCR service is down." }),
            )
          })
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          // x-delivery-count 4: the fifth attempt, the last of five.
          const run = yield* harness.submit({ text: "x" }, { taskId: "t-last", deliveryCount: 4 })
          expect(runs).toBe(1)
          run.assertFailed({ code: "UPSTREAM_DOWN" })
          expect(run.error).toEqual({ code: "UPSTREAM_DOWN", message: "The OCR service is down." })
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-last",
            code: "UPSTREAM_DOWN",
            attempt: 5,
          })
        })
      ))

    it.effect("a RetryableError without a code at the last attempt concludes RETRY_EXHAUSTED", () =>
      Effect.gen(function* () {
        const worker = define(async () => {
          await Promise.resolve()
          throw new RetryableError({})
        })
        const harness = yield* WorkerHarness.make(worker)
        const run = yield* harness.submit({ text: "x" }, { deliveryCount: 4 })
        run.assertFailed({ code: "RETRY_EXHAUSTED" })
        expect(run.error?.message).toBe("The task failed on each of its 5 attempts.")
      }))

    it.effect("INVALID_MESSAGE: a malformed envelope that names its task, without `started`", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const { worker, runs } = runsCounted()
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          const run = yield* harness.submitRaw(
            JSON.stringify({ task_id: "t-malformed", data: { message_type: "submission" } }),
          )
          expect(runs()).toBe(0)
          expect(run.outcome).toBe("ACKED")
          expect(run.messageTypes).toEqual(["failure"])
          expect(run.messages[0]!.task_id).toBe("t-malformed")
          expect(run.error?.code).toBe("INVALID_MESSAGE")
          expect(run.error?.message).toContain("data.body is missing")
          expectSettled(logs, {
            outcome: "poison",
            action: "conclude",
            taskId: "t-malformed",
            code: "INVALID_MESSAGE",
            reason: "invalid_envelope",
          })
        })
      ))

    it.effect("INVALID_INPUT names the path of the problem and never its value", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const secret = "sk_live_51HxSECRETvalue9f8e7d"
          let runs = 0
          const worker = Worker.make({
            name: "count-words",
            input: Schema.Struct({ text: Schema.String, language: Schema.Literals(["en", "fr"]) }),
            output: Words,
            timeout: "10 seconds",
            handler: () => {
              runs++
              return Effect.succeed({ words: 0 })
            },
          })
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          // A body the input schema rejects, on purpose: `submit` is typed with the valid ones.
          const invalid = { text: "hello", language: secret } as unknown as {
            text: string
            language: "en"
          }
          const run = yield* harness.submit(invalid, { taskId: "t-input" })
          expect(runs).toBe(0)
          run.assertFailed({ code: "INVALID_INPUT" })
          expect(run.error!.message).toContain("language")
          for (const raw of run.raw) expect(textOf(raw)).not.toContain(secret)
          for (const line of logs.lines) {
            expect(line.message).not.toContain(secret)
            expect(JSON.stringify(line.annotations)).not.toContain(secret)
          }
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-input",
            code: "INVALID_INPUT",
            attempt: 1,
          })
        })
      ))

    it.effect("INVALID_OUTPUT: the output does not match the output schema", () =>
      Effect.gen(function* () {
        const worker = define(() => Effect.succeed({ words: "three" } as unknown as Words))
        const harness = yield* WorkerHarness.make(worker)
        const run = yield* harness.submit({ text: "one two three" })
        run.assertFailed({ code: "INVALID_OUTPUT" })
        expect(run.messageTypes).toEqual(["started", "failure"])
        expect(run.error!.message).toContain("words")
        expect(run.error!.message).not.toContain("three")
      }))

    it.effect("INVALID_OUTPUT: a non-finite number is never written, not even as null", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = Worker.make({
            name: "count-words",
            input: Text,
            output: Schema.Struct({ stats: Schema.Struct({ ratio: Schema.Number }) }),
            timeout: "10 seconds",
            handler: () => Effect.succeed({ stats: { ratio: 0 / 0 } }),
          })
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          const run = yield* harness.submit({ text: "" }, { taskId: "t-nan" })
          run.assertFailed({ code: "INVALID_OUTPUT" })
          expect(run.messageTypes).toEqual(["started", "failure"])
          expect(run.error!.message).toContain("stats.ratio")
          expect(run.error!.message).toContain("non-finite")
          for (const raw of run.raw) expect(textOf(raw)).not.toContain("null")
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-nan",
            code: "INVALID_OUTPUT",
            attempt: 1,
          })
        })
      ))

    it.effect("INVALID_OUTPUT: an output that is not a JSON object", () =>
      Effect.gen(function* () {
        const worker = Worker.make({
          name: "count-words",
          input: Text,
          output: Schema.String,
          timeout: "10 seconds",
          handler: ({ text }) => Effect.succeed(text.toUpperCase()),
        })
        const harness = yield* WorkerHarness.make(worker)
        const run = yield* harness.submit({ text: "hello" })
        run.assertFailed({ code: "INVALID_OUTPUT" })
        expect(run.messageTypes).toEqual(["started", "failure"])
        expect(run.error!.message).toContain("not a JSON object")
      }))

    it.effect("TASK_TIMEOUT: an Effect handler is interrupted at its time limit", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let entered = false
          let finalized = false
          const worker = define(
            () =>
              Effect.sync(() => (entered = true)).pipe(
                Effect.andThen(Effect.sleep("60 seconds")),
                Effect.as({ words: 0 }),
                Effect.ensuring(Effect.sync(() => (finalized = true))),
              ),
            { timeout: "10 seconds" },
          )
          const harness = yield* WorkerHarness.make(worker, { ...LOGGED, clock: "ambient" })
          const fiber = yield* Effect.forkChild(
            harness.submit({ text: "slow" }, { taskId: "t-slow" }),
          )
          yield* waitUntil(() => entered, "the handler runs")
          yield* TestClock.adjust("9999 millis")
          expect(yield* isDone(fiber)).toBe(false)
          expect(finalized).toBe(false)
          yield* TestClock.adjust("1 millis")
          const run = yield* Fiber.join(fiber)
          run.assertFailed({ code: "TASK_TIMEOUT" })
          expect(run.error!.message).toBe("The task ran past its time limit of 10s.")
          expect(finalized).toBe(true)
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-slow",
            code: "TASK_TIMEOUT",
            attempt: 1,
          })
        })
      ))

    it.effect("TASK_TIMEOUT: an async handler's signal is aborted at its time limit", () =>
      Effect.gen(function* () {
        let ctx: TaskContext | undefined
        const worker = define(async (_input, c) => {
          ctx = c
          await new Promise<void>((resolve) =>
            c.signal.addEventListener("abort", () => resolve(), { once: true })
          )
          return { words: 0 }
        }, { timeout: "5 seconds" })
        const harness = yield* WorkerHarness.make(worker, { clock: "ambient" })
        const fiber = yield* Effect.forkChild(harness.submit({ text: "slow" }))
        yield* waitUntil(() => ctx !== undefined, "the handler runs")
        expect(ctx!.signal.aborted).toBe(false)
        yield* TestClock.adjust("5 seconds")
        const run = yield* Fiber.join(fiber)
        run.assertFailed({ code: "TASK_TIMEOUT" })
        expect(run.messageTypes).toEqual(["started", "failure"])
        expect(ctx!.signal.aborted).toBe(true)
        expect(ctx!.signal.reason).toBe("The task ran past its time limit")
      }))

    const unexpected: ReadonlyArray<
      readonly [string, string, Worker.Handler<Text, Words, never>]
    > = [
      ["a thrown Error", "Error", async () => {
        await Promise.resolve()
        throw new Error("connection to db://admin:hunter2@db failed")
      }],
      [
        "a defect (Effect.die)",
        "Error",
        () => Effect.die(new Error("connection to db://admin:hunter2@db failed")),
      ],
      [
        "a failure with a plain string",
        "string",
        () => Effect.fail("connection to db://admin:hunter2@db failed"),
      ],
    ]
    for (const [what, name, handler] of unexpected) {
      it.effect(`INTERNAL_ERROR: ${what} concludes with the fixed sentence, never its text`, () =>
        withLogs((logs) =>
          Effect.gen(function* () {
            const harness = yield* WorkerHarness.make(define(handler), LOGGED)
            const run = yield* harness.submit({ text: "x" }, { taskId: "t-internal" })
            run.assertFailed({ code: "INTERNAL_ERROR" })
            expect(run.error!.message).toBe(INTERNAL_SENTENCE)
            for (const raw of run.raw) expect(textOf(raw)).not.toContain("hunter2")
            for (const line of logs.lines) {
              expect(line.message).not.toContain("hunter2")
              expect(JSON.stringify(line.annotations)).not.toContain("hunter2")
            }
            const error = logs.lines.find((l) => l.level === "Error")
            expect(error?.message).toBe(`The handler failed with an unexpected ${name}`)
            expect(error?.annotations.task_id).toBe("t-internal")
            expectSettled(logs, {
              outcome: "failure",
              action: "conclude",
              taskId: "t-internal",
              code: "INTERNAL_ERROR",
              attempt: 1,
            })
          })
        ))
    }

    it.effect("TASK_ABANDONED_AFTER_REDELIVERIES: past the delivery limit, without running", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const { worker, runs } = runsCounted()
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          // x-delivery-count 5 with WORKER_DELIVERY_LIMIT 5: this is the sixth attempt.
          const run = yield* harness.submit({ text: "x" }, { taskId: "t-loop", deliveryCount: 5 })
          expect(runs()).toBe(0)
          expect(run.messageTypes).toEqual(["failure"])
          run.assertFailed({ code: "TASK_ABANDONED_AFTER_REDELIVERIES" })
          expect(run.error!.message).toContain("6 times")
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-loop",
            code: "TASK_ABANDONED_AFTER_REDELIVERIES",
            attempt: 6,
          })
        })
      ))
  })

  describe("the decision line", () => {
    it.effect("success: the response is published, then the delivery is acked", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const harness = yield* WorkerHarness.make(counting, LOGGED)
          const run = yield* harness.submit({ text: "one two three" }, { taskId: "t-ok" })
          run.assertSucceeded()
          expect(run.response).toEqual({ words: 3 })
          expect(run.messageTypes).toEqual(["started", "success"])
          expect(textOf(run.raw[1]!)).toBe(
            '{"task_id":"t-ok","data":{"message_type":"success","response":{"words":3}}}',
          )
          const line = expectSettled(logs, {
            outcome: "success",
            action: "conclude",
            taskId: "t-ok",
            attempt: 1,
          })
          expect(line.message).toBe("Delivery settled: outcome=success action=conclude attempt=1/5")
        })
      ))

    it.effect("poison: a message with no task id is acked with nothing published", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const harness = yield* WorkerHarness.make(counting, LOGGED)
          const run = yield* harness.submitRaw("{ not json")
          expect(run.outcome).toBe("ACKED")
          expect(run.messages).toEqual([])
          const line = expectSettled(logs, { outcome: "poison", action: "ack", reason: "not_json" })
          expect(line.message).toBe("Delivery settled: outcome=poison action=ack reason=not_json")
          expect(line.annotations.task_id).toBeUndefined()
          expect(logs.lines.some((l) => l.message.includes("not json"))).toBe(false)
        })
      ))

    it.effect("shutdown_requeued: an interrupted delivery interrupts its handler and requeues", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let ctx: TaskContext | undefined
          let interrupted = false
          const worker = define((_input, c) => {
            ctx = c
            return Effect.never.pipe(
              Effect.onInterrupt(() => Effect.sync(() => (interrupted = true))),
            )
          })
          const harness = yield* WorkerHarness.make(worker, { ...LOGGED, clock: "ambient" })
          const fiber = yield* Effect.forkChild(harness.submit({ text: "x" }, { taskId: "t-stop" }))
          yield* waitUntil(() => ctx !== undefined, "the handler runs")
          yield* Fiber.interrupt(fiber)
          expect(interrupted).toBe(true)
          expect(ctx!.signal.aborted).toBe(true)
          expect(ctx!.signal.reason).toBe("The worker is shutting down")
          // Requeued, counted as a redelivery, and nothing terminal published.
          expect(yield* harness.broker.ready(harness.settings.inQueue)).toBe(1)
          const out = yield* harness.broker.published(harness.settings.outQueue)
          expect(out.map((m) => m.type)).toEqual(["started"])
          expectSettled(logs, {
            outcome: "shutdown_requeued",
            action: "nack-requeue",
            taskId: "t-stop",
            attempt: 1,
          })
        })
      ))

    it.effect("engine_error: a transport defect requeues the delivery and logs the cause", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const { worker, runs } = runsCounted()
          const { broker, engine, outbound, settings, take } = yield* makeEngine(worker, {
            wrap: (t) => ({
              ...t,
              publish: (body, type) =>
                type === "started" ? Effect.die(new Error("channel bug")) : t.publish(body, type),
            }),
          })
          const settlements: Array<string> = []
          const delivery = recorded(yield* take("t-broken", { text: "x" }), settlements)
          // Requeued after the attempt's backoff (at most the 1 s base), never at once.
          const fiber = yield* Effect.forkChild(engine.handle(delivery))
          yield* TestClock.adjust("400 millis")
          expect(settlements).toEqual([])
          yield* TestClock.adjust("1 second")
          const decision = yield* Fiber.join(fiber)
          expect(decision).toMatchObject({ outcome: "engine_error", action: "reject-requeue" })
          expect(runs()).toBe(0)
          expect(settlements).toEqual(["requeue"])
          expect(yield* broker.ready(settings.inQueue)).toBe(1)
          expect(yield* outbound).toEqual([])
          expect(
            logs.lines.some((l) =>
              l.level === "Error" &&
              l.message === "The delivery engine failed; the message is requeued"
            ),
          ).toBe(true)
          expectSettled(logs, {
            outcome: "engine_error",
            action: "reject-requeue",
            taskId: "t-broken",
            attempt: 1,
          })
        })
      ))
  })

  describe("attempts", () => {
    it.effect("a retry whose backoff a shutdown cuts short is requeued at once as a failed attempt", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = define(() => Effect.fail(new RetryableError({ code: "UPSTREAM_DOWN" })))
          const { engine, take } = yield* makeEngine(worker)
          const settlements: Array<string> = []
          const fiber = yield* Effect.forkChild(
            engine.handle(recorded(yield* take("t-cut", { text: "x" }), settlements)),
          )
          yield* TestClock.adjust("100 millis")
          expect(settlements).toEqual([])
          yield* Fiber.interrupt(fiber)
          // Rejected, not released: RabbitMQ 4 counts the failed attempt.
          expect(settlements).toEqual(["requeue"])
          const line = expectSettled(logs, {
            outcome: "retry",
            action: "reject-requeue",
            code: "UPSTREAM_DOWN",
            taskId: "t-cut",
            attempt: 1,
          })
          expect(line.annotations.reason).toBe("shutdown")
        })
      ))

    it.effect("a task run again after a shutdown publishes ids of its own; the tries of one publish share one", () =>
      Effect.gen(function* () {
        let runs = 0
        const worker = define((_input, ctx) =>
          Effect.andThen(
            ctx.progress(0.5),
            ++runs === 1 ? Effect.never : Effect.succeed({ words: 1 }),
          )
        )
        // Every try of every publish, with its id; the first try of `success` is refused.
        const tries: Array<{ readonly type: MessageType; readonly id: string | undefined }> = []
        const { broker, engine, settings, take } = yield* makeEngine(worker, {
          wrap: (t) => ({
            ...t,
            publish: (body, type, options) => {
              tries.push({ type, id: options?.messageId })
              return type === "success" && !tries.slice(0, -1).some((s) => s.type === "success")
                ? Effect.fail(new PublishError({ reason: "nacked", messageType: type }))
                : t.publish(body, type, options)
            },
          }),
        })
        const first = yield* Effect.forkChild(engine.handle(yield* take("t-again", { text: "a" })))
        yield* waitUntil(() => tries.length === 2, "the first run reports its progress")
        // A shutdown: the task goes back unprocessed, nacked, which RabbitMQ 4 does not count.
        yield* Fiber.interrupt(first)
        const again = Option.getOrThrow(yield* broker.get(settings.inQueue))
        const second = yield* Effect.forkChild(engine.handle(again))
        yield* TestClock.adjust("1 second")
        expect(yield* Fiber.join(second)).toMatchObject({ outcome: "success", attempt: 1 })
        const ids = tries.map((t) => t.id!)
        const [a, b] = [ids[0]!.split(":")[2]!, ids[2]!.split(":")[2]!]
        expect(a).toMatch(/^[0-9a-z]{8}$/)
        expect(b).toMatch(/^[0-9a-z]{8}$/)
        expect(a).not.toBe(b)
        expect(ids).toEqual([
          `t-again:1:${a}:started`,
          `t-again:1:${a}:progress:1`,
          `t-again:1:${b}:started`,
          `t-again:1:${b}:progress:1`,
          // The refused try and the one that was taken: one message, one id.
          `t-again:1:${b}:success`,
          `t-again:1:${b}:success`,
        ])
      }))

    it.effect("a task released by three shutdowns runs as attempt 1; its decision says its deliveries", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const { broker, engine, settings, take } = yield* makeEngine(counting)
          let delivery = yield* take("t-released", { text: "a b" })
          for (let i = 0; i < 3; i++) {
            yield* delivery.release
            delivery = Option.getOrThrow(yield* broker.get(settings.inQueue))
          }
          yield* engine.handle(delivery)
          const line = expectSettled(logs, {
            outcome: "success",
            action: "conclude",
            taskId: "t-released",
            attempt: 1,
          })
          expect(line.message).toContain("attempt=1/5 deliveries=4")
          expect(line.annotations.deliveries).toBe(4)
        })
      ))

    it.effect("a quorum queue's x-delivery-count n makes attempt n + 1 of the delivery limit", () =>
      Effect.gen(function* () {
        const seen: Array<readonly [number, number]> = []
        const worker = define((_input, ctx) =>
          Effect.sync(() => {
            seen.push([ctx.attempt, ctx.deliveryLimit])
            return { words: 0 }
          })
        )
        const harness = yield* WorkerHarness.make(worker)
        for (const deliveryCount of [0, 1, 4]) {
          const run = yield* harness.submit({ text: "x" }, { deliveryCount })
          run.assertSucceeded()
        }
        expect(seen).toEqual([[1, 5], [2, 5], [5, 5]])
      }))

    it.effect("before the last attempt a RetryableError requeues; at it, it concludes", () =>
      Effect.gen(function* () {
        const worker = define(() => Effect.fail(new RetryableError({ code: "BUSY" })))
        const harness = yield* WorkerHarness.make(worker, {
          settingsOverrides: { deliveryLimit: 3 },
        })
        const second = yield* harness.submit({ text: "x" }, { deliveryCount: 1 })
        expect(second.outcome).toBe("REJECTED_REQUEUE")
        expect(second.messageTypes).toEqual(["started"])
        const third = yield* harness.submit({ text: "x" }, { deliveryCount: 2 })
        third.assertFailed({ code: "BUSY" })
      }))

    it.effect("a classic queue's redelivered flag: attempt 1, then 2 of 2, warned once", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const seen: Array<readonly [number, number]> = []
          const worker = define((_input, ctx) => {
            seen.push([ctx.attempt, ctx.deliveryLimit])
            return Effect.fail(new RetryableError({ code: "BUSY", message: "Try later." }))
          })
          const { broker, engine, outbound, settings, take } = yield* makeEngine(worker, {
            overrides: { retryBackoffBase: 0, retryBackoffMax: 0 },
          })
          const first = yield* engine.handle(
            yield* take("t-classic", { text: "x" }, { classic: true }),
          )
          expect(first).toMatchObject({
            outcome: "retry",
            action: "reject-requeue",
            attempt: 1,
            deliveryLimit: 2,
          })
          // The broker redelivers the requeued message with only its redelivered flag set.
          const redelivered = Option.getOrThrow(
            yield* broker.get(settings.inQueue, { classic: true }),
          )
          expect(redelivered.redeliveries).toEqual(Redeliveries.Flagged({ redelivered: true }))
          const again = yield* engine.handle(redelivered)
          expect(again).toMatchObject({
            outcome: "failure",
            action: "conclude",
            code: "BUSY",
            attempt: 2,
            deliveryLimit: 2,
          })
          expect(seen).toEqual([[1, 2], [2, 2]])
          const failures = (yield* outbound).filter((m) => m.data.message_type === "failure")
          expect(failures.map((m) => [m.task_id, m.data.error_message])).toEqual([
            ["t-classic", { code: "BUSY", message: "Try later." }],
          ])
          const warnings = logs.lines.filter((l) => l.message.includes("classic queue"))
          expect(warnings).toHaveLength(1)
          expect(warnings[0]!.level).toBe("Warn")
        })
      ))
  })

  describe("retry backoff", () => {
    const retrying = (entered: { count: number }, delay?: Duration.Input) =>
      define(() => {
        entered.count++
        return Effect.fail(new RetryableError({ code: "BUSY", delay }))
      })

    /** Runs one retried delivery and measures, in steps of `step`, when it was requeued. */
    const measure = (
      harness: WorkerHarness.WorkerHarness,
      deliveryCount: number,
      step: Duration.Input,
    ) =>
      Effect.gen(function* () {
        const fiber = yield* Effect.forkChild(harness.submit({ text: "x" }, { deliveryCount }))
        const stepMillis = Duration.toMillis(Duration.fromInputUnsafe(step))
        let elapsed = 0
        while (!(yield* isDone(fiber))) {
          yield* TestClock.adjust(stepMillis)
          elapsed += stepMillis
          if (elapsed > 600_000) return yield* Effect.die(new Error("never requeued"))
        }
        const run = yield* Fiber.join(fiber)
        expect(run.outcome).toBe("REJECTED_REQUEUE")
        expect(run.messageTypes).toEqual(["started"])
        expect(run.error).toBeUndefined()
        return elapsed
      })

    const overrides = { retryBackoffBase: "1 second", retryBackoffMax: "60 seconds" } as const

    it.effect("attempt 1 waits between half and all of the base before the requeue", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const entered = { count: 0 }
          const harness = yield* WorkerHarness.make(retrying(entered), {
            logLevel: "debug",
            clock: "ambient",
            settingsOverrides: overrides,
          })
          const fiber = yield* Effect.forkChild(
            harness.submit({ text: "x" }, { taskId: "t-retry" }),
          )
          yield* TestClock.adjust("490 millis")
          expect(entered.count).toBe(1)
          expect(yield* isDone(fiber)).toBe(false)
          expect(yield* harness.broker.unacked(harness.settings.inQueue)).toBe(1)
          yield* TestClock.adjust("510 millis")
          const run = yield* Fiber.join(fiber)
          expect(run.outcome).toBe("REJECTED_REQUEUE")
          expect(run.messageTypes).toEqual(["started"])
          expectSettled(logs, {
            outcome: "retry",
            action: "reject-requeue",
            taskId: "t-retry",
            code: "BUSY",
            attempt: 1,
          })
        })
      ))

    it.effect("each requeue of attempt 1 lands in [0.5 s, 1 s]", () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(retrying({ count: 0 }), {
          clock: "ambient",
          settingsOverrides: overrides,
        })
        for (let i = 0; i < 3; i++) {
          const elapsed = yield* measure(harness, 0, "10 millis")
          expect(elapsed).toBeGreaterThanOrEqual(500)
          expect(elapsed).toBeLessThanOrEqual(1000)
        }
      }))

    it.effect("attempt 3 waits between 2 s and 4 s", () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(retrying({ count: 0 }), {
          clock: "ambient",
          settingsOverrides: overrides,
        })
        for (let i = 0; i < 3; i++) {
          const elapsed = yield* measure(harness, 2, "50 millis")
          expect(elapsed).toBeGreaterThanOrEqual(2000)
          expect(elapsed).toBeLessThanOrEqual(4000)
        }
      }))

    it.effect("the backoff is capped at WORKER_RETRY_BACKOFF_MAX_S", () =>
      Effect.gen(function* () {
        // Attempt 5 of 10 would wait 8 to 16 s uncapped: 2.5 to 5 s capped.
        const capped = yield* WorkerHarness.make(retrying({ count: 0 }), {
          clock: "ambient",
          settingsOverrides: {
            retryBackoffBase: "1 second",
            retryBackoffMax: "5 seconds",
            deliveryLimit: 10,
          },
        })
        const elapsed = yield* measure(capped, 4, "100 millis")
        expect(elapsed).toBeGreaterThanOrEqual(2500)
        expect(elapsed).toBeLessThanOrEqual(5000)
      }))

    it.effect("the error's own delay replaces the backoff, exactly", () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(retrying({ count: 0 }, "7 seconds"), {
          clock: "ambient",
          settingsOverrides: overrides,
        })
        const fiber = yield* Effect.forkChild(harness.submit({ text: "x" }))
        yield* TestClock.adjust("6999 millis")
        expect(yield* isDone(fiber)).toBe(false)
        yield* TestClock.adjust("1 millis")
        const run = yield* Fiber.join(fiber)
        expect(run.outcome).toBe("REJECTED_REQUEUE")
        expect(run.messageTypes).toEqual(["started"])
      }))

    it.effect("the error's own delay is capped at WORKER_RETRY_BACKOFF_MAX_S", () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(retrying({ count: 0 }, "2 hours"), {
          clock: "ambient",
          settingsOverrides: { retryBackoffBase: "1 second", retryBackoffMax: "10 seconds" },
        })
        const fiber = yield* Effect.forkChild(harness.submit({ text: "x" }))
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(fiber)).toBe(false)
        yield* TestClock.adjust("1 millis")
        const run = yield* Fiber.join(fiber)
        expect(run.outcome).toBe("REJECTED_REQUEUE")
      }))

    it.effect("backoff: equal jitter between half and all of base * 2^(attempt - 1)", () =>
      Effect.gen(function* () {
        const settings = {
          retryBackoffBase: Duration.seconds(1),
          retryBackoffMax: Duration.seconds(60),
        }
        const at = (attempt: number, r: number, delay?: Duration.Input) =>
          DeliveryEngine.backoff(settings, attempt, delay).pipe(
            Effect.map(Duration.toMillis),
            Effect.provideService(Random.Random, fixedRandom(r)),
          )
        expect(yield* at(1, 0)).toBe(500)
        expect(yield* at(1, 0.999)).toBeCloseTo(999.5)
        expect(yield* at(3, 0)).toBe(2000)
        expect(yield* at(3, 0.5)).toBe(3000)
        expect(yield* at(10, 0)).toBe(30_000)
        expect(yield* at(10, 0.999)).toBeLessThan(60_000)
        expect(yield* at(1, 0.5, "7 seconds")).toBe(7000)
        expect(yield* at(1, 0.5, Duration.minutes(5))).toBe(60_000)
      }))
  })

  describe("ordinary errors a definition says are transient (retryOn)", () => {
    /** Node's error for a connection the other side reset, with a secret in its text. */
    const reset = () =>
      Object.assign(new Error("read ECONNRESET (db://admin:hunter2@db)"), { code: "ECONNRESET" })

    /** An `async` handler failing as `text` says: a reset, `fetch` failing on one, or a bug. */
    const failing = define(async ({ text }) => {
      await Promise.resolve()
      if (text === "reset") throw reset()
      if (text === "fetch") throw new TypeError("fetch failed", { cause: reset() })
      throw new TypeError("Cannot read properties of undefined (reading 'hunter2')")
    }, { retryOn: Transient.network })

    it.effect("an ECONNRESET is retried (on its own or as fetch's cause), a TypeError is not", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const harness = yield* WorkerHarness.make(failing, LOGGED)
          for (const text of ["reset", "fetch"]) {
            const run = yield* harness.submit({ text }, { taskId: `t-${text}` })
            expect(run.outcome).toBe("REJECTED_REQUEUE")
            expect(run.messageTypes).toEqual(["started"])
            expectSettled(logs, {
              outcome: "retry",
              action: "reject-requeue",
              taskId: `t-${text}`,
              attempt: 1,
              reason: "transient",
            })
            const warning = logs.lines.find((l) =>
              l.level === "Warn" && l.annotations.task_id === `t-${text}`
            )
            expect(warning?.message).toBe(
              `The handler failed with a transient ${
                text === "reset" ? "Error" : "TypeError"
              }: the task is retried`,
            )
          }
          const bug = yield* harness.submit({ text: "bug" }, { taskId: "t-bug" })
          bug.assertFailed({ code: "INTERNAL_ERROR" })
          expect(bug.error?.message).toBe(INTERNAL_SENTENCE)
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-bug",
            code: "INTERNAL_ERROR",
            attempt: 1,
          })
        })
      ))

    it.effect("without retryOn, an ECONNRESET concludes INTERNAL_ERROR at once, as before", () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(define(() => Effect.fail(reset())))
        const run = yield* harness.submit({ text: "x" })
        run.assertFailed({ code: "INTERNAL_ERROR" })
        expect(run.messageTypes).toEqual(["started", "failure"])
      }))

    it.effect("the last attempt concludes RETRY_EXHAUSTED; the error's text is in the worker's log only", () => {
      const lines: Array<{ level: string; message: string; cause: string }> = []
      const logger = Logger.make(({ cause, logLevel, message }) => {
        lines.push({
          level: logLevel,
          message: (Array.isArray(message) ? message : [message]).map(String).join(" "),
          cause: Cause.pretty(cause),
        })
      })
      return Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(failing, {
          ...LOGGED,
          settingsOverrides: { deliveryLimit: 3 },
        })
        const runs = []
        for (const deliveryCount of [0, 1, 2]) {
          runs.push(yield* harness.submit({ text: "reset" }, { deliveryCount }))
        }
        expect(runs.map((r) => r.outcome)).toEqual([
          "REJECTED_REQUEUE",
          "REJECTED_REQUEUE",
          "ACKED",
        ])
        const last = runs[2]!
        last.assertFailed({ code: "RETRY_EXHAUSTED" })
        expect(last.error?.message).toBe("The task failed on each of its 3 attempts.")
        for (const run of runs) {
          for (const raw of run.raw) expect(textOf(raw)).not.toContain("hunter2")
        }
        const noted = lines.filter((l) => l.message.startsWith("The handler failed"))
        expect(noted.map((l) => [l.level, l.message])).toEqual([
          ["Warn", "The handler failed with a transient Error: the task is retried"],
          ["Warn", "The handler failed with a transient Error: the task is retried"],
          ["Error", "The handler failed with a transient Error at its last attempt"],
        ])
        for (const line of noted) expect(line.cause).toContain("read ECONNRESET")
      }).pipe(Effect.provide(Logger.layer([logger])))
    })

    it.effect("a 503 with Retry-After: 7 is retried after 7 s exactly; without it, the usual backoff", () =>
      Effect.gen(function* () {
        const unavailable = (retryAfter?: string) =>
          Object.assign(new Error("Service Unavailable"), {
            status: 503,
            headers: new Headers(retryAfter === undefined ? {} : { "Retry-After": retryAfter }),
          })
        const worker = define(
          ({ text }) => Effect.fail(unavailable(text === "" ? undefined : text)),
          { retryOn: Transient.httpStatus() },
        )
        const harness = yield* WorkerHarness.make(worker, {
          clock: "ambient",
          settingsOverrides: { retryBackoffBase: "1 second", retryBackoffMax: "60 seconds" },
        })
        const fiber = yield* Effect.forkChild(harness.submit({ text: "7" }))
        yield* TestClock.adjust("6999 millis")
        expect(yield* isDone(fiber)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect((yield* Fiber.join(fiber)).outcome).toBe("REJECTED_REQUEUE")
        // Attempt 1's computed backoff: between half and all of the base.
        const usual = yield* Effect.forkChild(harness.submit({ text: "" }))
        yield* TestClock.adjust("499 millis")
        expect(yield* isDone(usual)).toBe(false)
        yield* TestClock.adjust("501 millis")
        expect((yield* Fiber.join(usual)).outcome).toBe("REJECTED_REQUEUE")
      }))

    it.effect("an Effect handler's failure or defect is put to the rules as an async handler's throw is", () =>
      Effect.gen(function* () {
        const handlers: ReadonlyArray<Worker.Handler<Text, Words, never>> = [
          () => Effect.fail(reset()),
          () => Effect.die(reset()),
          () =>
            Effect.sync(() => {
              throw reset()
            }),
          // A plain function that throws as it is called.
          () => {
            throw reset()
          },
        ]
        for (const handler of handlers) {
          const harness = yield* WorkerHarness.make(define(handler, { retryOn: Transient.network }))
          expect((yield* harness.submit({ text: "x" })).outcome).toBe("REJECTED_REQUEUE")
        }
        const bug = define(() =>
          Effect.sync(() => {
            throw new TypeError("a bug")
          }), { retryOn: Transient.network })
        const harness = yield* WorkerHarness.make(bug)
        ;(yield* harness.submit({ text: "x" })).assertFailed({ code: "INTERNAL_ERROR" })
      }))

    it.effect("the rules never see a time limit, a FatalError, a RetryableError or a mapped error", () =>
      Effect.gen(function* () {
        const asked: Array<unknown> = []
        const always = (error: unknown) => {
          asked.push(error)
          return true
        }
        class Upstream extends Data.TaggedError("Upstream")<{ readonly service: string }> {}
        const worker = Worker.make({
          name: "count-words",
          input: Text,
          output: Words,
          timeout: "50 millis",
          retryOn: always,
          errors: { Upstream: () => new FatalError({ code: "UPSTREAM", message: "Down." }) },
          handler: ({ text }) =>
            Effect.gen(function* () {
              if (text === "slow") return yield* Effect.never
              if (text === "fatal") {
                return yield* new FatalError({ code: "EMPTY", message: "Nothing." })
              }
              if (text === "retry") return yield* new RetryableError({ code: "LATER" })
              return yield* new Upstream({ service: "ocr" })
            }),
        })
        const harness = yield* WorkerHarness.make(worker, {
          settingsOverrides: { deliveryLimit: 1 },
        })
        ;(yield* harness.submit({ text: "slow" })).assertFailed({ code: "TASK_TIMEOUT" })
        ;(yield* harness.submit({ text: "fatal" })).assertFailed({ code: "EMPTY" })
        ;(yield* harness.submit({ text: "retry" })).assertFailed({ code: "LATER" })
        ;(yield* harness.submit({ text: "mapped" })).assertFailed({ code: "UPSTREAM" })
        expect(asked).toEqual([])
      }))
  })

  describe("`started` sent ahead of its confirm", () => {
    /** A transport whose `started` is published at once and confirmed when the test says. */
    const heldConfirm =
      (confirm: Deferred.Deferred<void>) => (t: Transport["Service"]): Transport["Service"] => ({
        ...t,
        publish: Object.assign((body: Uint8Array, type: MessageType) => t.publish(body, type), {
          send: (body: Uint8Array, type: MessageType, options?: PublishOptions) =>
            Effect.as(Effect.orDie(t.publish(body, type, options)), Deferred.await(confirm)),
        }),
      })

    it.effect("the handler runs while the confirm is on the way; nothing more is published, nor settled, before it", () =>
      Effect.gen(function* () {
        let runs = 0
        const worker = define(({ text }) =>
          Effect.sync(() => (runs++, { words: countWords(text) }))
        )
        const confirm = yield* Deferred.make<void>()
        const { engine, outbound, take } = yield* makeEngine(worker, { wrap: heldConfirm(confirm) })
        const settlements: Array<string> = []
        const fiber = yield* Effect.forkChild(
          engine.handle(recorded(yield* take("t-ahead", { text: "a b" }), settlements)),
        )
        yield* waitUntil(() => runs === 1, "the handler ran")
        yield* TestClock.adjust("1 second")
        expect(yield* isDone(fiber)).toBe(false)
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started"])
        expect(settlements).toEqual([])
        yield* Deferred.succeed(confirm, undefined)
        expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "success", action: "conclude" })
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started", "success"])
        expect(settlements).toEqual(["ack"])
      }))

    it.effect("progress waits for the confirm: reported before it, published after it", () =>
      Effect.gen(function* () {
        const reported = yield* Deferred.make<void>()
        const finish = yield* Deferred.make<void>()
        const worker = define((_, ctx) =>
          Effect.gen(function* () {
            yield* ctx.progress(0.25, { stage: "ocr" })
            yield* Deferred.succeed(reported, undefined)
            yield* Deferred.await(finish)
            return { words: 1 }
          })
        )
        const confirm = yield* Deferred.make<void>()
        const { engine, outbound, take } = yield* makeEngine(worker, { wrap: heldConfirm(confirm) })
        const fiber = yield* Effect.forkChild(engine.handle(yield* take("t-wait", { text: "a" })))
        yield* Deferred.await(reported)
        yield* TestClock.adjust("5 seconds")
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started"])
        yield* Deferred.succeed(confirm, undefined)
        yield* waitUntil(() => true, "a turn")
        yield* TestClock.adjust("1 second")
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started", "progress"])
        yield* Deferred.succeed(finish, undefined)
        expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "success" })
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual([
          "started",
          "progress",
          "success",
        ])
      }))

    it.effect("a `started` refused as it is sent (a broker that answers at once): held through the refusal before the handler runs, under its id", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let runs = 0
          const worker = define(({ text }) =>
            Effect.sync(() => (runs++, { words: countWords(text) }))
          )
          const { broker, engine, settings, take } = yield* makeEngine(worker)
          yield* broker.failNextPublish({ type: "started" })
          const fiber = yield* Effect.forkChild(
            engine.handle(yield* take("t-again", { text: "a" })),
          )
          yield* waitUntil(() => true, "a turn of the scheduler")
          expect(runs).toBe(0)
          yield* TestClock.adjust("1 second")
          expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "success", action: "conclude" })
          expect(runs).toBe(1)
          const out = yield* broker.published(settings.outQueue)
          expect(out.map((m) => wireOf(m.body).data.message_type)).toEqual(["started", "success"])
          expect(out[0]!.messageId).toMatch(/^t-again:1:[0-9a-z]{8}:started$/)
          expect(logs.lines.filter((l) => l.message.startsWith("The output queue refused")))
            .toHaveLength(1)
        })
      ))

    /** A transport whose `started`, sent ahead, the broker refuses once the handler runs. */
    const refusedLater =
      (refuse: Deferred.Deferred<void>) => (t: Transport["Service"]): Transport["Service"] => ({
        ...t,
        publish: Object.assign((body: Uint8Array, type: MessageType) => t.publish(body, type), {
          send: (body: Uint8Array, type: MessageType, options?: PublishOptions) =>
            Effect.as(
              Effect.orDie(t.publish(body, type, options)),
              Effect.andThen(
                Deferred.await(refuse),
                Effect.fail(new PublishError({ reason: "nacked", messageType: type })),
              ),
            ),
        }),
      })

    it.effect("a `started` refused while the handler ran: its progress dropped, `started` published again, then the terminal message", () =>
      Effect.gen(function* () {
        const refuse = yield* Deferred.make<void>()
        const worker = define((_, ctx) =>
          Effect.gen(function* () {
            yield* Deferred.succeed(refuse, undefined)
            yield* Effect.yieldNow
            yield* ctx.progress(0.5)
            return { words: 1 }
          })
        )
        const { engine, outbound, take } = yield* makeEngine(worker, {
          wrap: refusedLater(refuse),
        })
        const fiber = yield* Effect.forkChild(engine.handle(yield* take("t-nacked", { text: "a" })))
        // The refused `started` waits a backoff before it is tried again.
        for (let i = 0; i < 5 && !(yield* isDone(fiber)); i++) {
          yield* waitUntil(() => true, "a turn of the scheduler")
          yield* TestClock.adjust("1 second")
        }
        expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "success", action: "conclude" })
        // The first `started` reached the queue before the broker's refusal of it was heard.
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual([
          "started",
          "started",
          "success",
        ])
      }))

    it.effect("a retry whose `started` was refused while the handler ran: the retry stands, nothing more published", () =>
      Effect.gen(function* () {
        const refuse = yield* Deferred.make<void>()
        const worker = define(() =>
          Effect.andThen(
            Deferred.succeed(refuse, undefined),
            Effect.fail(new RetryableError({ code: "LATER", delay: 0 })),
          )
        )
        const { engine, outbound, take } = yield* makeEngine(worker, {
          wrap: refusedLater(refuse),
        })
        const settlements: Array<string> = []
        const fiber = yield* Effect.forkChild(
          engine.handle(recorded(yield* take("t-later", { text: "a" }), settlements)),
        )
        yield* TestClock.adjust("1 second")
        expect(yield* Fiber.join(fiber)).toMatchObject({
          outcome: "retry",
          action: "reject-requeue",
          code: "LATER",
        })
        expect(settlements).toEqual(["requeue"])
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started"])
      }))

    it.effect("a transport whose `send` dies: engine_error, requeued, no handler run; the engine goes on", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let runs = 0
          const worker = define(() => Effect.sync(() => (runs++, { words: 0 })))
          const { engine, take } = yield* makeEngine(worker, {
            wrap: (t) => ({
              ...t,
              publish: Object.assign(
                (body: Uint8Array, type: MessageType) => t.publish(body, type),
                {
                  send: () => Effect.die(new Error("the transport broke")),
                },
              ),
            }),
          })
          const fiber = yield* Effect.forkChild(
            engine.handle(yield* take("t-broke", { text: "a" })),
          )
          yield* TestClock.adjust("2 minutes")
          expect(yield* Fiber.join(fiber)).toMatchObject({
            outcome: "engine_error",
            action: "reject-requeue",
          })
          expect(runs).toBe(0)
          expect(logs.lines.some((l) => l.message.startsWith("The delivery engine failed"))).toBe(
            true,
          )
        })
      ))
  })

  describe("publishing", () => {
    it.effect("a refused terminal publish holds the delivery: retried, then confirmed and acked", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let runs = 0
          const worker = define(({ text }) => {
            runs++
            return Effect.succeed({ words: countWords(text) })
          })
          let refuse: Effect.Effect<void> = Effect.void
          const { broker, engine, outbound, settings, take } = yield* makeEngine(worker, {
            wrap: (t) => ({
              ...t,
              publish: (body, type) =>
                // The output starts refusing once `started` is out.
                Effect.andThen(
                  type === "started" ? Effect.suspend(() => refuse) : Effect.void,
                  t.publish(body, type),
                ),
            }),
          })
          refuse = broker.refusePublishes(settings.outQueue, true)
          const settlements: Array<string> = []
          const delivery = recorded(yield* take("t-held", { text: "a b" }), settlements)
          const fiber = yield* Effect.forkChild(engine.handle(delivery))
          yield* TestClock.adjust("30 seconds")
          expect(yield* isDone(fiber)).toBe(false)
          expect(settlements).toEqual([])
          expect(yield* broker.unacked(settings.inQueue)).toBe(1)
          yield* broker.refusePublishes(settings.outQueue, false)
          yield* TestClock.adjust("5 seconds")
          const decision = yield* Fiber.join(fiber)
          expect(decision).toMatchObject({ outcome: "success", action: "conclude" })
          expect(runs).toBe(1)
          expect(settlements).toEqual(["ack"])
          expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started", "success"])
          expectSettled(logs, {
            outcome: "success",
            action: "conclude",
            taskId: "t-held",
            attempt: 1,
          })
          // One line when the output began refusing, one when it accepted again: not one a try.
          expect(logs.lines.filter((l) => l.message.startsWith("The output queue refused")))
            .toHaveLength(1)
          expect(logs.lines.filter((l) => l.message.startsWith("The output queue accepts")))
            .toHaveLength(1)
        })
      ))

    it.effect("a refused `started` holds the delivery: the handler runs once it is confirmed (a transport that cannot send ahead)", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const { worker, runs } = runsCounted()
          const { broker, engine, outbound, settings, take } = yield* makeEngine(worker, {
            // A wrapper that replaces `publish`: every message passes through it.
            wrap: (t) => ({
              ...t,
              publish: (body, type, options) => t.publish(body, type, options),
            }),
          })
          yield* broker.refusePublishes(settings.outQueue, true)
          const fiber = yield* Effect.forkChild(
            engine.handle(yield* take("t-no-start", { text: "x" })),
          )
          yield* TestClock.adjust("2 minutes")
          expect(runs()).toBe(0)
          expect(yield* isDone(fiber)).toBe(false)
          yield* broker.refusePublishes(settings.outQueue, false)
          yield* TestClock.adjust("5 seconds")
          expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "success" })
          expect(runs()).toBe(1)
          expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started", "success"])
          expectSettled(logs, {
            outcome: "success",
            action: "conclude",
            taskId: "t-no-start",
            attempt: 1,
          })
        })
      ))

    // A transport that sends `started` ahead of its confirm (the MemoryBroker's, whose refusal
    // is known as it is sent) and one behind a wrapper that replaces `publish` (every message
    // passes through it, so `started` is confirmed first) hold `started` alike.
    for (
      const [how, wrap] of [
        ["sending ahead", undefined],
        [
          "that cannot send ahead",
          (t: Transport["Service"]): Transport["Service"] => ({
            ...t,
            publish: (body, type, options) => t.publish(body, type, options),
          }),
        ],
      ] as const
    ) {
      it.effect(`an output that refuses past what the lease allows: requeued after a backoff, publish_failed, no handler run (a transport ${how})`, () =>
        withLogs((logs) =>
          Effect.gen(function* () {
            const { worker, runs } = runsCounted()
            // The lease allows 200 s: less 60 s of margin and the 10 s longest backoff, 130 s to
            // publish the terminal message; less the task's 10 s, 120 s to publish `started`.
            const { broker, engine, outbound, settings, take } = yield* makeEngine(worker, {
              overrides: { consumerTimeout: "200 seconds", retryBackoffMax: "10 seconds" },
              ...(wrap === undefined ? {} : { wrap }),
            })
            yield* broker.refusePublishes(settings.outQueue, true)
            const settlements: Array<string> = []
            const delivery = recorded(yield* take("t-refused", { text: "x" }), settlements)
            const fiber = yield* Effect.forkChild(engine.handle(delivery))
            yield* TestClock.adjust("119 seconds")
            expect(settlements).toEqual([])
            yield* TestClock.adjust("20 seconds")
            expect(yield* Fiber.join(fiber)).toMatchObject({
              outcome: "publish_failed",
              action: "reject-requeue",
              reason: "started",
            })
            expect(runs()).toBe(0)
            expect(settlements).toEqual(["requeue"])
            expect(yield* outbound).toEqual([])
            expectSettled(logs, {
              outcome: "publish_failed",
              action: "reject-requeue",
              taskId: "t-refused",
              attempt: 1,
              reason: "started",
            })
          })
        ))
    }

    it.effect("a task held for a refusing output is interrupted by a shutdown: requeued", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const { broker, engine, settings, take } = yield* makeEngine(counting)
          yield* broker.refusePublishes(settings.outQueue, true)
          const settlements: Array<string> = []
          const fiber = yield* Effect.forkChild(
            engine.handle(recorded(yield* take("t-stop-held", { text: "x" }), settlements)),
          )
          yield* TestClock.adjust("3 seconds")
          yield* Fiber.interrupt(fiber)
          // Unprocessed through no fault of its own: a release, which RabbitMQ 4 does not count.
          expect(settlements).toEqual(["release"])
          expectSettled(logs, {
            outcome: "shutdown_requeued",
            action: "nack-requeue",
            taskId: "t-stop-held",
            attempt: 1,
          })
        })
      ))

    it.effect("the terminal message is confirmed before the delivery is acked", () =>
      Effect.gen(function* () {
        const log: Array<string> = []
        const { engine, take } = yield* makeEngine(counting, {
          wrap: (t) => ({
            ...t,
            publish: (body, type: MessageType) =>
              Effect.sync(() => log.push(`publish:${type}`)).pipe(
                Effect.andThen(t.publish(body, type)),
                Effect.tap(() => Effect.sync(() => log.push(`confirmed:${type}`))),
              ),
          }),
        })
        const decision = yield* engine.handle(recorded(yield* take("t-order", { text: "a" }), log))
        expect(decision).toMatchObject({ outcome: "success", action: "conclude" })
        expect(log).toEqual([
          "publish:started",
          "confirmed:started",
          "publish:success",
          "confirmed:success",
          "ack",
        ])
      }))

    it.effect("a terminal publish never confirmed is never acked", () =>
      Effect.gen(function* () {
        const log: Array<string> = []
        const confirm = yield* Deferred.make<void>()
        const { broker, engine, settings, take } = yield* makeEngine(counting, {
          wrap: (t) => ({
            ...t,
            publish: (body, type) =>
              type === "success"
                ? Effect.sync(() => log.push(`publish:${type}`)).pipe(
                  Effect.andThen(Deferred.await(confirm)),
                  Effect.andThen(t.publish(body, type)),
                )
                : t.publish(body, type),
          }),
        })
        const delivery = recorded(yield* take("t-hang", { text: "a" }), log)
        const fiber = yield* Effect.forkChild(engine.handle(delivery))
        yield* TestClock.adjust("5 minutes")
        expect(yield* isDone(fiber)).toBe(false)
        expect(log).toEqual(["publish:success"])
        expect(yield* broker.unacked(settings.inQueue)).toBe(1)
        // Once the broker confirms, and only then, the delivery is acked.
        yield* Deferred.succeed(confirm, undefined)
        const decision = yield* Fiber.join(fiber)
        expect(decision).toMatchObject({ outcome: "success", action: "conclude" })
        expect(log).toEqual(["publish:success", "ack"])
        expect(yield* broker.unacked(settings.inQueue)).toBe(0)
      }))
  })

  describe("leases", () => {
    it.effect("a lease the broker ends at its consumer timeout is counted by the worker: lease_expired, the next delivery the next attempt, abandoned past the limit", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let runs = 0
          // A handler its time limit cannot stop: the lease runs out first.
          const worker = define(() =>
            Effect.sync(() => runs++).pipe(
              Effect.andThen(Effect.uninterruptible(Effect.sleep("200 seconds"))),
              Effect.as({ words: 1 }),
            ), { timeout: "10 seconds" })
          const made = yield* makeEngine(worker, {
            overrides: {
              consumerTimeout: "100 seconds",
              retryBackoffMax: "1 second",
              deliveryLimit: 2,
            },
          })
          const lines = () => logs.settled("t-expired").map((l) => l.message)
          for (let n = 1; n <= 2; n++) {
            // Each delivery as RabbitMQ 4 returns it after its consumer timeout: uncounted.
            const { delivery, lose } = yield* made.takeLosable("t-expired", { text: "a" })
            const fiber = yield* Effect.forkChild(made.engine.handle(delivery))
            yield* TestClock.adjust("100 seconds")
            yield* lose
            yield* TestClock.adjust("100 seconds")
            yield* Fiber.join(fiber)
            // The copy back in the queue is replaced by the next `takeLosable`'s, uncounted.
            yield* made.broker.purge(made.settings.inQueue)
            expect(lines()[n - 1]).toBe(
              `Delivery settled: outcome=cancelled action=nack-requeue reason=lease_expired attempt=${n}/2`,
            )
          }
          const { delivery } = yield* made.takeLosable("t-expired", { text: "a" })
          yield* made.engine.handle(delivery)
          expect(lines()[2]).toBe(
            "Delivery settled: outcome=failure action=conclude code=TASK_ABANDONED_AFTER_REDELIVERIES attempt=3/2",
          )
          expect(runs).toBe(2)
          expect(
            logs.lines.filter((l) =>
              l.level === "Warn" &&
              l.message.startsWith("The broker took the task back after 100 s")
            ),
          ).toHaveLength(2)
        })
      ))

    it.effect("a lease lost early under a handler that outlasts the lease is no expiry: held until the loss", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const made = yield* makeEngine(
            define(
              () =>
                Effect.uninterruptible(Effect.sleep("200 seconds")).pipe(Effect.as({ words: 1 })),
              {
                timeout: "10 seconds",
              },
            ),
            { overrides: { consumerTimeout: "100 seconds", retryBackoffMax: "1 second" } },
          )
          const { delivery, lose } = yield* made.takeLosable("t-early", { text: "a" })
          const fiber = yield* Effect.forkChild(made.engine.handle(delivery))
          yield* TestClock.adjust("5 seconds")
          yield* lose
          yield* TestClock.adjust("200 seconds")
          yield* Fiber.join(fiber)
          expect(logs.settled("t-early").map((l) => l.message)).toEqual([
            "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_channel_closed attempt=1/5",
          ])
        })
      ))

    it.effect("a lease lost before the consumer timeout is no expiry: the broker's count stands", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const made = yield* makeEngine(
            define(() => Effect.sleep("200 seconds").pipe(Effect.as({ words: 1 })), {
              timeout: "10 seconds",
            }),
            { overrides: { consumerTimeout: "100 seconds", retryBackoffMax: "1 second" } },
          )
          for (let n = 1; n <= 2; n++) {
            const { delivery, lose } = yield* made.takeLosable("t-lost", { text: "a" })
            const fiber = yield* Effect.forkChild(made.engine.handle(delivery))
            yield* TestClock.adjust("5 seconds")
            yield* lose
            yield* Fiber.join(fiber)
            yield* made.broker.purge(made.settings.inQueue)
          }
          expect(logs.settled("t-lost").map((l) => l.message)).toEqual([
            "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_channel_closed attempt=1/5",
            "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_channel_closed attempt=1/5",
          ])
        })
      ))

    const slow = (entered: { ctx?: TaskContext }, finalized: { value: boolean }) =>
      define((_input, ctx) =>
        Effect.sync(() => (entered.ctx = ctx)).pipe(
          Effect.andThen(Effect.sleep("50 seconds")),
          Effect.as({ words: 1 }),
          Effect.onInterrupt(() => Effect.sync(() => (finalized.value = true))),
        ), { timeout: "120 seconds" })

    it.effect("a running task's lease is renewed when a third of it remains", () =>
      Effect.gen(function* () {
        const renewals: Array<number> = []
        const { broker, engine, outbound, settings, take } = yield* makeEngine(
          slow({}, { value: false }),
        )
        const taken = yield* take("t-long", { text: "a" }, { leaseDuration: "30 seconds" })
        const delivery: Delivery = {
          ...taken,
          lease: {
            ...taken.lease,
            renew: Option.map(taken.lease.renew, (renew) =>
              Effect.andThen(
                Clock.currentTimeMillis.pipe(Effect.map((now) => renewals.push(now))),
                renew,
              )),
          },
        }
        const fiber = yield* Effect.forkChild(engine.handle(delivery))
        yield* TestClock.adjust("50 seconds")
        const decision = yield* Fiber.join(fiber)
        expect(decision).toMatchObject({ outcome: "success", action: "conclude" })
        expect(renewals).toEqual([20_000, 40_000])
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started", "success"])
        expect(yield* broker.unacked(settings.inQueue)).toBe(0)
        expect(yield* broker.ready(settings.inQueue)).toBe(0)
      }))

    it.effect("a lease that expires mid-task is fenced: interrupted, nothing published, no ack", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const entered: { ctx?: TaskContext } = {}
          const finalized = { value: false }
          const { broker, engine, outbound, settings, take } = yield* makeEngine(
            slow(entered, finalized),
          )
          const taken = yield* take("t-expired", { text: "a" }, { leaseDuration: "30 seconds" })
          const settlements: Array<string> = []
          // A lease that cannot be renewed: the broker takes it back when it runs out.
          const delivery = recorded(
            { ...taken, lease: { ...taken.lease, renew: Option.none() } },
            settlements,
          )
          const fiber = yield* Effect.forkChild(engine.handle(delivery))
          yield* waitUntil(() => entered.ctx !== undefined, "the handler runs")
          yield* TestClock.adjust("29 seconds")
          expect(yield* isDone(fiber)).toBe(false)
          yield* TestClock.adjust("2 seconds")
          const decision = yield* Fiber.join(fiber)
          expect(decision).toMatchObject({
            outcome: "cancelled",
            action: "nack-requeue",
            reason: "lease_expired",
          })
          expect(finalized.value).toBe(true)
          expect(entered.ctx!.signal.aborted).toBe(true)
          expect(entered.ctx!.signal.reason).toBe("The task's lease was lost")
          expect(settlements).toEqual([])
          expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started"])
          // The broker itself requeued it, counted as a redelivery.
          expect(yield* broker.ready(settings.inQueue)).toBe(1)
          expectSettled(logs, {
            outcome: "cancelled",
            action: "nack-requeue",
            taskId: "t-expired",
            attempt: 1,
            reason: "lease_expired",
          })
        })
      ))

    it.effect("a renewal refused as lost is a lost lease: the async handler's signal fires", () =>
      Effect.gen(function* () {
        let ctx: TaskContext | undefined
        const worker = define(async (_input, c) => {
          ctx = c
          await new Promise<void>((resolve) =>
            c.signal.addEventListener("abort", () => resolve(), { once: true })
          )
          return { words: 1 }
        }, { timeout: "120 seconds" })
        const { engine, outbound, take } = yield* makeEngine(worker)
        const taken = yield* take("t-refused", { text: "a" }, { leaseDuration: "30 seconds" })
        const settlements: Array<string> = []
        const delivery = recorded({
          ...taken,
          lease: {
            ...taken.lease,
            renew: Option.some(Effect.fail(new LeaseLost({ reason: "expired" }))),
          },
        }, settlements)
        const fiber = yield* Effect.forkChild(engine.handle(delivery))
        yield* waitUntil(() => ctx !== undefined, "the handler runs")
        yield* TestClock.adjust("19 seconds")
        expect(yield* isDone(fiber)).toBe(false)
        expect(ctx!.signal.aborted).toBe(false)
        // The renewal is due at 20 s (a third of 30 s remaining); it is refused.
        yield* TestClock.adjust("1 second")
        const decision = yield* Fiber.join(fiber)
        expect(decision).toMatchObject({ outcome: "cancelled", action: "nack-requeue" })
        expect(ctx!.signal.aborted).toBe(true)
        expect(settlements).toEqual([])
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started"])
      }))

    it.effect("a lease lost with its channel is fenced", () =>
      Effect.gen(function* () {
        const entered: { ctx?: TaskContext } = {}
        const finalized = { value: false }
        const { broker, engine, outbound, settings, takeLosable } = yield* makeEngine(
          slow(entered, finalized),
        )
        const { delivery: taken, lose } = yield* takeLosable("t-closed", { text: "a" })
        const settlements: Array<string> = []
        const fiber = yield* Effect.forkChild(engine.handle(recorded(taken, settlements)))
        yield* waitUntil(() => entered.ctx !== undefined, "the handler runs")
        yield* lose
        const decision = yield* Fiber.join(fiber)
        expect(decision).toMatchObject({
          outcome: "cancelled",
          action: "nack-requeue",
          reason: "lease_channel_closed",
        })
        expect(finalized.value).toBe(true)
        expect(entered.ctx!.signal.aborted).toBe(true)
        expect(settlements).toEqual([])
        expect((yield* outbound).map((m) => m.data.message_type)).toEqual(["started"])
        expect(yield* broker.ready(settings.inQueue)).toBe(1)
      }))

    /**
     * Handles `taskId` and loses its lease `lostAfter` into it, while the delivery waits: heard
     * within `heardWithin`, fenced (nothing settled), out of flight, its one decision line a lost
     * lease's with no code.
     */
    const loseWhileWaiting = (
      logs: Logs,
      { engine, takeLosable }: {
        readonly engine: {
          readonly handle: (delivery: Delivery) => Effect.Effect<unknown>
          readonly inFlight: Effect.Effect<number>
        }
        readonly takeLosable: (
          taskId: string,
          body: unknown,
        ) => Effect.Effect<{ readonly delivery: Delivery; readonly lose: Effect.Effect<void> }>
      },
      taskId: string,
      lostAfter: Duration.Input,
      heardWithin: Duration.Input,
    ) =>
      Effect.gen(function* () {
        const { delivery, lose } = yield* takeLosable(taskId, { text: "a" })
        const settlements: Array<string> = []
        const fiber = yield* Effect.forkChild(engine.handle(recorded(delivery, settlements)))
        yield* TestClock.adjust(lostAfter)
        expect(logs.settled(), "still waiting when its lease is lost").toEqual([])
        yield* lose
        yield* TestClock.adjust(heardWithin)
        expect(yield* isDone(fiber)).toBe(true)
        expect(yield* engine.inFlight).toBe(0)
        // Fenced: the broker has the message back, the worker settles nothing.
        expect(settlements).toEqual([])
        return expectSettled(logs, {
          outcome: "cancelled",
          action: "nack-requeue",
          taskId,
          attempt: 1,
          reason: "lease_lost",
        })
      })

    it.effect("a lease lost during a retry's backoff ends it: fenced at once, the retry's code dropped", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = define(() =>
            Effect.fail(new RetryableError({ code: "UPSTREAM_DOWN", delay: "60 seconds" }))
          )
          const made = yield* makeEngine(worker)
          // Lost 1 s into its 60 s backoff: heard then, not when the backoff would have ended.
          const line = yield* loseWhileWaiting(logs, made, "t-backoff", "1 second", "1 second")
          expect(line.message).toBe(
            "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_lost attempt=1/5",
          )
          expect(yield* made.broker.ready(made.settings.inQueue)).toBe(1)
        })
      ))

    it.effect("a lease lost while a failure's publish is refused: fenced, the failure's code dropped", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = define(() =>
            Effect.fail(new FatalError({ code: "EMPTY_TEXT", message: "Nothing." }))
          )
          const made = yield* makeEngine(worker, {
            wrap: (t) => ({
              ...t,
              publish: (body, type, options) =>
                type === "failure"
                  ? Effect.fail(new PublishError({ reason: "nacked", messageType: type }))
                  : t.publish(body, type, options),
            }),
          })
          // The refused publish is tried again within 5 s (its longest wait).
          yield* loseWhileWaiting(logs, made, "t-refused-lost", "1 second", "5 seconds")
        })
      ))

    it.effect("a lease lost during an engine error's backoff: fenced, not rejected", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const made = yield* makeEngine(counting, {
            wrap: (t) => ({
              ...t,
              publish: (body, type, options) =>
                type === "started"
                  ? Effect.die(new Error("channel bug"))
                  : t.publish(body, type, options),
            }),
          })
          // The requeue waits the attempt's backoff (at least half the 1 s base) first.
          yield* loseWhileWaiting(logs, made, "t-broken-lost", "100 millis", "1 second")
        })
      ))

    describe("a blocked event loop", () => {
      /**
       * A task running on a blocked loop, its lease lost with its channel: `blockFirst` blocks the
       * loop before the task is taken, else while its handler runs.
       */
      const lostAfterBlock = (taskId: string, blockFirst: boolean) =>
        Effect.gen(function* () {
          const loop = yield* blockedLoop
          const logs = captureLogs()
          const watch = yield* loop.watched(EventLoop.make()).pipe(Effect.provide(logs.layer))
          const blocked = Effect.andThen(loop.block(45_000), TestClock.adjust("500 millis"))
          const entered: { ctx?: TaskContext } = {}
          const { engine, takeLosable } = yield* loop.watched(
            makeEngine(slow(entered, { value: false })),
          ).pipe(Effect.provideService(EventLoop.EventLoop, watch))
          if (blockFirst) yield* blocked
          const { delivery, lose } = yield* takeLosable(taskId, { text: "a" })
          const fiber = yield* Effect.forkChild(engine.handle(delivery))
          yield* waitUntil(() => entered.ctx !== undefined, "the handler runs")
          if (!blockFirst) yield* blocked
          yield* lose
          const decision = yield* Fiber.join(fiber)
          const warnings = logs.lines.filter((l) => l.level === "Warn").map((l) => l.message)
          return { decision, warnings }
        })

      it.effect("a lease lost after a block during the delivery says so: blocked_s, and the block's WARNING names the task", () =>
        Effect.gen(function* () {
          const { decision, warnings } = yield* lostAfterBlock("t-blocked", false)
          expect(decision).toMatchObject({
            outcome: "cancelled",
            reason: "lease_channel_closed",
            blockedSeconds: 45,
          })
          expect(warnings).toHaveLength(1)
          expect(warnings[0]).toContain("blocked for 45.0 s, with the task t-blocked in flight")
        }))

      it.effect("a block that ended before the delivery was taken is not its cause", () =>
        Effect.gen(function* () {
          const { decision, warnings } = yield* lostAfterBlock("t-after", true)
          expect(decision.reason).toBe("lease_channel_closed")
          expect(decision.blockedSeconds).toBeUndefined()
          expect(warnings[0]).toContain("with no task in flight")
        }))
    })
  })

  describe("a handler's scope", () => {
    const scopedWorker = (events: Array<string>, hold: Duration.Input) =>
      Worker.make({
        name: "count-words",
        input: Text,
        output: Words,
        timeout: "10 seconds",
        // No Effect.scoped of its own: the handler requires a Scope, the task's.
        handler: (_input, ctx) =>
          Effect.acquireRelease(
            Effect.sync(() => events.push(`open ${ctx.taskId}`)),
            () => Effect.sync(() => events.push(`close ${ctx.taskId}`)),
          ).pipe(Effect.andThen(Effect.sleep(hold)), Effect.as({ words: 0 })),
      })

    it.effect("is the task's: its resources are released when the task ends", () =>
      Effect.gen(function* () {
        const events: Array<string> = []
        const harness = yield* WorkerHarness.make(scopedWorker(events, "1 millis"))
        ;(yield* harness.submit({ text: "x" }, { taskId: "a" })).assertSucceeded()
        expect(events).toEqual(["open a", "close a"])
        ;(yield* harness.submit({ text: "x" }, { taskId: "b" })).assertSucceeded()
        expect(events).toEqual(["open a", "close a", "open b", "close b"])
      }))

    it.effect("is closed when the task times out, before the failure is published", () =>
      Effect.gen(function* () {
        const events: Array<string> = []
        const harness = yield* WorkerHarness.make(scopedWorker(events, "1 minute"), {
          clock: "ambient",
        })
        const fiber = yield* Effect.forkChild(harness.submit({ text: "x" }, { taskId: "slow" }))
        yield* waitUntil(() => events.length === 1, "the handler runs")
        yield* TestClock.adjust("10 seconds")
        const run = yield* Fiber.join(fiber)
        run.assertFailed({ code: "TASK_TIMEOUT" })
        expect(events).toEqual(["open slow", "close slow"])
      }))
  })

  describe("the task context", () => {
    it.effect("taskId, attempt, deliveryLimit, clientId and inputRefs reach the handler", () =>
      Effect.gen(function* () {
        let seen:
          | Omit<TaskContext, "signal" | "progress" | "logger" | "deadline" | "workerId">
          | undefined
        const worker = define(async (_input, ctx) => {
          await Promise.resolve()
          seen = {
            taskId: ctx.taskId,
            attempt: ctx.attempt,
            deliveryLimit: ctx.deliveryLimit,
            deliveries: ctx.deliveries,
            clientId: ctx.clientId,
            inputRefs: ctx.inputRefs,
          }
          return { words: 0 }
        })
        const harness = yield* WorkerHarness.make(worker, {
          settingsOverrides: { deliveryLimit: 4 },
        })
        const run = yield* harness.submit({ text: "x" }, {
          taskId: "t-ctx",
          clientId: "client-42",
          inputRefs: ["s3://bucket/a.pdf", "s3://bucket/b.pdf"],
          deliveryCount: 2,
        })
        run.assertSucceeded()
        expect(seen).toEqual({
          taskId: "t-ctx",
          attempt: 3,
          deliveryLimit: 4,
          deliveries: 3,
          clientId: "client-42",
          inputRefs: ["s3://bucket/a.pdf", "s3://bucket/b.pdf"],
        })
      }))

    it.effect("ctx.logger lines of an async handler carry task_id, attempt and service", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = define(async (_input, ctx) => {
            await Promise.resolve()
            ctx.logger.info("calling the upstream", { upstream: "search" })
            ctx.logger.warn("the upstream is slow")
            return { words: 0 }
          })
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          const run = yield* harness.submit({ text: "x" }, { taskId: "t-log", deliveryCount: 1 })
          run.assertSucceeded()
          const own = logs.lines.filter((l) => l.message.includes("upstream"))
          expect(own.map((l) => [l.level, l.message])).toEqual([
            ["Info", "calling the upstream"],
            ["Warn", "the upstream is slow"],
          ])
          for (const line of own) {
            expect(line.annotations).toMatchObject({
              task_id: "t-log",
              attempt: 2,
              service: worker.name,
            })
          }
          expect(own[0]!.annotations.upstream).toBe("search")
        })
      ))

    it.effect("without client_id or input_refs the handler sees undefined and []", () =>
      Effect.gen(function* () {
        let seen: readonly [string | undefined, ReadonlyArray<string>] | undefined
        const worker = define((_input, ctx) =>
          Effect.sync(() => {
            seen = [ctx.clientId, ctx.inputRefs]
            return { words: 0 }
          })
        )
        const harness = yield* WorkerHarness.make(worker)
        ;(yield* harness.submit({ text: "x" })).assertSucceeded()
        expect(seen).toEqual([undefined, []])
      }))

    it.effect("a handler's log lines carry task_id, service and attempt", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const worker = define(({ text }) =>
            Effect.logInfo("counting").pipe(Effect.as({ words: countWords(text) }))
          )
          const harness = yield* WorkerHarness.make(worker, LOGGED)
          ;(yield* harness.submit({ text: "a b" }, { taskId: "t-logs", deliveryCount: 1 }))
            .assertSucceeded()
          const line = logs.lines.find((l) => l.message === "counting")
          expect(line?.annotations).toMatchObject({
            task_id: "t-logs",
            service: "count-words",
            attempt: 2,
          })
        })
      ))
  })

  describe("misbehaving handlers", () => {
    it.effect("an invalid RetryableError delay is an ordinary retry: the computed backoff, and a warning", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          for (const [i, delay] of (["nonsense", -1, Number.NaN, {}, [-1, 0]] as const).entries()) {
            const worker = define(() =>
              Effect.fail(new RetryableError({ delay: delay as Duration.Input }))
            )
            const { engine, take } = yield* makeEngine(worker)
            const settlements: Array<string> = []
            const delivery = recorded(yield* take(`t-delay-${i}`, { text: "x" }), settlements)
            const fiber = yield* Effect.forkChild(engine.handle(delivery))
            // The base's backoff for attempt 1: between half and all of 1 s, not at once.
            yield* TestClock.adjust("499 millis")
            expect(settlements, `delay ${String(delay)}`).toEqual([])
            yield* TestClock.adjust("501 millis")
            expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "retry" })
            expect(settlements).toEqual(["requeue"])
          }
          const warnings = logs.lines.filter((l) =>
            l.level === "Warn" && l.message.includes("delay is not a non-negative duration")
          )
          expect(warnings).toHaveLength(5)
        })
      ))

    it.effect("backoff: an own delay that names no duration, or a negative one, is the computed one", () =>
      Effect.gen(function* () {
        const settings = {
          retryBackoffBase: Duration.seconds(1),
          retryBackoffMax: Duration.seconds(60),
        }
        for (const delay of ["nonsense", -1, Number.NaN, {}, "-5 seconds", null]) {
          const millis = yield* DeliveryEngine.backoff(settings, 2, delay).pipe(
            Effect.map(Duration.toMillis),
            Effect.provideService(Random.Random, fixedRandom(0)),
          )
          expect(millis, String(delay)).toBe(1000)
        }
        expect(Duration.toMillis(yield* DeliveryEngine.backoff(settings, 2, 0))).toBe(0)
        expect(Duration.toMillis(yield* DeliveryEngine.backoff(settings, 2, Infinity))).toBe(60_000)
      }))

    it.effect("a delivery count that is not a count (negative, fractional) is the first attempt, with a warning", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const { engine, take } = yield* makeEngine(counting)
          for (const [i, deliveryCount] of [-1, 2.5].entries()) {
            const taskId = `t-count-${i}`
            const decision = yield* engine.handle(
              yield* take(taskId, { text: "a" }, { deliveryCount }),
            )
            expect(decision).toMatchObject({ outcome: "success", attempt: 1 })
            expectSettled(logs, {
              outcome: "success",
              action: "conclude",
              taskId,
              attempt: 1,
            })
            expect(
              logs.lines.some((l) =>
                l.level === "Warn" && l.annotations.task_id === taskId &&
                l.message.includes("is not a count")
              ),
            ).toBe(true)
          }
        })
      ))

    it.effect("an async handler that ignores its signal keeps its slot, and counts in flight, until it ends", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let release = () => {}
          const ignoring = new Promise<void>((resolve) => (release = resolve))
          const started: Array<string> = []
          const worker = define(async ({ text }, ctx) => {
            started.push(ctx.taskId)
            if (text === "ignore") await ignoring // the signal fires, and is ignored
            return { words: 1 }
          })
          const { engine, take } = yield* makeEngine(worker)
          const first = yield* Effect.forkChild(
            engine.handle(yield* take("t-ignore", { text: "ignore" })),
          )
          yield* waitUntil(() => started.length === 1, "the first handler runs")
          const second = yield* Effect.forkChild(
            engine.handle(yield* take("t-next", { text: "a" })),
          )
          yield* TestClock.adjust("10 seconds")
          // Concluded at its time limit...
          expect(yield* Fiber.join(first)).toMatchObject({
            outcome: "failure",
            code: "TASK_TIMEOUT",
          })
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-ignore",
            code: "TASK_TIMEOUT",
            attempt: 1,
          })
          // ...but its handler still runs: it keeps the worker's one slot.
          for (let i = 0; i < 50; i++) yield* Effect.yieldNow
          expect(started).toEqual(["t-ignore"])
          expect(yield* engine.inFlight).toBe(2)
          release()
          expect(yield* Fiber.join(second)).toMatchObject({ outcome: "success" })
          expect(started).toEqual(["t-ignore", "t-next"])
          for (let i = 0; i < 100 && (yield* engine.inFlight) > 0; i++) yield* Effect.yieldNow
          expect(yield* engine.inFlight).toBe(0)
        })
      ))

    it.live("a result that arrives after the deadline concludes TASK_TIMEOUT", () =>
      Effect.gen(function* () {
        // The handler blocks the event loop past its time limit, so no timer can fire before it
        // returns: a real clock, as the harness runs by default.
        const worker = define(() => {
          const until = Date.now() + 120
          while (Date.now() < until) {
            // busy
          }
          return Effect.succeed({ words: 1 })
        }, { timeout: "50 millis" })
        const harness = yield* WorkerHarness.make(worker)
        const run = yield* harness.submit({ text: "a" })
        run.assertFailed({ code: "TASK_TIMEOUT" })
      }).pipe(Effect.scoped))

    it.effect("a handler that interrupts itself concludes INTERNAL_ERROR, not a requeue", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          const harness = yield* WorkerHarness.make(define(() => Effect.interrupt), LOGGED)
          const run = yield* harness.submit({ text: "a" }, { taskId: "t-self" })
          run.assertFailed({ code: "INTERNAL_ERROR" })
          expect(run.error?.message).toBe(INTERNAL_SENTENCE)
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-self",
            code: "INTERNAL_ERROR",
            attempt: 1,
          })
        })
      ))

    it.effect("a value that cannot be read: thrown, INTERNAL_ERROR; returned, INVALID_OUTPUT unless it poses as a thenable", () =>
      Effect.gen(function* () {
        const no = () => {
          throw new Error("no")
        }
        /** Every trap throws; with `plain`, it says it has no `then`, as a plain value. */
        const unreadable = (plain: boolean) =>
          new Proxy({}, {
            get: (_target, key) => (plain && key === "then" ? undefined : no()),
            has: no,
            ownKeys: no,
            getOwnPropertyDescriptor: no,
            getPrototypeOf: no,
          })
        const run = (handler: () => unknown) =>
          Effect.flatMap(
            WorkerHarness.make(define(handler as () => Effect.Effect<Words>)),
            (harness) => harness.submit({ text: "a" }),
          )
        ;(yield* run(() => {
          throw unreadable(false)
        })).assertFailed({ code: "INTERNAL_ERROR" })
        ;(yield* run(() => unreadable(true))).assertFailed({ code: "INVALID_OUTPUT" }) // A `then` that throws when read is a rejection, as `Promise.resolve` takes it.
        ;(yield* run(() => unreadable(false))).assertFailed({ code: "INTERNAL_ERROR" })
      }))
  })

  describe("an output queue that refuses", () => {
    it.effect("a running worker starts no handler while it refuses, and concludes every task once it accepts", () => {
      let runs = 0
      const worker = Worker.make({
        name: "count-words",
        input: Text,
        output: Words,
        timeout: "10 seconds",
        concurrency: 3,
        handler: ({ text }) => Effect.sync(() => (runs++, { words: countWords(text) })),
      })
      const published: Array<string> = []
      return withLogs((logs) =>
        Effect.gen(function* () {
          const broker = yield* MemoryBroker.MemoryBroker
          const settings = yield* Settings.Settings
          yield* broker.refusePublishes(settings.outQueue, true)
          yield* Worker.consume(worker)
          const ids = Array.from({ length: 10 }, (_, i) => `t-${i}`)
          for (const id of ids) {
            yield* broker.publish(settings.inQueue, envelope(id, { text: "a b" })).pipe(
              Effect.orDie,
            )
          }
          for (let i = 0; i < 10; i++) yield* TestClock.adjust("1 second")
          // Intake paused: no handler ran (the MemoryBroker refuses `started` as it is sent), only
          // the prefetch is in hand, nothing was settled.
          expect(runs).toBe(0)
          expect(yield* broker.unacked(settings.inQueue)).toBe(3)
          expect(yield* broker.ready(settings.inQueue)).toBe(7)
          expect(logs.settled()).toEqual([])
          yield* broker.refusePublishes(settings.outQueue, false)
          for (let i = 0; i < 10 && logs.settled().length < 10; i++) {
            yield* TestClock.adjust("5 seconds")
            yield* waitUntil(() => true, "a turn")
          }
          yield* waitUntil(() => logs.settled().length === 10, "every task settled")
          const out = yield* broker.published(settings.outQueue)
          for (const m of out) published.push(wireOf(m.body).data.message_type)
          expect(runs).toBe(10)
          expect(published.filter((t) => t === "success")).toHaveLength(10)
          // Each on its first attempt: not one burned by the refusing output.
          for (const id of ids) {
            expectSettled(logs, { outcome: "success", action: "conclude", taskId: id, attempt: 1 })
          }
          expect(logs.lines.filter((l) => l.message.startsWith("The output queue refused")))
            .toHaveLength(1)
        }).pipe(Effect.scoped, Effect.provide(memoryEnvironment(worker)))
      )
    })
  })

  describe("a result or progress larger than the output takes", () => {
    const Blob = Schema.Struct({ blob: Schema.String })
    // "big" returns 20 KiB, past a 16 KiB limit; the others 2 s of work and a small result.
    const sized = (runs: Map<string, number>) =>
      Worker.make({
        name: "count-words",
        input: Text,
        output: Blob,
        timeout: "10 seconds",
        concurrency: 3,
        handler: ({ text }, ctx) =>
          Effect.gen(function* () {
            runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1)
            if (text !== "big") {
              yield* Effect.sleep("2 seconds")
              return { blob: "small" }
            }
            yield* Effect.promise(() => ctx.progress(0.5, { partial: "p".repeat(20 * 1024) }))
            return { blob: "b".repeat(20 * 1024) }
          }),
      })

    const runBeside = (
      overrides: Settings.SettingsOverrides,
      brokerOptions: MemoryBroker.MemoryBrokerOptions,
    ) => {
      const runs = new Map<string, number>()
      const worker = sized(runs)
      return withLogs((logs) =>
        Effect.gen(function* () {
          const broker = yield* MemoryBroker.MemoryBroker
          const settings = yield* Settings.Settings
          yield* Worker.consume(worker)
          for (const [id, text] of [["t-left", "a"], ["t-big", "big"], ["t-right", "b"]]) {
            yield* broker.publish(settings.inQueue, envelope(id!, { text })).pipe(Effect.orDie)
          }
          yield* waitUntil(() => logs.settled("t-big").length === 1, "the big task settled")
          // At once: the others are still at work.
          expect(logs.settled()).toHaveLength(1)
          yield* TestClock.adjust("3 seconds")
          yield* waitUntil(() => logs.settled().length === 3, "every task settled")
          expectSettled(logs, {
            outcome: "failure",
            action: "conclude",
            taskId: "t-big",
            code: "OUTPUT_TOO_LARGE",
            attempt: 1,
            reason: "output_too_large",
          })
          for (const id of ["t-left", "t-right"]) {
            expectSettled(logs, { outcome: "success", action: "conclude", taskId: id, attempt: 1 })
          }
          expect([...runs.values()]).toEqual([1, 1, 1])
          const out = (yield* broker.published(settings.outQueue)).map((m) => wireOf(m.body))
          const big = out.filter((m) => m.task_id === "t-big")
          expect(big.map((m) => m.data.message_type)).toEqual(["started", "failure"])
          expect(big[1]!.data).toMatchObject({ error_message: { code: "OUTPUT_TOO_LARGE" } })
          // Settled for good: nothing of it back in the queue.
          expect(yield* broker.ready(settings.inQueue)).toBe(0)
          expect(yield* broker.unacked(settings.inQueue)).toBe(0)
          expect(
            logs.lines.filter((l) =>
              l.level === "Warn" &&
              l.message === "A progress message larger than the output takes was dropped" &&
              l.annotations.task_id === "t-big"
            ),
          ).toHaveLength(1)
        }).pipe(Effect.scoped, Effect.provide(memoryEnvironment(worker, overrides, brokerOptions)))
      )
    }

    it.effect(
      "past WORKER_MAX_OUTPUT_BYTES: OUTPUT_TOO_LARGE at once, one run, nothing published of it; the tasks beside it succeed",
      () => runBeside({ maxOutputBytes: 16 * 1024 }, {}),
    )

    it.effect(
      "past what the broker takes (its refusal, too_large): OUTPUT_TOO_LARGE at once, one run; the tasks beside it succeed",
      () => runBeside({}, { maxPublishBytes: 16 * 1024 }),
    )
  })

  describe("Effect 4's waking at once", () => {
    it.effect(
      "a long row of tasks waiting for a pool's slot all settle: none runs inside the release of the one before",
      () => {
        // Effect 4 resumes a waiter inside the call that wakes it: a task run inside the release
        // of the last, on a broker that settles at once, would nest thousands deep and overflow.
        const tasks = 10_000
        let runs = 0
        const worker = Worker.make({
          name: "count-words",
          input: Text,
          output: Words,
          timeout: "10 seconds",
          concurrency: Concurrency.pool({ capacity: 1 }),
          handler: () => Effect.sync(() => (runs++, { words: 0 })),
        })
        return withLogs((logs) =>
          Effect.gen(function* () {
            const broker = yield* MemoryBroker.MemoryBroker
            const settings = yield* Settings.Settings
            for (let i = 0; i < tasks; i++) {
              yield* broker.publish(settings.inQueue, envelope(`t-${i}`, { text: "a" })).pipe(
                Effect.orDie,
              )
            }
            const running = yield* Worker.consume(worker)
            for (let i = 0; i < 100_000 && (runs < tasks || (yield* running.inFlight) > 0); i++) {
              yield* Effect.yieldNow
            }
            expect(runs).toBe(tasks)
            expect(logs.settled().filter((l) => l.annotations.outcome === "success")).toHaveLength(
              tasks,
            )
            expect(yield* broker.unacked(settings.inQueue)).toBe(0)
            expect(yield* running.inFlight).toBe(0)
          }).pipe(Effect.scoped, Effect.provide(memoryEnvironment(worker, { concurrency: tasks })))
        )
      },
      30_000,
    )
  })

  describe("review findings", () => {
    it.effect("a lease lost while `started` awaits its confirm: the handler is never called", () =>
      withLogs((logs) =>
        Effect.gen(function* () {
          let calls = 0
          const worker = define(() => {
            calls++
            return Effect.succeed({ words: 0 })
          })
          const { engine, take } = yield* makeEngine(worker, {
            wrap: (t) => ({
              ...t,
              // The confirm of `started` takes 3 s: the 1 s lease expires meanwhile.
              publish: (body, type) =>
                type === "started"
                  ? Effect.andThen(Effect.sleep("3 seconds"), t.publish(body, type))
                  : t.publish(body, type),
            }),
          })
          const delivery = yield* take("t-lost-early", { text: "a" }, { leaseDuration: "1 second" })
          const fiber = yield* Effect.forkChild(engine.handle(delivery))
          yield* TestClock.adjust("4 seconds")
          expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "cancelled" })
          expect(calls).toBe(0)
          expectSettled(logs, {
            outcome: "cancelled",
            action: "nack-requeue",
            taskId: "t-lost-early",
            attempt: 1,
          })
        })
      ))

    it.effect("a publish lost with its connection is retried after a pause, not at once", () =>
      Effect.gen(function* () {
        let attempts = 0
        let failures = 50
        const { engine, take } = yield* makeEngine(counting, {
          wrap: (t) => ({
            ...t,
            publish: (body, type) =>
              Effect.suspend(() => {
                attempts++
                return failures-- > 0
                  ? Effect.fail(new PublishError({ reason: "closed", messageType: type }))
                  : t.publish(body, type)
              }),
          }),
        })
        const fiber = yield* Effect.forkChild(engine.handle(yield* take("t-closed", { text: "a" })))
        yield* TestClock.adjust("1 second")
        // 100 ms doubling, jittered: a handful of tries in the first second, not fifty.
        expect(attempts).toBeGreaterThan(1)
        expect(attempts).toBeLessThan(8)
        failures = 0
        yield* TestClock.adjust("10 seconds")
        expect(yield* Fiber.join(fiber)).toMatchObject({ outcome: "success" })
      }))
  })
})
