/**
 * The engine of one worker: consumes its transport's deliveries, each on one of its fibers, and
 * takes every one through its life, exactly as the spec numbers it — decode, attempt, delivery
 * limit, `started`, the handler under its time limit with throttled progress and a kept lease,
 * then the conclusion (terminal message confirmed, **then** ack) or a requeue — to exactly one
 * {@link Decision}. The work is in `internal/delivery/`, one file a stage of a delivery's path:
 * taken (`take.ts`), carried through its life (`deliver.ts`), decided (`decide.ts`: opened, its
 * verdict, its plan), run (`run.ts`) and settled (`settle.ts`); `docs/architecture.md` follows a
 * delivery through them.
 *
 * @since 0.1.0
 */
import { pid } from "node:process"
import * as ThreadPool from "./internal/thread/pool.ts"
import { LeaseExpiries } from "./internal/delivery/expiries.ts"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Random from "effect/Random"
import * as References from "effect/References"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import * as Concurrency from "./Concurrency.ts"
import { EventLoop } from "./EventLoop.ts"
import { EngineClosing, type EngineContext } from "./internal/delivery/context.ts"
import { tasksInHand } from "./internal/delivery/deliver.ts"
import * as Take from "./internal/delivery/take.ts"
import { makeTracing } from "./internal/delivery/tracing.ts"
import { backoff as backoffOf } from "./internal/delivery/settle.ts"
import { OutputGate } from "./internal/delivery/outputGate.ts"
import * as Timers from "./internal/delivery/timers.ts"
import { LeaseRenewal } from "./LeaseRenewal.ts"
import { ProgressThrottle } from "./ProgressThrottle.ts"
import { LEASE_MARGIN, Settings, type WorkerSettings } from "./Settings.ts"
import * as TaskContext from "./TaskContext.ts"
import { Transport } from "./Transport.ts"
import type { Worker } from "./WorkerDefinition.ts"
import type { MissingServiceError, TransportError } from "./WorkerError.ts"

interface DeliveryEngineShape {
  /** Consumes the transport's deliveries on the engine's fibers until intake stops. */
  readonly consume: Effect.Effect<void, TransportError | MissingServiceError>
  /** Deliveries in hand. */
  readonly inFlight: Effect.Effect<number>
  /** Completes once intake has stopped and every delivery taken is settled. */
  readonly awaitDone: Effect.Effect<void>
  /** Interrupts every delivery in hand: each requeues itself (`shutdown_requeued`). */
  readonly interruptAll: Effect.Effect<void>
  /**
   * Sets the number of tasks run at once, and the prefetch: growing grants capacity at once;
   * shrinking starts no task until enough running ones settle; `0` pauses intake.
   */
  readonly setConcurrency: (n: number) => Effect.Effect<void, Concurrency.ConcurrencyError>
  /** The number of tasks run at once now. */
  readonly concurrency: Effect.Effect<number>
}

const DeliveryEngineService: Context.ServiceClass<
  DeliveryEngine,
  "@async-task/worker/DeliveryEngine",
  DeliveryEngineShape
> = Context.Service<DeliveryEngine, DeliveryEngineShape>()("@async-task/worker/DeliveryEngine")

/**
 * The engine of one worker.
 *
 * @since 0.1.0
 * @category services
 */
export class DeliveryEngine extends DeliveryEngineService {}

/**
 * The backoff before the requeue of `attempt`: exponential from `base`, capped at `max`, with
 * equal jitter (between half and all of it); or the error's own delay (seconds, or a
 * `Duration.Input`), capped at `max`. An own delay that names no duration, or a negative or NaN
 * one, is an ordinary retry: the computed backoff, and a warning.
 *
 * @since 0.1.0
 * @category constructors
 */
export const backoff: (
  settings: Pick<WorkerSettings, "retryBackoffBase" | "retryBackoffMax">,
  attempt: number,
  delay: unknown,
) => Effect.Effect<Duration.Duration> = backoffOf

/**
 * The handler's services, but not this engine's Scope: a handler that requires a Scope gets its
 * task's own (closed when the task ends), or its resources would live as long as the worker. A
 * threaded handler's pool of threads is there too, for as long as the engine.
 */
const handlerContextOf = <A, I, O, R>(worker: Worker<A, I, O, R>, services: Context.Context<R>) =>
  Effect.gen(function* () {
    const own = Context.omit(Scope.Scope)(services) as Context.Context<R>
    if (worker.thread === undefined) return own
    const pool = yield* Effect.orDie(ThreadPool.make(worker.thread))
    return Context.add(own, ThreadPool.CurrentThreadPool, pool)
  })

/** The engine's context: the worker, its services from the context, its shared state. */
const makeContext = <A, I, O, R>(worker: Worker<A, I, O, R>) =>
  Effect.gen(function* () {
    const settings = yield* Settings
    const services = yield* Effect.context<R>()
    const context = services as Context.Context<never>
    const clock = yield* Clock.Clock
    const ctx: EngineContext<A, O, R> = {
      worker,
      settings,
      transport: yield* Transport,
      throttle: yield* ProgressThrottle,
      renewal: yield* LeaseRenewal,
      timers: yield* Timers.make,
      clock,
      random: yield* Random.Random,
      context,
      limiter: yield* Concurrency.makeLimiter(worker.policy, settings.concurrency, worker.weight),
      gate: new OutputGate(),
      closing: new EngineClosing(),
      halted: Deferred.makeUnsafe<never, MissingServiceError>(),
      handlerContext: yield* handlerContextOf(worker, services),
      decodeInput: Schema.decodeUnknownResult(worker.input),
      encodeOutput: Schema.encodeUnknownResult(worker.output),
      tracing: makeTracing({
        tracer: yield* Effect.tracer,
        enabled: yield* References.TracerEnabled,
        clock,
        services: context,
        inQueue: settings.inQueue,
        outQueue: settings.outQueue,
      }),
      loggerFor: (info) => TaskContext.makeLogger({ ...info, service: worker.name }, context),
      baseAnnotations: { service: worker.name },
      workerId: `${settings.hostname}:${pid}`,
      timeoutMillis: Duration.toMillis(settings.taskTimeout),
      holdMillis: Duration.toMillis(settings.consumerTimeout) - Duration.toMillis(LEASE_MARGIN) -
        Duration.toMillis(settings.retryBackoffMax),
      leaseMillis: Duration.toMillis(settings.consumerTimeout),
      expiries: new LeaseExpiries(),
      loop: yield* EventLoop,
      state: { inFlight: 0, inHand: new Set(), warnedClassic: false },
    }
    return ctx
  })

/**
 * Makes the engine of `worker`, with the handle the test harness runs single deliveries with:
 * its handler's requirements `R` are taken from the context now.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Effect.Effect<
  Context.Context<DeliveryEngine | Take.DeliveryHandle>,
  never,
  Scope.Scope | Settings | Transport | ProgressThrottle | LeaseRenewal | R
> =>
  Effect.gen(function* () {
    const ctx = yield* makeContext(worker)
    const fibers = yield* Take.make(ctx)
    yield* ctx.loop.watchTasks(() => tasksInHand(ctx.state.inHand))
    ctx.limiter.onChange((target) => Effect.andThen(ctx.transport.setCapacity(target), fibers.grow))
    const engine = DeliveryEngine.of({
      consume: fibers.consume,
      inFlight: Effect.sync(() => ctx.state.inFlight),
      awaitDone: fibers.awaitEmpty,
      setConcurrency: (n) => Effect.flatMap(Concurrency.validate(n), ctx.limiter.setTarget),
      concurrency: Effect.sync(() => ctx.limiter.target()),
      interruptAll: fibers.interruptAll,
    })
    return Context.make(DeliveryEngine, engine).pipe(
      Context.add(Take.DeliveryHandle, Take.makeHandle(ctx)),
    )
  })

/**
 * The engine as a layer over the worker's transport, settings, progress throttle and lease
 * renewal (`WorkerProgram.layer` composes them).
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Layer.Layer<
  DeliveryEngine | Take.DeliveryHandle,
  never,
  Settings | Transport | ProgressThrottle | LeaseRenewal | R
> => Layer.effectContext(make(worker))
