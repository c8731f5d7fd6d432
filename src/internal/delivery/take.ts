/**
 * Where deliveries are taken, the first step of each: by the engine's fibers, long-lived, each
 * taking deliveries from the transport and carrying each one's whole life (`deliver.ts`) until
 * intake stops; or one at a time, handed in, on a fiber of its own ({@link DeliveryHandle}: how
 * the test harness runs each submission, taking each message itself). The fibers grow in number
 * as deliveries come, up to the limiter's target, rather than one fiber per slot of a target
 * that may be 2^31 − 1; a fiber whose handler the engine stopped is replaced, and one above a
 * lowered target retires once its delivery is settled.
 */
import type * as Scope from "effect/Scope"
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as References from "effect/References"
import type * as Decision from "../../Decision.ts"
import type { Delivery } from "../../Transport.ts"
import type { MissingServiceError, TransportError } from "../../WorkerError.ts"
import type { DeliveryFiber, EngineContext, Restore } from "./context.ts"
import { deliver } from "./deliver.ts"
import { deliveryBase } from "./fiberContext.ts"

// ---------------------------------------------------------------------------------------------
// The engine's fibers

/** The engine's fibers, running. */
export interface Fibers {
  /**
   * Starts the first fiber, and completes when every fiber has ended (intake stopped); fails
   * once a handler asked for a service the worker was not given.
   */
  readonly consume: Effect.Effect<void, TransportError | MissingServiceError>
  /** Completes when no engine fiber is left. */
  readonly awaitEmpty: Effect.Effect<void>
  /** Interrupts every fiber: each requeues what it holds. */
  readonly interruptAll: Effect.Effect<void>
  /** One more fiber if none waits for a delivery and there are fewer than the target. */
  readonly grow: Effect.Effect<void>
}

/** What the engine's fibers share: how many there are, and how many wait for a delivery. */
interface Crew {
  size: number
  idle: number
  /** The first failure of an engine fiber: consuming ends with it. */
  failure: Cause.Cause<TransportError> | undefined
}

/** An engine fiber's delivery fiber, and whether it is waiting for a delivery now. */
interface EngineFiber extends DeliveryFiber {
  waiting: boolean
}

/** Whether one more fiber should wait for deliveries: none waits, and the target allows one. */
const mayGrow = <A, O, R>(ctx: EngineContext<A, O, R>, crew: Crew): boolean =>
  !ctx.closing.closed && crew.idle === 0 && crew.size < Math.max(1, ctx.limiter.target())

/**
 * An engine fiber's life: a delivery taken, carried to its end, the next one taken, until intake
 * stops, its handler is stopped (the fiber is replaced) or the target shrinks below the fibers.
 * One generator for every fiber, made once: a `function*` made per fiber would make its own
 * prototype and shapes, memory each task in flight holds (`bench/heap.ts`).
 */
function* takeLoop<A, O, R>(
  ctx: EngineContext<A, O, R>,
  crew: Crew,
  ef: EngineFiber,
  restore: Restore,
  spawn: Effect.Effect<void>,
): Generator<Effect.Effect<any, TransportError>, void, any> {
  for (;;) {
    ef.waiting = true
    crew.idle++
    const next = yield* restore(ctx.transport.take)
    ef.waiting = false
    crew.idle--
    if (Option.isNone(next)) return
    // One fiber always waits for the next delivery.
    if (mayGrow(ctx, crew)) yield* spawn
    yield* deliver(ctx, next.value, ef, restore)
    // Stopped (its handler interrupted), this fiber cannot wait any more: replaced.
    if (ef.stopped) return
    if (crew.size > Math.max(1, ctx.limiter.target())) return
  }
}

/** Makes the fibers of the engine `ctx`, living in the current scope. */
export const make = <A, O, R>(
  ctx: EngineContext<A, O, R>,
): Effect.Effect<Fibers, never, Scope.Scope> =>
  Effect.gen(function* () {
    const fibers = yield* FiberSet.make<void, TransportError>()
    // Every engine fiber runs with the engine's context: what their deliveries start from is made
    // once.
    const context = yield* Effect.context<never>()
    const base = deliveryBase(context, ctx.handlerContext)
    const crew: Crew = { size: 0, idle: 0, failure: undefined }

    /**
     * An engine fiber: uninterruptible but while it waits for a delivery (and where `deliver`
     * restores). Detached, with the engine's context and interruptible, whoever spawns it: a
     * engine fiber growing the fibers from its uninterruptible task, or `worker.setConcurrency` from
     * a Promise. Started from the spawner's scheduler, as a fork is, rather than here and now
     * inside the spawning task: a fiber run from a context (`FiberSet.runtime`) starts at once
     * in Effect 4, and a yield of its own first would give each engine fiber a dispatcher of its
     * own, memory `bench/engine.ts` counts per task in flight. Its end, in one step: counted
     * out, a failure kept (when the last engine fiber fails, `awaitEmpty` may win `consume`'s
     * race first), and a stopped fiber replaced.
     */
    const spawn: Effect.Effect<void> = Effect.suspend(() => {
      const loop = Effect.uninterruptibleMask((restore) =>
        Effect.withFiber<void, TransportError>((fiber) => {
          const ef: EngineFiber = { fiber, base, stopped: false, waiting: false }
          fiber.setContext(context)
          return Effect.onExit(
            Effect.gen(() => takeLoop(ctx, crew, ef, restore, spawn)),
            (exit) => {
              crew.size--
              if (ef.waiting) crew.idle--
              if (exit._tag === "Failure" && !Cause.hasInterruptsOnly(exit.cause)) {
                crew.failure ??= exit.cause
              }
              return ef.stopped && !ctx.closing.closed ? spawn : Effect.void
            },
          )
        })
      )
      crew.size++
      return Effect.flatMap(Effect.forkDetach(loop), (fiber) => FiberSet.add(fibers, fiber))
    })

    const grow = Effect.suspend(() => (mayGrow(ctx, crew) ? spawn : Effect.void))
    const awaitEmpty = Effect.suspend(() =>
      FiberSet.size(fibers).pipe(
        Effect.flatMap((n) => (n === 0 ? Effect.void : FiberSet.awaitEmpty(fibers))),
      )
    )
    return {
      consume: Effect.gen(function* () {
        yield* grow
        yield* Effect.raceFirst(
          Effect.raceFirst(FiberSet.join(fibers), FiberSet.awaitEmpty(fibers)),
          Deferred.await(ctx.halted),
        )
        if (crew.failure !== undefined) return yield* Effect.failCause(crew.failure)
      }),
      awaitEmpty,
      interruptAll: Effect.suspend(() => {
        ctx.closing.close()
        return FiberSet.clear(fibers)
      }),
      grow,
    }
  })

// ---------------------------------------------------------------------------------------------
// One delivery handed in

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
export const makeHandle = <A, O, R>(ctx: EngineContext<A, O, R>): DeliveryHandle["Service"] => ({
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
