/**
 * The bounded shutdown of a worker's intake: stop consuming, let in-flight tasks finish within
 * the grace window, then interrupt and requeue the rest (`shutdown_requeued`).
 *
 * @since 0.1.0
 */
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { DeliveryEngine } from "./DeliveryEngine.ts"
import { Settings } from "./Settings.ts"
import { Transport } from "./Transport.ts"

/**
 * How a drain ended.
 *
 * @since 0.1.0
 * @category models
 */
export interface DrainReport {
  /** Tasks in hand when the drain began. */
  readonly inFlightAtStart: number
  /** Tasks interrupted and requeued at the end of the grace window. */
  readonly requeued: number
}

/**
 * The most the requeues after the grace window may take.
 *
 * @since 0.1.0
 * @category constants
 */
export const REQUEUE_BOUND: Duration.Duration = Duration.seconds(5)

interface DrainShape {
  /**
   * Drains within `grace` (default `WORKER_SHUTDOWN_GRACE_S`); `skipGrace` ends the grace
   * window early (a second signal). Safe to call from a finalizer: the waits are
   * interruptible regions, so their time limits fire.
   */
  readonly drain: (options?: {
    readonly grace?: Duration.Input
    readonly skipGrace?: Effect.Effect<void>
  }) => Effect.Effect<DrainReport>
}

const DrainService: Context.ServiceClass<Drain, "@async-task/worker/Drain", DrainShape> = Context
  .Service<Drain, DrainShape>()("@async-task/worker/Drain")

/**
 * The drain of one worker.
 *
 * @since 0.1.0
 * @category services
 */
export class Drain extends DrainService {}

/**
 * The drain over the engine and transport in context.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: Effect.Effect<Drain["Service"], never, DeliveryEngine | Transport | Settings> =
  Effect.gen(
    function* () {
      const engine = yield* DeliveryEngine
      const transport = yield* Transport
      const settings = yield* Settings
      return Drain.of({
        drain: (options) =>
          Effect.gen(function* () {
            yield* transport.stopIntake
            const inFlightAtStart = yield* engine.inFlight
            const grace = options?.grace ?? settings.shutdownGrace
            const idle = options?.skipGrace === undefined
              ? engine.awaitDone
              : Effect.raceFirst(engine.awaitDone, options.skipGrace)
            yield* idle.pipe(Effect.interruptible, Effect.timeoutOption(grace))
            const requeued = yield* engine.inFlight
            if (requeued > 0) {
              yield* Effect.logWarning(
                `${requeued} task(s) did not finish within the grace period: requeueing them`,
              )
              yield* engine.interruptAll.pipe(
                Effect.interruptible,
                Effect.timeoutOption(REQUEUE_BOUND),
              )
            }
            return { inFlightAtStart, requeued }
          }).pipe(Effect.withLogSpan("drain")),
      })
    },
  )

/**
 * The drain as a layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<Drain, never, DeliveryEngine | Transport | Settings> = Layer.effect(
  Drain,
  make,
)
