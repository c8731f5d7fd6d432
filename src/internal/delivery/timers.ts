/**
 * Many one-shot timers served by one fiber. A task's time limit and its lease renewals are
 * timers of every delivery: a fiber (or a race) per delivery costs more than the rest of the
 * engine together, so they share this one. Timers of one delay are kept in insertion order,
 * which is due order as well, so the next due timer is the head of one of a few lanes. A lane is
 * kept when it empties, up to a few: a worker's delays are a few fixed ones (a time limit, a
 * renewal interval), and a task that ends before its timer would otherwise make and drop a lane
 * each time; a transport whose leases vary in length must not make the lanes grow without end.
 */
import type * as Scope from "effect/Scope"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"

const KEPT_LANES = 8

/**
 * What a timer does when due: an Effect runs in a fiber of its own; a function is called by the
 * timers' fiber, for a callback that only records and signals (a time limit's), which a fiber
 * and an Effect per delivery would cost more than.
 */
export type Action = Effect.Effect<void> | (() => void)

/** A timer set by {@link Timers.after}. */
export interface Timer {
  /** Stops the timer, if it has not fired yet. */
  readonly cancel: () => void
}

/**
 * The timers of one delay, in insertion order (due order as well), knowing their delay and
 * whose they are, so that a timer leaves it by a method of its own.
 */
class Lane extends Set<Entry> {
  readonly delay: number
  readonly lanes: Map<number, Lane>

  constructor(delay: number, lanes: Map<number, Lane>) {
    super()
    this.delay = delay
    this.lanes = lanes
  }
}

/**
 * A pending timer, in its lane. Cancelled by a method rather than a closure of its own: every
 * delivery sets one or two, memory `bench/engine.ts` counts per task in flight.
 */
class Entry implements Timer {
  readonly due: number
  readonly action: Action
  readonly lane: Lane

  constructor(due: number, action: Action, lane: Lane) {
    this.due = due
    this.action = action
    this.lane = lane
  }

  cancel(): void {
    const lane = this.lane
    lane.delete(this)
    if (lane.size === 0 && lane.lanes.size > KEPT_LANES && lane.lanes.get(lane.delay) === lane) {
      lane.lanes.delete(lane.delay)
    }
  }
}

/** The timers of one scope. */
export interface Timers {
  /** Runs `action` after `delayMillis`, unless the returned timer is cancelled first. */
  readonly after: (delayMillis: number, action: Action) => Timer
}

/** Timers whose fiber, and whose pending actions, end with the scope. */
export const make: Effect.Effect<Timers, never, Scope.Scope> = Effect.gen(function* () {
  const clock = yield* Clock.Clock
  const scope = yield* Effect.scope
  const lanes = new Map<number, Lane>()
  let target = Infinity
  let wake: Deferred.Deferred<void> | undefined

  const earliest = (): Entry | undefined => {
    let best: Entry | undefined
    for (const lane of lanes.values()) {
      const head = lane.values().next().value
      if (head !== undefined && (best === undefined || head.due < best.due)) best = head
    }
    return best
  }

  const after = (delayMillis: number, action: Action): Timer => {
    let lane = lanes.get(delayMillis)
    if (lane === undefined) {
      lane = new Lane(delayMillis, lanes)
      lanes.set(delayMillis, lane)
    }
    const entry = new Entry(clock.currentTimeMillisUnsafe() + delayMillis, action, lane)
    lane.add(entry)
    // The fiber sleeps until `target`: wake it only when this timer is due before that.
    if (entry.due < target && wake !== undefined) {
      const w = wake
      wake = undefined
      target = entry.due
      Deferred.doneUnsafe(w, Effect.void)
    }
    return entry
  }

  // Once woken for a timer, the fiber sleeps until that timer's due even if it was cancelled in
  // the meantime: a short task cancels its time limit before this fiber runs, and waking it
  // again for the next task's timer (due later) would cost a wake per task.
  const loop = Effect.gen(function* () {
    for (;;) {
      let now = clock.currentTimeMillisUnsafe()
      let next = earliest()
      while (next !== undefined && next.due <= now) {
        next.cancel()
        const action = next.action
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
      now = clock.currentTimeMillisUnsafe()
      if (target <= now) target = Infinity
      if (next !== undefined && next.due < target) target = next.due
      const signal = Deferred.makeUnsafe<void>()
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
