/**
 * One delivery run to its settlement outside the engine's fibers, on a fiber of its own: how the test
 * harness runs each submission (`testing.ts`), taking each message itself.
 */
import { Context, Deferred, Effect, Exit, Fiber, References } from "effect"
import type * as Decision from "../../Decision.ts"
import type { Delivery } from "../../Transport.ts"
import type { EngineContext } from "./context.ts"
import { deliver } from "./deliver.ts"
import { deliveryBase } from "./fiberContext.ts"

interface DeliveryHandleShape {
  readonly handle: (delivery: Delivery) => Effect.Effect<Decision.Decision>
}

const DeliveryHandleService: Context.ServiceClass<
  DeliveryHandle,
  "@async-task/worker/internal/DeliveryHandle",
  DeliveryHandleShape
> = Context.Service<DeliveryHandle, DeliveryHandleShape>()(
  "@async-task/worker/internal/DeliveryHandle",
)

/**
 * Runs one delivery to its settlement; never fails.
 *
 * @since 0.1.0
 * @category services
 */
export class DeliveryHandle extends DeliveryHandleService {}

/** The handle of the engine `ctx`. */
export const make = <A, O, R>(ctx: EngineContext<A, O, R>): DeliveryHandle["Service"] => ({
  handle: (delivery) =>
    Effect.gen(function* () {
      const decided = yield* Deferred.make<Decision.Decision>()
      // A stopped handler leaves its fiber interrupted: the decision is kept as it is made, and
      // returned then. Detached, so that returning does not wait for the fiber, which may still
      // hold its slot for a runaway handler; interrupting the caller interrupts it.
      const fiber = yield* Effect.forkDetach(
        Effect.uninterruptibleMask((restore) =>
          Effect.withFiber<Decision.Decision>((fiber) =>
            Effect.gen(() =>
              deliver(
                ctx,
                delivery,
                {
                  fiber,
                  base: deliveryBase(fiber.context, ctx.handlerContext),
                  stopped: false,
                },
                restore,
                (d) => Deferred.doneUnsafe(decided, Effect.succeed(d)),
              )
            )
          )
        ).pipe(Effect.provideService(References.CurrentLogAnnotations, ctx.baseAnnotations)),
      )
      return yield* Effect.raceFirst(
        Deferred.await(decided),
        Effect.flatMap(Fiber.await(fiber), (exit) =>
          Exit.isSuccess(exit)
            ? Effect.succeed(exit.value)
            : Effect.orDie(Effect.failCause(exit.cause))),
      ).pipe(Effect.onInterrupt(() =>
        Fiber.interrupt(fiber)
      ))
    }),
})
