/**
 * One delivery run to its settlement outside the pool, on a fiber of its own: how the test
 * harness runs each submission (`testing.ts`), taking each message itself.
 */
import { Context, Deferred, Effect, Exit, Fiber, FiberRef } from "effect"
import type * as Decision from "../../Decision.ts"
import type { Delivery } from "../../Transport.ts"
import type { EngineContext } from "./context.ts"
import { deliver } from "./deliver.ts"

/**
 * Runs one delivery to its settlement; never fails.
 *
 * @since 0.1.0
 */
export class DeliveryHandle extends Context.Tag("@async-task/worker/internal/DeliveryHandle")<
  DeliveryHandle,
  { readonly handle: (delivery: Delivery) => Effect.Effect<Decision.Decision> }
>() {}

/** The handle of the engine `ctx`. */
export const make = <A, O, R>(ctx: EngineContext<A, O, R>): DeliveryHandle["Type"] => ({
  handle: (delivery) =>
    Effect.gen(function* () {
      const decided = yield* Deferred.make<Decision.Decision>()
      // A stopped handler leaves its fiber interrupted: the decision is kept as it is made, and
      // returned then. A daemon, so that returning does not wait for the fiber, which may still
      // hold its slot for a runaway handler; interrupting the caller interrupts it.
      const fiber = yield* Effect.forkDaemon(
        Effect.uninterruptibleMask((restore) =>
          Effect.withFiberRuntime<Decision.Decision>((fiber) =>
            Effect.gen(() =>
              deliver(
                ctx,
                delivery,
                { fiber, stopped: false },
                restore,
                (d) => Deferred.unsafeDone(decided, Effect.succeed(d)),
              )
            )
          )
        ).pipe(Effect.locally(FiberRef.currentLogAnnotations, ctx.baseAnnotations)),
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
