/**
 * Closing a connection's parts, one bounded step at a time: closing must end even when the broker
 * does not answer.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"

/** What a closing step may take at most: `AmqpTransport.CLOSE_STEP_TIMEOUT`, documented there. */
export const CLOSE_STEP_TIMEOUT = Duration.seconds(5)

/**
 * A closing step, bounded by {@link CLOSE_STEP_TIMEOUT}, its failure ignored. Closing runs in
 * finalizers, which are uninterruptible: the step is made an interruptible region, so that its
 * time limit cuts it short (`test/internal/amqp/closing.test.ts` holds it to that).
 */
export const closeStep = <A, E>(step: Effect.Effect<A, E>): Effect.Effect<void> =>
  step.pipe(Effect.interruptible, Effect.timeout(CLOSE_STEP_TIMEOUT), Effect.ignore)
