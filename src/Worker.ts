/**
 * A worker: a named handler with its input and output schemas and time limit, and the scoped
 * program that runs it on a {@link Transport}.
 *
 * @since 0.1.0
 */
import type { Scope } from "effect"
import { Duration, Effect, Fiber, Layer, Option, Schema } from "effect"
import * as DeliveryEngine from "./DeliveryEngine.ts"
import * as Drain from "./Drain.ts"
import * as LeaseRenewal from "./LeaseRenewal.ts"
import * as ProgressThrottle from "./ProgressThrottle.ts"
import type { Settings } from "./Settings.ts"
import type { TaskContext } from "./TaskContext.ts"
import type { Transport } from "./Transport.ts"
import { type TransportError, WorkerDefinitionError } from "./WorkerError.ts"

/**
 * A handler: an Effect (failing with `FatalError` or `RetryableError`, and requiring `R`), or
 * an `async` function (throwing them). Anything else it fails or throws with is an
 * `INTERNAL_ERROR`.
 *
 * @since 0.1.0
 * @category models
 */
export type Handler<A, O, R> = (
  input: A,
  ctx: TaskContext,
) => Effect.Effect<O, unknown, R> | PromiseLike<O>

/**
 * What a worker author writes.
 *
 * @since 0.1.0
 * @category models
 */
export interface WorkerDefinition<A, I, O, R> {
  /** The service's name: the queues default to `<name>_queue_in` and `<name>_queue_out`. */
  readonly name: string
  /** Decodes `data.body`; a body it rejects is concluded `INVALID_INPUT`. */
  readonly input: Schema.Schema<A, I>
  /** Encodes the handler's result into `success.response`, which must be a JSON object. */
  readonly output: Schema.Schema<O, any>
  /** The handler's time limit (`WORKER_TASK_TIMEOUT_S` overrides it). */
  readonly timeout: Duration.DurationInput
  /** Tasks run at once by default (`WORKER_CONCURRENCY` overrides it). */
  readonly concurrency?: number | undefined
  readonly handler: Handler<A, O, R>
}

/**
 * A validated worker definition.
 *
 * @since 0.1.0
 * @category models
 */
export interface Worker<A, I, O, R> {
  readonly _tag: "Worker"
  readonly name: string
  readonly input: Schema.Schema<A, I>
  readonly output: Schema.Schema<O, any>
  readonly timeout: Duration.Duration
  readonly concurrency: number | undefined
  readonly handler: Handler<A, O, R>
}

/**
 * Any worker, whatever its types.
 *
 * @since 0.1.0
 * @category models
 */
export type Any = Worker<any, any, any, any>

/**
 * The services a worker's handler requires.
 *
 * @since 0.1.0
 * @category models
 */
export type Requirements<W> = W extends Worker<any, any, any, infer R> ? R : never

const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/

/**
 * Checks a definition, returning the worker or why it cannot run.
 *
 * @since 0.1.0
 * @category constructors
 */
export const validate = <A, I, O, R>(
  definition: WorkerDefinition<A, I, O, R>,
): Effect.Effect<Worker<A, I, O, R>, WorkerDefinitionError> =>
  Effect.suspend(() => {
    const d = definition as Partial<WorkerDefinition<A, I, O, R>> | null | undefined
    const problem = (message: string) => Effect.fail(new WorkerDefinitionError({ message }))
    if (typeof d !== "object" || d === null) {
      return problem("The worker definition must be an object.")
    }
    if (typeof d.name !== "string" || !NAME_PATTERN.test(d.name)) {
      return problem(
        "The worker needs a name of letters, digits, '.', '_' or '-' (at most 200 characters), such as \"count-words\".",
      )
    }
    if (!Schema.isSchema(d.input)) return problem(`The worker "${d.name}" needs an input Schema.`)
    if (!Schema.isSchema(d.output)) return problem(`The worker "${d.name}" needs an output Schema.`)
    if (typeof d.handler !== "function") {
      return problem(`The worker "${d.name}" needs a handler function.`)
    }
    const timeout = Duration.decodeUnknown(d.timeout)
    if (
      Option.isNone(timeout) || !Duration.isFinite(timeout.value) ||
      Duration.toMillis(timeout.value) <= 0
    ) {
      return problem(
        `The worker "${d.name}" needs a finite, positive timeout, such as "30 seconds".`,
      )
    }
    if (
      d.concurrency !== undefined &&
      (!Number.isInteger(d.concurrency) || d.concurrency < 1 || d.concurrency > 2 ** 31 - 1)
    ) {
      return problem(`The worker "${d.name}" has a concurrency that is not a positive integer.`)
    }
    return Effect.succeed({
      _tag: "Worker" as const,
      name: d.name,
      input: d.input,
      output: d.output,
      timeout: timeout.value,
      concurrency: d.concurrency,
      handler: d.handler,
    })
  })

/**
 * Defines a worker. Throws {@link WorkerDefinitionError} (one clear sentence) when the
 * definition cannot run, so that a bad module fails as it loads.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <A, I, O, R = never>(
  definition: WorkerDefinition<A, I, O, R>,
): Worker<A, I, O, R> =>
  Effect.runSync(Effect.either(validate(definition))).pipe((result) => {
    if (result._tag === "Left") throw result.left
    return result.right
  })

/**
 * A running worker.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunningWorker {
  /** Stops intake and drains within the grace period; see {@link Drain.Drain}. */
  readonly drain: Drain.Drain["Type"]["drain"]
  /** Deliveries in hand. */
  readonly inFlight: Effect.Effect<number>
  /** Completes when intake has stopped and every delivery is settled; fails if the transport does. */
  readonly await: Effect.Effect<void, TransportError>
}

/**
 * The engine's own services (throttle, lease renewal), over a transport and settings.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerServices: Layer.Layer<
  ProgressThrottle.ProgressThrottle | LeaseRenewal.LeaseRenewal,
  never,
  Settings | Transport
> = Layer.merge(ProgressThrottle.layer, LeaseRenewal.layer)

/**
 * Starts consuming in the current scope and returns the running worker. Closing the scope
 * interrupts whatever is in hand (each such task is requeued); call `drain` first for a
 * graceful stop, as {@link serve} does.
 *
 * @since 0.1.0
 * @category running
 */
export const start = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Effect.Effect<RunningWorker, never, Scope.Scope | Settings | Transport | R> =>
  Effect.gen(function* () {
    const context = yield* Layer.build(layerServices)
    const engine = yield* DeliveryEngine.make(worker).pipe(Effect.provide(context))
    const drain = yield* Drain.make.pipe(
      Effect.provideService(DeliveryEngine.DeliveryEngine, engine),
    )
    const consuming = yield* Effect.forkScoped(
      engine.run.pipe(
        Effect.tapErrorCause((cause) => Effect.logError("The worker stopped consuming", cause)),
      ),
    )
    return {
      drain: drain.drain,
      inFlight: engine.inFlight,
      await: Fiber.join(consuming).pipe(Effect.zipRight(engine.awaitIdle)),
    }
  }).pipe(Effect.annotateLogs({ service: worker.name }))

/**
 * Runs the worker until interrupted, then drains it within the grace period. Never exits the
 * process: it is an Effect to run or compose.
 *
 * @since 0.1.0
 * @category running
 */
export const serve = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Effect.Effect<void, TransportError, Settings | Transport | R> =>
  Effect.scoped(Effect.gen(function* () {
    const running = yield* start(worker)
    yield* Effect.addFinalizer(() => running.drain())
    return yield* running.await
  }))

/**
 * The worker as a scoped layer inside a larger app: it consumes while the layer is alive and
 * drains when it is released.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Layer.Layer<never, never, Settings | Transport | R> =>
  Layer.scopedDiscard(Effect.gen(function* () {
    const running = yield* start(worker)
    yield* Effect.addFinalizer(() => running.drain())
  }))
