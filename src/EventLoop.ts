/**
 * The event loop, watched: a timer on a `Schedule` that measures how late it wakes. A handler's
 * synchronous work (CPU-bound code, a synchronous API) holds every timer and socket read of the
 * process while it runs: heartbeats, publish confirms and probes all wait. The watch keeps the
 * worst lag since the last scrape in `event_loop_lag_seconds{component="worker"}`, logs a block
 * longer than {@link BLOCK_THRESHOLD} at WARNING once the loop is free (how long, the tasks in
 * flight, the remedy), and tells the engine of it, so that a delivery whose lease was lost after
 * a block says so in its decision line (`blocked_s`). A timer on the runtime's own clock works
 * alike on Node and Deno.
 *
 * @since 0.3.0
 */
import type * as Scope from "effect/Scope"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { lateness } from "./internal/lateness.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"

/**
 * What the worker asks of the watch.
 *
 * @since 0.3.0
 * @category models
 */
export interface EventLoopWatch {
  /**
   * The seconds of the last block longer than {@link BLOCK_THRESHOLD} if it ended at or after
   * `since` (epoch milliseconds, the watch's clock), else `undefined`: whether a delivery taken at
   * `since` was in hand during a block.
   */
  readonly blockedSince: (since: number) => number | undefined
  /**
   * Names the ids `tasks` gives in the WARNING of each block, for as long as the scope: the
   * engine's tasks in flight.
   */
  readonly watchTasks: (tasks: () => Iterable<string>) => Effect.Effect<void, never, Scope.Scope>
}

/**
 * The watch of the event loop the worker runs with: by default none (no block is ever seen);
 * a worker's life provides its own ({@link make}).
 *
 * @since 0.3.0
 * @category services
 */
export const EventLoop: Context.Reference<EventLoopWatch> = Context.Reference<EventLoopWatch>(
  "@async-task/worker/EventLoop",
  { defaultValue: () => ({ blockedSince: () => undefined, watchTasks: () => Effect.void }) },
)

/**
 * The shortest block that is logged and said in decision lines: 1 s. Shorter lags show only in
 * `event_loop_lag_seconds`.
 *
 * @since 0.3.0
 * @category constants
 */
export const BLOCK_THRESHOLD: Duration.Duration = Duration.seconds(1)

/**
 * Options of {@link make}.
 *
 * @since 0.3.0
 * @category models
 */
export interface Options {
  /**
   * How often the timer wakes: a block is measured from the one it holds, within this much.
   * Default 500 ms.
   */
  readonly interval?: Duration.Input | undefined
}

/** The ids a WARNING names at most: the line stays one line whatever the concurrency. */
const NAMED_AT_MOST = 20

/** The tasks in flight, as the WARNING names them. */
const inFlight = (sources: ReadonlySet<() => Iterable<string>>): string => {
  const ids: Array<string> = []
  for (const source of sources) for (const id of source()) ids.push(id)
  if (ids.length === 0) return "no task in flight"
  const named = ids.slice(0, NAMED_AT_MOST).join(", ")
  const more = ids.length > NAMED_AT_MOST ? ` and ${ids.length - NAMED_AT_MOST} more` : ""
  return `the task${ids.length === 1 ? "" : "s"} ${named}${more} in flight`
}

/**
 * The WARNING of a block of `seconds`, once the loop is free.
 *
 * @since 0.3.0
 * @category logging
 */
export const blockLine = (seconds: number, tasks: string): string =>
  `The event loop was blocked for ${seconds.toFixed(1)} s, with ${tasks}: no timer, heartbeat, ` +
  "publish confirm or probe ran meanwhile. Move CPU-bound work off the event loop, to a worker " +
  "thread; a block of two heartbeats (WORKER_HEARTBEAT_S) or more loses the broker connection, " +
  "and the tasks in flight run again"

/** The gauge keeps the worst lag since the last scrape: a lag is kept if it is worse. */
const keepWorst = (seconds: number) =>
  Effect.withFiber((fiber) => {
    if (seconds > WorkerMetrics.eventLoopLag.valueUnsafe(fiber.context).value) {
      WorkerMetrics.eventLoopLag.updateUnsafe(seconds, fiber.context)
    }
    return Effect.void
  })

/**
 * After a scrape: the worst lag starts again from 0, so that the next scrape shows the worst
 * since this one (`RuntimeMetrics.scrape` runs it).
 *
 * @since 0.3.0
 * @category metrics
 */
export const scraped: Effect.Effect<void> = Effect.withFiber((fiber) => {
  WorkerMetrics.eventLoopLag.updateUnsafe(0, fiber.context)
  return Effect.void
})

/**
 * Watches the event loop for as long as the scope lives: its timer wakes every `interval`, and
 * how late it wakes is the loop's lag.
 *
 * @since 0.3.0
 * @category constructors
 */
export const make = (options: Options = {}): Effect.Effect<EventLoopWatch, never, Scope.Scope> =>
  Effect.gen(function* () {
    const intervalMillis = Duration.toMillis(
      Duration.fromInputUnsafe(options.interval ?? "500 millis"),
    )
    const thresholdMillis = Duration.toMillis(BLOCK_THRESHOLD)
    const clock = yield* Clock.Clock
    const sources = new Set<() => Iterable<string>>()
    // The first run is due at once: a block before it is a block too.
    const lateBy = lateness(intervalMillis, clock.currentTimeMillisUnsafe() - intervalMillis)
    let last: { readonly seconds: number; readonly endedAt: number } | undefined
    const tick = Effect.suspend(() => {
      const now = clock.currentTimeMillisUnsafe()
      const late = lateBy(now)
      const seconds = late / 1000
      if (late < thresholdMillis) return keepWorst(seconds)
      last = { seconds, endedAt: now }
      return Effect.andThen(
        keepWorst(seconds),
        Effect.logWarning(blockLine(seconds, inFlight(sources))).pipe(
          Effect.annotateLogs({ blocked_s: Math.round(seconds * 10) / 10 }),
        ),
      )
    })
    yield* Effect.forkScoped(Effect.repeat(tick, Schedule.spaced(Duration.millis(intervalMillis))))
    return {
      blockedSince: (
        since,
      ) => (last !== undefined && last.endedAt >= since ? last.seconds : undefined),
      watchTasks: (tasks) =>
        Effect.acquireRelease(
          Effect.sync(() => void sources.add(tasks)),
          () => Effect.sync(() => void sources.delete(tasks)),
        ),
    }
  })

/**
 * {@link make} as the {@link EventLoop} of what it is provided to.
 *
 * @since 0.3.0
 * @category layers
 */
export const layer = (options: Options = {}): Layer.Layer<never> =>
  Layer.effectContext(Effect.map(make(options), (watch) => Context.make(EventLoop, watch)))
