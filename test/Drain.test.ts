import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Fiber, Layer, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as Settings from "../src/Settings.ts"
import { Transport } from "../src/Transport.ts"
import * as Worker from "../src/Worker.ts"
import { captureLogs, isDone, waitUntil } from "./support/logs.ts"
import { memoryEnvironment, publishedTypes } from "./support/environment.ts"
import { envelope } from "./support/builders.ts"

// ---------------------------------------------------------------------------------------------
// A worker whose tasks sleep for as long as their input says, recording what became of them.

interface Seen {
  /** Tasks whose handler started, in order. */
  readonly entered: Array<string>
  /** Tasks whose handler was interrupted, in order. */
  readonly interrupted: Array<string>
  /** Each task's cancellation signal. */
  readonly signals: Map<string, AbortSignal>
}

const sleeper = (record: Seen) =>
  Worker.make({
    name: "sleeper",
    input: Schema.Struct({ seconds: Schema.Number }),
    output: Schema.Struct({ slept: Schema.Number }),
    timeout: "5 minutes",
    concurrency: 4,
    handler: ({ seconds }, ctx) =>
      Effect.sync(() => {
        record.entered.push(ctx.taskId)
        record.signals.set(ctx.taskId, ctx.signal)
      }).pipe(
        Effect.andThen(Effect.sleep(Duration.seconds(seconds))),
        Effect.as({ slept: seconds }),
        Effect.onInterrupt(() => Effect.sync(() => record.interrupted.push(ctx.taskId))),
      ),
  })

const newRecord = (): Seen => ({ entered: [], interrupted: [], signals: new Map() })

/** The worker's environment on the MemoryBroker, with a 10 s shutdown grace. */
const environment = (worker: Worker.Any, overrides: Settings.SettingsOverrides = {}) =>
  memoryEnvironment(worker, { shutdownGrace: "10 seconds", ...overrides })

// ---------------------------------------------------------------------------------------------
// Helpers

/** The transport in context, saying when its intake has stopped. */
const watchIntake = () => {
  const watch = { stopped: false }
  const layer = Layer.effect(
    Transport,
    Effect.map(Transport, (transport) => ({
      ...transport,
      stopIntake: Effect.andThen(
        transport.stopIntake,
        Effect.sync(() => void (watch.stopped = true)),
      ),
    })),
  )
  return { watch, layer }
}

/** The broker's view of the worker's queues. */
const queues = Effect.gen(function* () {
  const broker = yield* MemoryBroker.MemoryBroker
  const settings = yield* Settings.Settings
  const submit = (taskId: string, seconds: number) =>
    broker.publish(settings.inQueue, envelope(taskId, { seconds })).pipe(Effect.orDie)
  /** The message types published for a task. */
  const published = (taskId: string) => publishedTypes(broker, settings.outQueue, taskId)
  return {
    submit,
    published,
    ready: broker.ready(settings.inQueue),
    unacked: broker.unacked(settings.inQueue),
  }
})

// ---------------------------------------------------------------------------------------------

describe("Drain", () => {
  it.effect("in-flight tasks that finish within the grace are concluded and acked", () => {
    const record = newRecord()
    const worker = sleeper(record)
    return Effect.gen(function* () {
      const q = yield* queues
      const running = yield* Worker.consume(worker)
      yield* q.submit("t-1", 3)
      yield* q.submit("t-2", 8)
      yield* waitUntil(() => record.entered.length === 2, "both tasks run")
      const draining = yield* Effect.forkChild(running.drain())
      yield* TestClock.adjust("7 seconds")
      expect(yield* isDone(draining)).toBe(false)
      yield* TestClock.adjust("1 second")
      const report = yield* Fiber.join(draining)
      expect(report).toEqual({ inFlightAtStart: 2, requeued: 0 })
      expect(yield* q.published("t-1")).toEqual(["started", "success"])
      expect(yield* q.published("t-2")).toEqual(["started", "success"])
      expect(record.interrupted).toEqual([])
      expect(yield* q.unacked).toBe(0)
      expect(yield* q.ready).toBe(0)
      expect(yield* running.inFlight).toBe(0)
    }).pipe(Effect.scoped, Effect.provide(environment(worker)))
  })

  it.effect("a task still running at the end of the grace is interrupted and requeued", () => {
    const record = newRecord()
    const worker = sleeper(record)
    const logs = captureLogs()
    return Effect.gen(function* () {
      const q = yield* queues
      const running = yield* Worker.consume(worker)
      yield* q.submit("t-fast", 2)
      yield* q.submit("t-slow", 60)
      yield* waitUntil(() => record.entered.length === 2, "both tasks run")
      const draining = yield* Effect.forkChild(running.drain())
      yield* TestClock.adjust("9999 millis")
      expect(yield* isDone(draining)).toBe(false)
      expect(yield* q.published("t-fast")).toEqual(["started", "success"])
      expect(record.interrupted).toEqual([])
      expect(yield* q.ready).toBe(0)

      // The grace (WORKER_SHUTDOWN_GRACE_S, 10 s here) ends: exactly now.
      yield* TestClock.adjust("1 millis")
      const report = yield* Fiber.join(draining)
      expect(report).toEqual({ inFlightAtStart: 2, requeued: 1 })
      expect(record.interrupted).toEqual(["t-slow"])
      expect(record.signals.get("t-slow")!.aborted).toBe(true)
      expect(yield* q.published("t-slow")).toEqual(["started"])
      // Back in the queue, no longer held.
      expect(yield* q.ready).toBe(1)
      expect(yield* q.unacked).toBe(0)
      const slow = logs.settled("t-slow")
      expect(slow).toHaveLength(1)
      expect(slow[0]!.annotations).toMatchObject({
        outcome: "shutdown_requeued",
        action: "nack-requeue",
      })
      expect(logs.settled("t-fast").map((l) => l.annotations.outcome)).toEqual(["success"])
      expect(
        logs.lines.some((l) =>
          l.level === "Warn" && l.message.includes("did not finish within the grace period")
        ),
      ).toBe(true)
    }).pipe(Effect.scoped, Effect.provide(environment(worker)), Effect.provide(logs.layer))
  })

  it.effect("a grace given to drain replaces WORKER_SHUTDOWN_GRACE_S", () => {
    const record = newRecord()
    const worker = sleeper(record)
    return Effect.gen(function* () {
      const q = yield* queues
      const running = yield* Worker.consume(worker)
      yield* q.submit("t-slow", 60)
      yield* waitUntil(() => record.entered.length === 1, "the task runs")
      const draining = yield* Effect.forkChild(running.drain({ grace: "3 seconds" }))
      yield* TestClock.adjust("2999 millis")
      expect(yield* isDone(draining)).toBe(false)
      yield* TestClock.adjust("1 millis")
      expect(yield* Fiber.join(draining)).toEqual({ inFlightAtStart: 1, requeued: 1 })
      expect(yield* q.ready).toBe(1)
    }).pipe(Effect.scoped, Effect.provide(environment(worker)))
  })

  it.effect("skipGrace (a second signal) ends the grace early", () => {
    const record = newRecord()
    const worker = sleeper(record)
    return Effect.gen(function* () {
      const q = yield* queues
      const running = yield* Worker.consume(worker)
      yield* q.submit("t-slow", 60)
      yield* waitUntil(() => record.entered.length === 1, "the task runs")
      const second = yield* Deferred.make<void>()
      const draining = yield* Effect.forkChild(running.drain({ skipGrace: Deferred.await(second) }))
      yield* TestClock.adjust("3 seconds")
      expect(yield* isDone(draining)).toBe(false)
      expect(record.interrupted).toEqual([])
      yield* Deferred.succeed(second, undefined)
      // No more time passes: the second signal alone ends the wait.
      const report = yield* Fiber.join(draining)
      expect(report).toEqual({ inFlightAtStart: 1, requeued: 1 })
      expect(record.interrupted).toEqual(["t-slow"])
      expect(yield* q.ready).toBe(1)
    }).pipe(Effect.scoped, Effect.provide(environment(worker)))
  })

  it.effect("intake stops: a task published once the drain has begun is not consumed", () => {
    const record = newRecord()
    const worker = sleeper(record)
    const intake = watchIntake()
    return Effect.gen(function* () {
      const q = yield* queues
      const running = yield* Worker.consume(worker)
      yield* q.submit("t-early", 5)
      yield* waitUntil(() => record.entered.length === 1, "the task runs")
      const draining = yield* Effect.forkChild(running.drain())
      yield* waitUntil(() => intake.watch.stopped, "the drain has begun")
      yield* q.submit("t-late", 1)
      yield* TestClock.adjust("5 seconds")
      expect(yield* Fiber.join(draining)).toEqual({ inFlightAtStart: 1, requeued: 0 })
      yield* TestClock.adjust("5 seconds")
      expect(record.entered).toEqual(["t-early"])
      expect(yield* q.published("t-late")).toEqual([])
      expect(yield* q.ready).toBe(1)
      expect(yield* q.unacked).toBe(0)
      // Intake has stopped for good: the worker has nothing left to await.
      yield* running.await
    }).pipe(Effect.scoped, Effect.provide(intake.layer), Effect.provide(environment(worker)))
  })

  it.effect("a drain with nothing in flight ends at once", () => {
    const worker = sleeper(newRecord())
    return Effect.gen(function* () {
      const running = yield* Worker.consume(worker)
      expect(yield* running.drain()).toEqual({ inFlightAtStart: 0, requeued: 0 })
    }).pipe(Effect.scoped, Effect.provide(environment(worker)))
  })

  it.effect("without a drain, closing the worker's scope requeues what is in hand at once", () => {
    const record = newRecord()
    const worker = sleeper(record)
    const logs = captureLogs()
    return Effect.gen(function* () {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(environment(worker), scope)
      const q = yield* Effect.provide(queues, context)
      yield* Worker.consume(worker).pipe(Scope.provide(scope), Effect.provide(context))
      yield* q.submit("t-slow", 60)
      yield* waitUntil(() => record.entered.length === 1, "the task runs")
      // No grace: the scope closes with no time passing.
      yield* Scope.close(scope, Exit.void)
      expect(record.interrupted).toEqual(["t-slow"])
      expect(yield* q.published("t-slow")).toEqual(["started"])
      expect(logs.settled("t-slow").map((l) => l.annotations.outcome)).toEqual([
        "shutdown_requeued",
      ])
      expect(yield* q.ready).toBe(1)
      expect(yield* q.unacked).toBe(0)
    }).pipe(Effect.provide(logs.layer))
  })

  describe("Worker.serve, interrupted, drains in its scope's finalizer", () => {
    it.effect("with the grace honoured: a task that finishes in time is concluded", () => {
      const record = newRecord()
      const worker = sleeper(record)
      return Effect.gen(function* () {
        const q = yield* queues
        const serving = yield* Effect.forkChild(Worker.serve(worker))
        yield* q.submit("t-fast", 4)
        yield* waitUntil(() => record.entered.length === 1, "the task runs")
        // Effect 4's `Fiber.interrupt` gives no Exit: the one of the interrupted fiber is awaited.
        const stopping = yield* Effect.forkChild(
          Effect.andThen(Fiber.interrupt(serving), Fiber.await(serving)),
        )
        yield* TestClock.adjust("3 seconds")
        // Not cut short: the task is still running, the stop still waiting for it.
        expect(record.interrupted).toEqual([])
        expect(yield* isDone(stopping)).toBe(false)
        yield* TestClock.adjust("1 second")
        const exit = yield* Fiber.join(stopping)
        expect(Exit.hasInterrupts(exit)).toBe(true)
        expect(record.interrupted).toEqual([])
        expect(yield* q.published("t-fast")).toEqual(["started", "success"])
        expect(yield* q.unacked).toBe(0)
        expect(yield* q.ready).toBe(0)
      }).pipe(Effect.provide(environment(worker)))
    })

    it.effect("a task that does not finish is requeued at the end of the grace, not before", () => {
      const record = newRecord()
      const worker = sleeper(record)
      const logs = captureLogs()
      return Effect.gen(function* () {
        const q = yield* queues
        const serving = yield* Effect.forkChild(Worker.serve(worker))
        yield* q.submit("t-fast", 4)
        yield* q.submit("t-slow", 60)
        yield* waitUntil(() => record.entered.length === 2, "both tasks run")
        // Effect 4's `Fiber.interrupt` gives no Exit: the one of the interrupted fiber is awaited.
        const stopping = yield* Effect.forkChild(
          Effect.andThen(Fiber.interrupt(serving), Fiber.await(serving)),
        )
        yield* TestClock.adjust("4 seconds")
        yield* waitUntil(
          () => Effect.map(q.published("t-fast"), (types) => types.includes("success")),
          "the fast task concludes",
        )
        expect(yield* isDone(stopping)).toBe(false)
        yield* TestClock.adjust("5999 millis")
        expect(yield* isDone(stopping)).toBe(false)
        expect(record.interrupted).toEqual([])
        expect(yield* q.ready).toBe(0)

        yield* TestClock.adjust("1 millis")
        const exit = yield* Fiber.join(stopping)
        expect(Exit.hasInterrupts(exit)).toBe(true)
        expect(record.interrupted).toEqual(["t-slow"])
        expect(yield* q.published("t-fast")).toEqual(["started", "success"])
        expect(yield* q.published("t-slow")).toEqual(["started"])
        expect(yield* q.ready).toBe(1)
        expect(yield* q.unacked).toBe(0)
        expect(logs.settled("t-slow").map((l) => l.annotations.outcome)).toEqual([
          "shutdown_requeued",
        ])
      }).pipe(Effect.provide(environment(worker)), Effect.provide(logs.layer))
    })

    it.effect("Worker.layer drains the same way when it is released", () => {
      const record = newRecord()
      const worker = sleeper(record)
      return Effect.gen(function* () {
        const q = yield* queues
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(Worker.layer(worker), scope)
        yield* q.submit("t-fast", 2)
        yield* q.submit("t-slow", 60)
        yield* waitUntil(() => record.entered.length === 2, "both tasks run")
        const releasing = yield* Effect.forkChild(Scope.close(scope, Exit.void))
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(releasing)).toBe(false)
        expect(yield* q.published("t-fast")).toEqual(["started", "success"])
        yield* TestClock.adjust("1 millis")
        yield* Fiber.join(releasing)
        expect(record.interrupted).toEqual(["t-slow"])
        expect(yield* q.ready).toBe(1)
      }).pipe(Effect.provide(environment(worker)))
    })
  })
})
