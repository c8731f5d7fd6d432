/**
 * Keeps a running task's lease: renews it when a third of its duration remains, and reports
 * when it is lost, whether the broker took it back or refused a renewal.
 *
 * @since 0.1.0
 */
import type * as Scope from "effect/Scope"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Timers from "./internal/delivery/timers.ts"
import type { Lease } from "./Transport.ts"
import type { LeaseLost } from "./WorkerError.ts"

interface LeaseRenewalShape {
  /**
   * Holds the lease until the returned release is called: renews it if it can be, and calls
   * `onLost` once if it is lost first (taken back, or a renewal refused). Synchronous, for the
   * engine, which holds a lease per delivery: {@link keep} is the Effect of it.
   */
  readonly holdUnsafe: (lease: Lease, onLost: (lost: LeaseLost) => void) => () => void
  /** Holds the lease for as long as this runs; completes with why it was lost. */
  readonly keep: (lease: Lease) => Effect.Effect<LeaseLost>
}

const LeaseRenewalService: Context.ServiceClass<
  LeaseRenewal,
  "@async-task/worker/LeaseRenewal",
  LeaseRenewalShape
> = Context.Service<LeaseRenewal, LeaseRenewalShape>()("@async-task/worker/LeaseRenewal")

/**
 * Lease keeping.
 *
 * @since 0.1.0
 * @category services
 */
export class LeaseRenewal extends LeaseRenewalService {}

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
 * Lease keeping whose renewals share one timer fiber for the whole scope, rather than a fiber
 * per lease: every delivery holds a lease, and a fiber each would cost more than the task.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: Effect.Effect<LeaseRenewal["Service"], never, Scope.Scope> = Effect.gen(
  function* () {
    const timers = yield* Timers.make
    const holdUnsafe = (lease: Lease, onLost: (lost: LeaseLost) => void) => {
      let held = true
      const lose = (lost: LeaseLost) => {
        if (!held) return
        held = false
        onLost(lost)
      }
      const stopWatching = lease.onLost(lose)
      let renewalTimer: Timers.Timer | undefined
      if (Option.isSome(lease.renew) && Option.isSome(lease.duration)) {
        const renew = lease.renew.value
        const interval = Duration.toMillis(renewalInterval(lease.duration.value))
        const renewal: Effect.Effect<void> = Effect.suspend(() =>
          held
            ? renew.pipe(Effect.match({
              onFailure: lose,
              onSuccess: () => {
                if (held) renewalTimer = timers.after(interval, renewal)
              },
            }))
            : Effect.void
        )
        renewalTimer = timers.after(interval, renewal)
      }
      return () => {
        held = false
        stopWatching()
        renewalTimer?.cancel()
      }
    }
    return LeaseRenewal.of({
      holdUnsafe,
      keep: (lease) =>
        Effect.flatMap(Deferred.make<LeaseLost>(), (lost) =>
          Effect.acquireUseRelease(
            Effect.sync(() =>
              holdUnsafe(lease, (why) => Deferred.doneUnsafe(lost, Effect.succeed(why)))
            ),
            () => Deferred.await(lost),
            (release) => Effect.sync(release),
          )),
    })
  },
)

/**
 * The renewal service. Scoped: its timer fiber lives as long as the layer, so build it where
 * the engine lives (`Layer.build` in the worker's scope), not in a passing `Effect.provide`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<LeaseRenewal> = Layer.effect(LeaseRenewal, make)
