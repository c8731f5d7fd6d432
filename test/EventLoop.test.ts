import { describe, expect, it } from "@effect/vitest"
import { Effect, Metric } from "effect"
import { TestClock } from "effect/testing"
import * as EventLoop from "../src/EventLoop.ts"
import * as RuntimeMetrics from "../src/RuntimeMetrics.ts"
import { blockedLoop } from "./support/blockedLoop.ts"
import { captureLogs } from "./support/logs.ts"
import { parse, value } from "./support/prometheus.ts"

const lag = Effect.map(
  RuntimeMetrics.scrape,
  (text) => value(parse(text), "event_loop_lag_seconds", { component: "worker" }),
)

/** The watch on a blocked loop of the TestClock, its lines captured, its metrics its own. */
const watching = Effect.gen(function* () {
  const loop = yield* blockedLoop
  const logs = captureLogs()
  const watch = yield* loop.watched(EventLoop.make()).pipe(Effect.provide(logs.layer))
  const warnings = () => logs.lines.filter((l) => l.level === "Warn")
  return { loop, logs, watch, warnings }
})

/** Blocks the event loop for `ms` milliseconds of wall time. */
const block = (ms: number) => {
  const end = performance.now() + ms
  while (performance.now() < end) { /* busy */ }
}

const ownRegistry = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, Metric.MetricRegistry, new Map())

describe("EventLoop", () => {
  it.effect("a block longer than a second is logged once the loop is free: how long, the tasks in flight, the remedy", () =>
    Effect.gen(function* () {
      const { loop, watch, warnings } = yield* watching
      yield* watch.watchTasks(() => ["t-1", "t-2"])
      yield* TestClock.adjust("1 second")
      // A lag under the threshold is only a figure.
      yield* loop.block(400)
      yield* TestClock.adjust("500 millis")
      expect(warnings()).toEqual([])
      yield* loop.block(45_000)
      yield* TestClock.adjust("500 millis")
      expect(warnings().map((l) => l.message)).toEqual([
        "The event loop was blocked for 45.0 s, with the tasks t-1, t-2 in flight: no timer, " +
        "heartbeat, publish confirm or probe ran meanwhile. Move CPU-bound work off the event " +
        "loop, to a worker thread; a block of two heartbeats (WORKER_HEARTBEAT_S) or more loses " +
        "the broker connection, and the tasks in flight run again",
      ])
      expect(warnings()[0]!.annotations.blocked_s).toBe(45)
      // Said once: the loop runs on time again.
      yield* TestClock.adjust("10 seconds")
      expect(warnings()).toHaveLength(1)
    }).pipe(Effect.scoped))

  it.effect("the WARNING names the tasks in flight as the block ends, or none", () =>
    Effect.gen(function* () {
      const { loop, watch, warnings } = yield* watching
      yield* loop.block(2000)
      yield* TestClock.adjust("500 millis")
      const many = Array.from({ length: 25 }, (_, i) => `t-${i}`)
      yield* watch.watchTasks(() => many)
      yield* loop.block(3000)
      yield* TestClock.adjust("500 millis")
      const [none, named] = warnings().map((l) => l.message)
      expect(none).toContain("blocked for 2.0 s, with no task in flight:")
      expect(named).toContain(
        `with the tasks ${many.slice(0, 20).join(", ")} and 5 more in flight:`,
      )
    }).pipe(Effect.scoped))

  it.effect("event_loop_lag_seconds is the worst lag since the last scrape", () =>
    ownRegistry(
      Effect.gen(function* () {
        const { loop } = yield* watching
        yield* TestClock.adjust("1 second")
        yield* loop.block(3000)
        yield* TestClock.adjust("500 millis")
        // A later, shorter lag does not hide the block from the next scrape.
        yield* loop.block(200)
        yield* TestClock.adjust("500 millis")
        expect(yield* lag).toBe(3)
        expect(yield* lag).toBe(0)
        yield* loop.block(200)
        yield* TestClock.adjust("500 millis")
        expect(yield* lag).toBe(0.2)
      }),
    ).pipe(Effect.scoped))

  it.effect("blockedSince: the last block, if it ended at or after the given time", () =>
    Effect.gen(function* () {
      const { loop, watch } = yield* watching
      const start = loop.clock.currentTimeMillisUnsafe()
      yield* TestClock.adjust("1 second")
      expect(watch.blockedSince(start)).toBeUndefined()
      yield* loop.block(45_000)
      yield* TestClock.adjust("500 millis")
      const ended = loop.clock.currentTimeMillisUnsafe()
      expect(watch.blockedSince(start)).toBe(45)
      expect(watch.blockedSince(ended)).toBe(45)
      expect(watch.blockedSince(ended + 1)).toBeUndefined()
    }).pipe(Effect.scoped))

  it.live("on the runtime's own timers: a real block shows in event_loop_lag_seconds", () =>
    ownRegistry(
      Effect.gen(function* () {
        yield* EventLoop.make({ interval: "100 millis" })
        yield* Effect.sleep("20 millis")
        // The tick due at 100 ms wakes at ~270 ms.
        block(250)
        yield* Effect.sleep("10 millis")
        const worst = yield* lag
        expect(worst).toBeGreaterThan(0.1)
        expect(worst).toBeLessThan(1)
      }),
    ).pipe(Effect.scoped))

  it.effect("with no watch in the context, no block is ever seen", () =>
    Effect.gen(function* () {
      const watch = yield* EventLoop.EventLoop
      expect(watch.blockedSince(0)).toBeUndefined()
    }))
})
