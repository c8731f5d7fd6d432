/**
 * The worker program: each concern's layer — the delivery engine, the progress throttle, the
 * lease renewal and the drain, over a transport and settings — composed in one place, and the
 * running worker made of it. `Worker.serve`, `Worker.layer`, `Worker.run` (through `Lifecycle`)
 * and the test harness all use this one composition; a test replaces a concern's layer through
 * {@link Concerns}.
 *
 * @since 0.1.0
 */
import type * as Scope from "effect/Scope"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as SubscriptionRef from "effect/SubscriptionRef"
import type * as Concurrency from "./Concurrency.ts"
import * as DeliveryEngine from "./DeliveryEngine.ts"
import * as Drain from "./Drain.ts"
import type { DeliveryHandle } from "./internal/delivery/take.ts"
import * as Hooks from "./internal/lifecycle/hooks.ts"
import * as LeaseRenewal from "./LeaseRenewal.ts"
import * as ProgressThrottle from "./ProgressThrottle.ts"
import type { Settings } from "./Settings.ts"
import { Transport } from "./Transport.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"
import type { Hook, InstanceControls, Worker } from "./WorkerDefinition.ts"
import {
  IdleHookError,
  type MissingServiceError,
  ServicesError,
  type TransportError,
} from "./WorkerError.ts"

/**
 * A running worker.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunningWorker extends InstanceControls {
  /**
   * Stops intake and drains within `grace` (default `WORKER_SHUTDOWN_GRACE_S`): the tasks still
   * in hand then are interrupted and requeued; `skipGrace` ends the grace early (a second
   * signal). Safe to call from a finalizer.
   */
  readonly drain: (options?: {
    readonly grace?: Duration.Input
    readonly skipGrace?: Effect.Effect<void>
  }) => Effect.Effect<Drain.DrainReport>
  /** Deliveries in hand. */
  readonly inFlight: Effect.Effect<number>
  /**
   * Completes when intake has stopped and every delivery is settled; fails if the transport
   * does, the `onIdle` hook, or a handler asks for a service the worker was not given.
   */
  readonly await: Effect.Effect<void, TransportError | IdleHookError | MissingServiceError>
  /**
   * Changes the number of tasks run at once without cancelling any: growing grants capacity at
   * once, shrinking starts no task until enough running ones settle, `0` pauses intake. On
   * RabbitMQ this is the prefetch too.
   */
  readonly setConcurrency: (n: number) => Effect.Effect<void, Concurrency.ConcurrencyError>
  /** The number of tasks run at once now. */
  readonly concurrency: Effect.Effect<number>
  /** Asks the worker to stop: whoever runs it drains it (`Worker.run` exits 0). */
  readonly stop: Effect.Effect<void>
  /** Completes when {@link RunningWorker.stop} has been called. */
  readonly stopRequested: Effect.Effect<void>
}

/**
 * The concerns a program may be given other layers of (a test's throttle, say); by default the
 * SDK's own.
 *
 * @since 0.1.0
 * @category models
 */
export interface Concerns {
  readonly throttle?:
    | Layer.Layer<ProgressThrottle.ProgressThrottle, never, Settings | Transport>
    | undefined
  readonly renewal?: Layer.Layer<LeaseRenewal.LeaseRenewal> | undefined
}

/**
 * The program of `worker`: its engine and drain, over the transport and settings in context.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  concerns: Concerns = {},
): Layer.Layer<
  DeliveryEngine.DeliveryEngine | DeliveryHandle | Drain.Drain,
  never,
  Settings | Transport | R
> =>
  // Fresh: Effect 4 shares a layer value across the graphs built with one memo map, and two
  // workers of one app must not share an engine, a drain or a throttle.
  Layer.fresh(
    Drain.layer.pipe(
      Layer.provideMerge(DeliveryEngine.layer(worker)),
      Layer.provide(
        Layer.merge(
          concerns.throttle ?? ProgressThrottle.layer,
          concerns.renewal ?? LeaseRenewal.layer,
        ),
      ),
    ),
  )

/**
 * The services of `worker`'s definition (its `layer`) for what runs its handler and hooks, or
 * nothing when it has none. What it provides is untyped here: the worker's type has already
 * left it out of its requirements.
 *
 * @since 0.2.0
 * @category layers
 */
export const layerServices = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Layer.Layer<never, ServicesError> =>
  worker.layer === undefined ? Layer.empty : Layer.catchCause(
    worker.layer,
    (cause) => Layer.effectDiscard(Effect.fail(new ServicesError({ cause: Cause.squash(cause) }))),
  )

/** The quiet the `onIdle` hook waits for, and how often it looks. */
const IDLE_QUIET = Duration.seconds(1)
const IDLE_POLL = Duration.millis(250)

/**
 * Runs `hook` once, when no delivery has been in hand and the input queue has had no ready
 * message for {@link IDLE_QUIET} without a break, outside a drain. `taken` counts the deliveries
 * taken so far: one that came and went between two polls breaks the quiet too.
 */
const watchIdle = <R>(
  hook: Hook<R>,
  inFlight: Effect.Effect<number>,
  transport: Transport["Service"],
  draining: () => boolean,
  taken: () => number,
): Effect.Effect<void, IdleHookError, R> =>
  Effect.gen(function* () {
    let quietSince: number | undefined
    let seen = taken()
    const quietLongEnough = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const ready = transport.readyCount === undefined
        ? 0
        : yield* Effect.orElseSucceed(transport.readyCount, () => -1)
      const touched = seen !== taken()
      seen = taken()
      const quiet = !draining() && (yield* inFlight) === 0 && ready === 0 &&
        (yield* SubscriptionRef.get(transport.status)) === "connected"
      // A delivery taken since the last poll, and settled: the quiet begins now at the latest.
      if (!quiet) quietSince = undefined
      else if (touched) quietSince = now
      else quietSince ??= now
      return quietSince !== undefined && now - quietSince >= Duration.toMillis(IDLE_QUIET)
    })
    yield* quietLongEnough.pipe(
      Effect.repeat({ schedule: Schedule.spaced(IDLE_POLL), until: (quiet) => quiet }),
    )
    if (draining()) return
    yield* Hooks.toEffect(hook).pipe(Effect.mapError((cause) => new IdleHookError({ cause })))
  })

/**
 * Consumes in the current scope and returns the running worker, its definition's services
 * (`layer`) built in the scope first. Closing the scope interrupts whatever is in hand (each such
 * task is requeued); call `drain` first for a graceful stop, as `Worker.serve` does.
 *
 * @since 0.2.0
 * @category running
 */
export const consume = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  concerns?: Concerns,
): Effect.Effect<RunningWorker, ServicesError, Scope.Scope | Settings | Transport | R> =>
  Effect.gen(function* () {
    const transport = yield* Transport
    // With an onIdle hook, the deliveries taken are counted for it.
    let taken = 0
    const program = yield* Layer.build(
      layer(worker, concerns).pipe(Layer.provideMerge(layerServices(worker))),
    ).pipe(
      Effect.provideService(
        Transport,
        worker.onIdle === undefined ? transport : {
          ...transport,
          take: Effect.map(transport.take, (delivery) => {
            taken++
            return delivery
          }),
        },
      ),
    )
    // Every series a scraper expects, at 0, before the first task (the bare engine included).
    yield* WorkerMetrics.register
    yield* Effect.forkScoped(WorkerMetrics.followConnection(transport.status))
    const engine = Context.get(program, DeliveryEngine.DeliveryEngine)
    const drain = Context.get(program, Drain.Drain)
    const consuming = yield* Effect.forkScoped(
      engine.consume.pipe(
        // A defect is said here, with its stack; a failure (the transport's, a service missing) is
        // data that whoever runs the worker reports, once (`running.await`).
        Effect.tapCause((cause) =>
          Cause.hasDies(cause)
            ? Effect.logError("The worker stopped consuming", cause)
            : Effect.void
        ),
      ),
    )
    let draining = false
    const idle = worker.onIdle === undefined ? Effect.never : yield* Effect.forkScoped(
      watchIdle(worker.onIdle, engine.inFlight, transport, () => draining, () => taken),
    ).pipe(Effect.map(Fiber.join))
    const stopped = yield* Deferred.make<void>()
    const running: RunningWorker = {
      drain: (options) =>
        Effect.suspend(() => {
          draining = true
          return drain.drain(options)
        }),
      inFlight: engine.inFlight,
      await: Effect.raceFirst(
        Fiber.join(consuming).pipe(Effect.andThen(engine.awaitDone)),
        Effect.andThen(idle, Effect.never),
      ),
      setConcurrency: engine.setConcurrency,
      concurrency: engine.concurrency,
      stop: Deferred.succeed(stopped, undefined).pipe(Effect.asVoid),
      stopRequested: Deferred.await(stopped),
    }
    worker.instances.add(running)
    yield* Effect.addFinalizer(() => Effect.sync(() => worker.instances.delete(running)))
    return running
  }).pipe(Effect.annotateLogs({ service: worker.name }))
