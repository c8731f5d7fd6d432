/**
 * How many tasks a worker runs at once: a fixed number, an adaptive target (additive increase,
 * multiplicative decrease on congestion), or slots of a pool shared by several workers. The
 * engine asks its {@link Limiter} for a slot before each task starts and gives it back when the
 * task is settled; the target can change at run time without touching running tasks.
 *
 * @since 0.1.0
 */
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"
import { ConcurrencyError } from "./WorkerError.ts"
import { LatencyLimit } from "./internal/concurrency/latency.ts"
import { Slots } from "./internal/concurrency/slots.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"

const MAX = 2 ** 31 - 1

/**
 * An invalid concurrency; see {@link WorkerError.ConcurrencyError}.
 *
 * @since 0.1.0
 * @category errors
 */
export { ConcurrencyError }

/**
 * Checks a concurrency target (0 pauses intake).
 *
 * @since 0.1.0
 * @category constructors
 */
export const validate = (n: unknown): Effect.Effect<number, ConcurrencyError> =>
  typeof n === "number" && Number.isInteger(n) && n >= 0 && n <= MAX
    ? Effect.succeed(n)
    : Effect.fail(new ConcurrencyError({ value: n }))

/**
 * The default multiplicative decrease. Gentler than TCP's 0.5 (Netflix's concurrency-limits
 * uses 0.9): a halving empties a worker whose refused tasks wait their backoff; with 0.75 the
 * work that reached the downstream in `bench/adaptive.ts` averaged its knee, with 0.5 it stayed
 * below it (the figures are in `bench/README.md`).
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_DECREASE = 0.75

/**
 * The default latency tolerance of `by: "latency"`: a round of tasks within 10% of the best
 * recent round's latency is no queue. In `bench/adaptive.ts` it settles at the knee, probing one
 * above it after each hold; a handler whose latency varies more than that at rest needs more.
 *
 * @since 0.2.0
 * @category constants
 */
export const DEFAULT_TOLERANCE = 0.1

/**
 * Adaptive concurrency. `by: "congestion"` (the default, AIMD): after `window` successes in a
 * row (default: the current target) the target grows by one. `by: "latency"`: the target grows
 * by one while the handler's latency, averaged over rounds of tasks, holds within `tolerance`
 * (default {@link DEFAULT_TOLERANCE}) of its best recent round, and falls in proportion to the
 * excess when a queue shows (see `internal/concurrency/latency.ts`): no error needed. Either way,
 * a task that ends with `RetryableError({ congestion: true })` (or a time out, with
 * `decreaseOnTimeout`) multiplies it by `decrease` (default {@link DEFAULT_DECREASE}). Never
 * below `min` nor above `max`; running tasks are never cancelled.
 *
 * @since 0.1.0
 * @category models
 */
export interface Adaptive {
  readonly _tag: "Adaptive"
  readonly min: number
  readonly max: number
  readonly initial: number
  readonly by: "congestion" | "latency"
  readonly window: number | undefined
  readonly tolerance: number
  readonly decrease: number
  readonly decreaseOnTimeout: boolean
}

/**
 * Slots shared by the workers of one process: a task of weight `w` takes `w` slots, and a slot
 * one worker frees can go to another. Workers of one pool never run more than `capacity` slots'
 * worth of tasks together.
 *
 * @since 0.1.0
 * @category models
 */
export interface Pool {
  readonly _tag: "Pool"
  readonly capacity: number
}

/** Each pool's slots, kept out of its type (they are the engine's): made on first use. */
const poolSlots = new WeakMap<Pool, Slots>()

const slotsOf = (pool: Pool): Slots => {
  let slots = poolSlots.get(pool)
  if (slots === undefined) poolSlots.set(pool, slots = new Slots(pool.capacity))
  return slots
}

/**
 * What a worker definition says about its concurrency.
 *
 * @since 0.1.0
 * @category models
 */
export type Policy = number | Adaptive | Pool

/**
 * Makes an adaptive policy.
 *
 * @since 0.1.0
 * @category constructors
 */
export const adaptive = (options: {
  readonly min: number
  readonly max: number
  readonly initial?: number | undefined
  readonly by?: "congestion" | "latency" | undefined
  readonly window?: number | undefined
  readonly tolerance?: number | undefined
  readonly decrease?: number | undefined
  readonly decreaseOnTimeout?: boolean | undefined
}): Adaptive => {
  const { max, min } = options
  const initial = options.initial ?? min
  if (
    !Number.isInteger(min) || !Number.isInteger(max) || !Number.isInteger(initial) || min < 1 ||
    max < min || max > MAX || initial < min || initial > max
  ) {
    throw new ConcurrencyError({ value: { min, max, initial } })
  }
  const decrease = options.decrease ?? DEFAULT_DECREASE
  if (!(decrease > 0 && decrease < 1)) throw new ConcurrencyError({ value: { decrease } })
  if (options.window !== undefined && !(Number.isInteger(options.window) && options.window >= 1)) {
    throw new ConcurrencyError({ value: { window: options.window } })
  }
  const by = options.by ?? "congestion"
  if (by !== "congestion" && by !== "latency") throw new ConcurrencyError({ value: { by } })
  const tolerance = options.tolerance ?? DEFAULT_TOLERANCE
  if (!(tolerance > 0 && tolerance <= 10)) throw new ConcurrencyError({ value: { tolerance } })
  return {
    _tag: "Adaptive",
    min,
    max,
    initial,
    by,
    window: options.window,
    tolerance,
    decrease,
    decreaseOnTimeout: options.decreaseOnTimeout ?? false,
  }
}

/**
 * Makes a pool, to give to several workers' definitions.
 *
 * @since 0.1.0
 * @category constructors
 */
export const pool = (options: { readonly capacity: number }): Pool => {
  if (!Number.isInteger(options.capacity) || options.capacity < 1 || options.capacity > MAX) {
    throw new ConcurrencyError({ value: options.capacity })
  }
  return { _tag: "Pool", capacity: options.capacity }
}

/**
 * How a handler ended, as adaptive concurrency reads it: given back with the slot as soon as
 * the handler returns, before any retry backoff, so that a decrease is not late.
 *
 * @since 0.1.0
 * @category models
 */
export type HandlerEnd = "success" | "congestion" | "timeout" | "other"

/**
 * A worker's slots: its own target, and its pool's when it has one.
 *
 * @since 0.1.0
 * @category models
 */
export interface Limiter {
  /** The target now: tasks this worker may run at once (and its prefetch). */
  readonly target: () => number
  /**
   * Takes a slot (and the task's weight of its pool) if free now, and returns a ticket to give
   * back with {@link Limiter.release}; `undefined` when there is none: wait with
   * {@link Limiter.awaitSlot}, then try again. Synchronous, so that whoever takes the slot
   * records it in the same step, and no interruption falls between the two.
   */
  readonly tryAcquire: () => number | undefined
  /** Completes when {@link Limiter.tryAcquire} may succeed (another taker may come first). */
  readonly awaitSlot: Effect.Effect<void>
  /**
   * Gives the slot back now, saying how the handler ended and how long it ran in ms (the
   * adaptive policy's feedback), and returns the change of target that feedback calls for, to
   * run; `undefined` when there is none. Synchronous, as {@link Limiter.tryAcquire} is: every
   * task gives its slot back.
   */
  readonly release: (
    ticket: number,
    ended: HandlerEnd,
    millis?: number | undefined,
  ) => Effect.Effect<void> | undefined
  /** Sets the target (a non-zero one clamped to an adaptive policy's bounds); running tasks go on. */
  readonly setTarget: (n: number) => Effect.Effect<void>
  /** Runs `listener` with each new target, whoever changed it (to follow with the prefetch). */
  readonly onChange: (listener: (target: number) => Effect.Effect<void>) => void
}

/**
 * The limiter of a worker with `policy`, starting at `initial` (the settings' concurrency) and
 * taking `weight` slots of a pool per task.
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeLimiter = (
  policy: Policy | undefined,
  initial: number,
  weight = 1,
): Effect.Effect<Limiter> =>
  Effect.gen(function* () {
    const adaptivePolicy = typeof policy === "object" && policy._tag === "Adaptive"
      ? policy
      : undefined
    const pooled = typeof policy === "object" && policy._tag === "Pool"
      ? slotsOf(policy)
      : undefined
    const clamp = (n: number) =>
      adaptivePolicy === undefined
        ? n
        : Math.min(adaptivePolicy.max, Math.max(adaptivePolicy.min, n))
    let target = clamp(initial)
    const own = new Slots(target)
    const listeners: Array<(target: number) => Effect.Effect<void>> = []
    // Adaptive state: successes in a row, and the ticket before which a congestion signal is
    // an echo of a decrease already made (those tasks started before it); the latency policy's
    // rounds, and the ticket before which a latency measured another target.
    let tickets = 0
    let successes = 0
    let decreasedAt = 0
    let changedAt = 0
    const latency = adaptivePolicy?.by === "latency"
      ? new LatencyLimit(adaptivePolicy.tolerance)
      : undefined

    // The gauge moves in the same step as the target, in the registry of the fiber that moves it.
    const apply = (n: number) =>
      Effect.withFiber(({ context }) => {
        if (n === target) return Effect.void
        // A latency measures the new target once its slots have filled: the tasks that fill the
        // slots a raise adds start beside fewer than it allows.
        changedAt = tickets + Math.max(0, n - target)
        target = n
        latency?.restart()
        if (adaptivePolicy !== undefined) WorkerMetrics.concurrencyTarget.updateUnsafe(n, context)
        own.resize(n)
        return Effect.forEach(listeners, (listener) => listener(n), { discard: true })
      })
    if (adaptivePolicy !== undefined) {
      yield* Metric.update(WorkerMetrics.concurrencyTarget, target)
    }

    const feedback = (
      ticket: number,
      ended: HandlerEnd,
      millis: number | undefined,
      busy: boolean,
    ): Effect.Effect<void> | undefined => {
      if (adaptivePolicy === undefined) return undefined
      const congested = ended === "congestion" ||
        (adaptivePolicy.decreaseOnTimeout && ended === "timeout")
      if (congested) {
        successes = 0
        latency?.congested()
        if (ticket <= decreasedAt) return undefined
        decreasedAt = tickets
        return apply(clamp(Math.floor(target * adaptivePolicy.decrease)))
      }
      if (ended !== "success") return undefined
      if (latency !== undefined) {
        if (millis === undefined || ticket <= changedAt) return undefined
        const next = latency.sample(millis, target, busy)
        return next === undefined || clamp(next) === target ? undefined : apply(clamp(next))
      }
      successes += 1
      if (successes < (adaptivePolicy.window ?? target)) return undefined
      successes = 0
      return apply(clamp(target + 1))
    }

    const giveBack = (ticket: number, ended: HandlerEnd, millis?: number) => {
      // Busy: using half its target or more, this task included (the latency policy's question).
      const busy = latency !== undefined && 2 * (target - own.free) >= target
      pooled?.release(weight)
      own.release()
      return feedback(ticket, ended, millis, busy)
    }

    return {
      target: () => target,
      tryAcquire: () => {
        if (!own.tryTake()) return undefined
        if (pooled !== undefined && !pooled.tryTake(weight)) {
          own.release()
          return undefined
        }
        return ++tickets
      },
      awaitSlot: Effect.suspend(() =>
        own.free < 1
          ? own.awaitFree()
          : pooled === undefined
          ? Effect.void
          : pooled.awaitFree(weight)
      ),
      release: giveBack,
      // 0 pauses an adaptive worker too; any other target keeps within its bounds.
      setTarget: (n) => apply(n === 0 ? 0 : clamp(n)),
      onChange: (listener) => void listeners.push(listener),
    }
  })
