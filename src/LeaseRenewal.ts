/**
 * Keeps a running task's lease: renews it when a third of its duration remains, and reports
 * when it is lost, whether the broker took it back or refused a renewal.
 *
 * @since 0.1.0
 */
import { Context, Duration, Effect, Layer, Option, Schedule } from "effect"
import type { Lease } from "./Transport.ts"
import type { LeaseLost } from "./WorkerError.ts"

/**
 * Lease keeping.
 *
 * @since 0.1.0
 * @category tags
 */
export class LeaseRenewal extends Context.Tag("@async-task/worker/LeaseRenewal")<LeaseRenewal, {
  /** Runs while the lease is held, renewing it if it can be; completes with why it was lost. */
  readonly keep: (lease: Lease) => Effect.Effect<LeaseLost>
}>() {}

/**
 * The time between two renewals of a lease of `duration`: two thirds of it, so that a third
 * remains when it is renewed.
 *
 * @since 0.1.0
 * @category constructors
 */
export const renewalInterval = (duration: Duration.Duration): Duration.Duration =>
  Duration.millis(Duration.toMillis(duration) * 2 / 3)

/**
 * Renews on a `Schedule.spaced` of two thirds of the lease.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: LeaseRenewal["Type"] = LeaseRenewal.of({
  keep: (lease) => {
    if (Option.isNone(lease.renew) || Option.isNone(lease.duration)) return lease.lost
    const interval = renewalInterval(lease.duration.value)
    const renewing = lease.renew.value.pipe(
      Effect.repeat(Schedule.spaced(interval)),
      Effect.delay(interval),
      Effect.zipRight(Effect.never),
      Effect.flip,
    )
    return Effect.raceFirst(lease.lost, renewing)
  },
})

/**
 * The renewal service.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<LeaseRenewal> = Layer.succeed(LeaseRenewal, make)
