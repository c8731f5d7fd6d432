/**
 * A time limit that does not wait for what it cuts short. Effect 4's `Effect.timeout*` wait for
 * the interrupted effect to end, and Effect 4 has no combinator that leaves it behind: a shutdown
 * hook that refuses interruption, or a readiness probe stuck in an uninterruptible region, would
 * hold the shutdown or the probe's answer past its bound.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"

/**
 * `effect` within `duration`, or `None` once the time is up, without waiting for it to end: it
 * runs on a fiber of its own, with the caller's context, interruptible even where the caller is
 * not (a finalizer), and is interrupted in the background at the bound or when the caller is.
 */
export const timeoutDetached = <A, E, R>(
  effect: Effect.Effect<A, E, R>,
  duration: Duration.Input,
): Effect.Effect<Option.Option<A>, E, R> =>
  Effect.flatMap(
    Effect.forkDetach(Effect.interruptible(effect)),
    (fiber) =>
      Effect.interruptible(Fiber.join(fiber)).pipe(
        Effect.timeoutOption(duration),
        Effect.onExit((exit) =>
          Effect.sync(() => {
            if (exit._tag === "Failure" || Option.isNone(exit.value)) fiber.interruptUnsafe()
          })
        ),
      ),
  )
