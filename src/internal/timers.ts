/**
 * Many one-shot timers served by one fiber. A task's time limit and its lease renewals are
 * timers of every delivery: a fiber (or a race) per delivery costs more than the rest of the
 * engine together, so they share this one. Timers of one delay are kept in insertion order,
 * which is due order as well, so the next due timer is the head of one of a few lanes.
 */
import type { Scope } from "effect"
import { Deferred, Effect, FiberId } from "effect"

interface Entry {
  readonly due: number
  readonly action: Effect.Effect<void>
}

/** The timers of one scope. */
export interface Timers {
  /** Runs `action` (in its own fiber) after `delayMillis`, unless cancelled by the returned function first. */
  readonly after: (delayMillis: number, action: Effect.Effect<void>) => () => void
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
    if (lane.size === 0 && lanes.get(delay) === lane) lanes.delete(delay)
  }

  const after = (delayMillis: number, action: Effect.Effect<void>) => {
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
      Deferred.unsafeDone(w, Effect.void)
    }
    const owner = lane
    return () => remove(delayMillis, owner, entry)
  }

  const loop = Effect.gen(function* () {
    for (;;) {
      const now = clock.unsafeCurrentTimeMillis()
      let next = earliest()
      while (next !== undefined && next.entry.due <= now) {
        remove(next.delay, next.lane, next.entry)
        yield* Effect.forkIn(next.entry.action, scope)
        next = earliest()
      }
      const signal = Deferred.unsafeMake<void>(FiberId.none)
      wake = signal
      if (next === undefined) {
        target = Infinity
        yield* Deferred.await(signal)
      } else {
        target = next.entry.due
        yield* Effect.raceFirst(Effect.sleep(next.entry.due - now), Deferred.await(signal))
      }
      wake = undefined
      target = Infinity
    }
  })

  yield* Effect.forkScoped(loop)
  return { after }
})
