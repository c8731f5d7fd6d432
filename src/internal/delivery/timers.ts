/**
 * Many one-shot timers served by one fiber. A task's time limit and its lease renewals are
 * timers of every delivery: a fiber (or a race) per delivery costs more than the rest of the
 * engine together, so they share this one. Timers of one delay are kept in insertion order,
 * which is due order as well, so the next due timer is the head of one of a few lanes. A lane is
 * kept when it empties, up to a few: a worker's delays are a few fixed ones (a time limit, a
 * renewal interval), and a task that ends before its timer would otherwise make and drop a lane
 * each time; a transport whose leases vary in length must not make the lanes grow without end.
 */
import type { Scope } from "effect"
import { Deferred, Effect, FiberId } from "effect"

const KEPT_LANES = 8

/**
 * What a timer does when due: an Effect runs in a fiber of its own; a function is called by the
 * timers' fiber, for a callback that only records and signals (a time limit's), which a fiber
 * and an Effect per delivery would cost more than.
 */
export type Action = Effect.Effect<void> | (() => void)

interface Entry {
  readonly due: number
  readonly action: Action
}

/** The timers of one scope. */
export interface Timers {
  /** Runs `action` after `delayMillis`, unless cancelled by the returned function first. */
  readonly after: (delayMillis: number, action: Action) => () => void
}

/** Timers whose fiber, and whose pending actions, end with the scope. */
export const make: Effect.Effect<Timers, never, Scope.Scope> = Effect.gen(function* () {
  const clock = yield* Effect.clock
  const scope = yield* Effect.scope
  const lanes = new Map<number, Set<Entry>>()
  let target = Infinity
  let wake: Deferred.Deferred<void> | undefined

  const earliest = (): { entry: Entry; lane: Set<Entry>; delay: number } | undefined => {
    let best: { entry: Entry; lane: Set<Entry>; delay: number } | undefined
    for (const [delay, lane] of lanes) {
      const head = lane.values().next().value
      if (head !== undefined && (best === undefined || head.due < best.entry.due)) {
        best = { entry: head, lane, delay }
      }
    }
    return best
  }

  const remove = (delay: number, lane: Set<Entry>, entry: Entry) => {
    lane.delete(entry)
    if (lane.size === 0 && lanes.size > KEPT_LANES && lanes.get(delay) === lane) {
      lanes.delete(delay)
    }
  }

  const after = (delayMillis: number, action: Action) => {
    const entry: Entry = { due: clock.unsafeCurrentTimeMillis() + delayMillis, action }
    let lane = lanes.get(delayMillis)
    if (lane === undefined) {
      lane = new Set()
      lanes.set(delayMillis, lane)
    }
    lane.add(entry)
    // The fiber sleeps until `target`: wake it only when this timer is due before that.
    if (entry.due < target && wake !== undefined) {
      const w = wake
      wake = undefined
      target = entry.due
      Deferred.unsafeDone(w, Effect.void)
    }
    const owner = lane
    return () => remove(delayMillis, owner, entry)
  }

  // Once woken for a timer, the fiber sleeps until that timer's due even if it was cancelled in
  // the meantime: a short task cancels its time limit before this fiber runs, and waking it
  // again for the next task's timer (due later) would cost a wake per task.
  const loop = Effect.gen(function* () {
    for (;;) {
      let now = clock.unsafeCurrentTimeMillis()
      let next = earliest()
      while (next !== undefined && next.entry.due <= now) {
        remove(next.delay, next.lane, next.entry)
        const action = next.entry.action
        if (typeof action === "function") {
          try {
            action()
          } catch {
            // A callback's failure is its own: the timers of every other task must still fire.
          }
        } else {
          yield* Effect.forkIn(action, scope)
        }
        next = earliest()
      }
      now = clock.unsafeCurrentTimeMillis()
      if (target <= now) target = Infinity
      if (next !== undefined && next.entry.due < target) target = next.entry.due
      const signal = Deferred.unsafeMake<void>(FiberId.none)
      wake = signal
      if (target === Infinity) {
        yield* Deferred.await(signal)
      } else {
        // Whole milliseconds, up: a sleep is kept to the nanosecond, and one that ends a hair
        // before a fractional due would have the fiber sleep for nothing, again and again.
        yield* Effect.raceFirst(Effect.sleep(Math.ceil(target - now)), Deferred.await(signal))
      }
      wake = undefined
    }
  })

  yield* Effect.forkScoped(loop)
  return { after }
})
