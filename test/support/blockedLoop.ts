/**
 * A blocked event loop under the TestClock. A real block holds every timer while the wall clock
 * runs on; here the clock the code under test reads runs ahead of its sleeps: `block(ms)` moves
 * every read on by `ms` and wakes no sleep, so the next sleep to wake finds itself `ms` late, as a
 * timer held by the block does. Provide `clock` to what is watched (its sleeps still go to the
 * TestClock, which `TestClock.adjust` drives as before).
 */
import { Clock, Effect } from "effect"
import { TestClock } from "effect/testing"

export const blockedLoop = TestClock.testClockWith((test) =>
  Effect.sync(() => {
    let ahead = 0
    const millis = () => test.currentTimeMillisUnsafe() + ahead
    const nanos = (read: () => bigint) => () => read() + BigInt(ahead) * 1_000_000n
    const currentTimeNanosUnsafe = nanos(test.currentTimeNanosUnsafe)
    const monotonicTimeNanosUnsafe = nanos(test.monotonicTimeNanosUnsafe)
    const clock: Clock.Clock = {
      currentTimeMillisUnsafe: millis,
      currentTimeMillis: Effect.sync(millis),
      currentTimeNanosUnsafe,
      currentTimeNanos: Effect.sync(currentTimeNanosUnsafe),
      monotonicTimeNanosUnsafe,
      monotonicTimeNanos: Effect.sync(monotonicTimeNanosUnsafe),
      sleep: test.sleep,
    }
    /** The loop blocked for `ms`: the time runs on, no sleep wakes. */
    const block = (ms: number) => Effect.sync(() => void (ahead += ms))
    /** Runs `effect` on the clock of the blocked loop. */
    const watched = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.provideService(effect, Clock.Clock, clock)
    return { clock, block, watched }
  })
)
