/**
 * A worker's definition: a named handler with its input and output schemas and time limit, its
 * concurrency, hooks and readiness probes, checked as it is made. A leaf: nothing here runs a
 * worker (`WorkerProgram` does, and `Lifecycle` as a process); the `Worker` module gathers both.
 *
 * @since 0.1.0
 */
import * as Cause from "effect/Cause"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Concurrency from "./Concurrency.ts"
import { kindOf } from "./internal/handlerResult.ts"
import * as Hooks from "./internal/lifecycle/hooks.ts"
import type { Hook } from "./internal/lifecycle/hooks.ts"
import { specOf, type ThreadSpec } from "./internal/thread/spec.ts"
import type { TaskContext } from "./TaskContext.ts"
import type * as Transient from "./Transient.ts"
import {
  type ConcurrencyError,
  type FatalError,
  type RetryableError,
  WorkerDefinitionError,
} from "./WorkerError.ts"

/**
 * A handler: an Effect (failing with `FatalError` or `RetryableError`, and requiring `R`), or
 * an `async` function (throwing them). Anything else it fails or throws with is an
 * `INTERNAL_ERROR`, unless the definition's `retryOn` says it is transient.
 *
 * @since 0.1.0
 * @category models
 */
export type Handler<A, O, R, E = unknown> = (
  input: A,
  ctx: TaskContext,
) => Effect.Effect<O, E, R> | PromiseLike<O>

/** The tags of the handler's own tagged errors: those the SDK does not already know. */
type DomainTags<E> = Exclude<
  Extract<E, { readonly _tag: string }>["_tag"],
  "FatalError" | "RetryableError"
>

/**
 * What each of a handler's own tagged errors comes to, in one place: a `FatalError` (conclude
 * with a code) or a `RetryableError` (retry with a policy). Given, it must name every tag the
 * handler's Effect fails with — the compiler says which one is missing; without it, those
 * errors conclude `INTERNAL_ERROR`. An `async` handler's rejections are mapped by their `_tag`
 * too, without the compiler's check.
 *
 * @since 0.1.0
 * @category models
 */
export type ErrorMapping<E> = {
  readonly [K in DomainTags<E>]: (
    error: Extract<E, { readonly _tag: K }>,
  ) => FatalError | RetryableError
}

/**
 * What a worker author writes.
 *
 * @since 0.1.0
 * @category models
 */
export interface WorkerDefinition<A, I, O, R, E = unknown, RL = never, RIn = never> {
  /** The service's name: the queues default to `<name>_queue_in` and `<name>_queue_out`. */
  readonly name: string
  /** Decodes `data.body`; a body it rejects is concluded `INVALID_INPUT`. */
  readonly input: Schema.Codec<A, I>
  /** Encodes the handler's result into `success.response`, which must be a JSON object. */
  readonly output: Schema.Codec<O, any>
  /** The handler's time limit (`WORKER_TASK_TIMEOUT_S` overrides it). */
  readonly timeout: Duration.Input
  /**
   * Tasks run at once: a number (`WORKER_CONCURRENCY` overrides it), `Concurrency.adaptive(…)`
   * or a `Concurrency.pool(…)` shared with other workers.
   */
  readonly concurrency?: Concurrency.Policy | undefined
  /** The slots of a pool one task takes (default 1). */
  readonly weight?: number | undefined
  /**
   * Called once when, after the worker started consuming, no delivery is in hand and the input
   * queue has had no ready message for a second (polled every 250 ms); never while a task runs
   * or during shutdown. A failure ends the worker with that failure.
   */
  readonly onIdle?: Hook<R> | undefined
  readonly handler: Handler<A, O, R, E>
  /** What the handler's own tagged errors come to; see {@link ErrorMapping}. */
  readonly errors?: ErrorMapping<E> | undefined
  /**
   * Which of the handler's ordinary errors are transient (see `Transient.Rule`): retried as a
   * `RetryableError` without a code would be. Given a list, the first rule that does not answer
   * `false` decides. Without it, every ordinary error concludes `INTERNAL_ERROR` at once.
   */
  readonly retryOn?: Transient.Rule | ReadonlyArray<Transient.Rule> | undefined
  /** Run in order before the worker consumes; a failure stops the process with exit 1. */
  readonly onStartup?: Hook<R> | ReadonlyArray<Hook<R>> | undefined
  /**
   * Run in order after the drain, before the broker connection closes; together they get
   * `WORKER_SHUTDOWN_HOOKS_TIMEOUT_S`, each what the ones before it left.
   */
  readonly onShutdown?: Hook<R> | ReadonlyArray<Hook<R>> | undefined
  /**
   * Named readiness probes: the worker is ready only while each succeeds within
   * `WORKER_PROBE_TIMEOUT_S`. `broker` and `draining` are reserved names.
   */
  readonly readiness?: Readonly<Record<string, Hook<R>>> | undefined
  /**
   * The services the handler and the hooks need (a database pool, a client), built once per life
   * of the worker, before the startup hooks, and released after the shutdown hooks: what they
   * provide is no longer the worker's requirement, so that `Worker.run`, the CLI and the one-file
   * build can run it. Services the context gives (an app's layers) are the alternative.
   */
  readonly layer?: Layer.Layer<RL, unknown, RIn> | undefined
}

export type { Hook } from "./internal/lifecycle/hooks.ts"

/**
 * A validated worker definition, requiring `R` of whoever runs it; its own `layer` provides `RL`
 * (since 0.3.0), which a test that replaces that layer must provide instead.
 *
 * @since 0.1.0
 * @category models
 */
export interface Worker<A, I, O, R, RL = never> {
  readonly _tag: "Worker"
  /** The services the definition's own `layer` provides: a type only, never set. */
  readonly "~services"?: ((services: RL) => void) | undefined
  readonly name: string
  readonly input: Schema.Codec<A, I>
  readonly output: Schema.Codec<O, any>
  readonly timeout: Duration.Duration
  /** The initial number of tasks run at once, when the definition gives one. */
  readonly concurrency: number | undefined
  readonly policy: Concurrency.Policy | undefined
  readonly weight: number
  readonly onIdle: Hook<R> | undefined
  readonly handler: Handler<A, O, R>
  /** The definition's `retryOn`, as a list (empty without it). Since 0.3.0. */
  readonly retryOn: ReadonlyArray<Transient.Rule>
  /**
   * What a threaded handler (`Thread.handler`) runs: the engine keeps a pool of threads for it.
   * Since 0.3.0.
   */
  readonly thread: ThreadSpec | undefined
  /**
   * Sets the concurrency of every running instance of this worker (see
   * `RunningWorker.setConcurrency`); rejects with a `ConcurrencyError` on an invalid value.
   */
  readonly setConcurrency: (n: number) => Promise<void>
  /** Stops every running instance of this worker as a signal would: a drain within the grace. */
  readonly stop: () => Promise<void>
  /** The running instances, for the two methods above. */
  readonly instances: Set<InstanceControls>
  readonly onStartup: ReadonlyArray<Hook<R>>
  readonly onShutdown: ReadonlyArray<Hook<R>>
  readonly readiness: Readonly<Record<string, Hook<R>>>
  /**
   * The definition's services, built by whoever runs the worker (see `WorkerDefinition.layer`).
   * What it provides is already out of `R`, so that a definition spread into another adds
   * nothing to its requirements nor takes anything from them.
   */
  readonly layer: Layer.Layer<never, unknown, never> | undefined
}

/**
 * What the definition's `setConcurrency` and `stop` reach in each running instance of it
 * (`WorkerProgram.RunningWorker` is one).
 *
 * @since 0.2.0
 * @category models
 */
export interface InstanceControls {
  readonly setConcurrency: (n: number) => Effect.Effect<void, ConcurrencyError>
  /** The number of tasks run at once now. */
  readonly concurrency: Effect.Effect<number>
  readonly stop: Effect.Effect<void>
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

const PROBE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/

/**
 * Readiness components the SDK reports itself.
 *
 * @since 0.1.0
 * @category constants
 */
export const RESERVED_PROBE_NAMES: ReadonlyArray<string> = ["broker", "draining"]

const hookList = <R>(
  hooks: Hook<R> | ReadonlyArray<Hook<R>> | undefined,
): ReadonlyArray<Hook<R>> | undefined => {
  const list = hooks === undefined ? [] : Array.isArray(hooks) ? hooks : [hooks as Hook<R>]
  return list.every(Hooks.isHook) ? list : undefined
}

const ruleList = (
  rules: Transient.Rule | ReadonlyArray<Transient.Rule> | undefined,
): ReadonlyArray<Transient.Rule> | undefined => {
  const list: ReadonlyArray<unknown> = rules === undefined
    ? []
    : Array.isArray(rules)
    ? rules
    : [rules]
  return list.every((rule) => typeof rule === "function")
    ? list as ReadonlyArray<Transient.Rule>
    : undefined
}

type MapError = (error: never) => FatalError | RetryableError

/** The handler, its own tagged errors mapped as `errors` says; anything else as it was. */
const withErrors = <A, O, R, E>(
  handler: Handler<A, O, R, E>,
  errors: Readonly<Record<string, MapError>>,
): Handler<A, O, R> => {
  const mapped = (error: unknown): unknown => {
    const tag = typeof error === "object" && error !== null
      ? (error as { _tag?: unknown })._tag
      : undefined
    const map = typeof tag === "string" && Object.hasOwn(errors, tag) ? errors[tag] : undefined
    return map === undefined ? error : map(error as never)
  }
  return (input, ctx) => {
    const result = handler(input, ctx)
    switch (kindOf(result)) {
      case "effect":
        return Effect.mapError(result as Effect.Effect<O, E, R>, mapped)
      case "promise":
        return Promise.resolve(result as PromiseLike<O>).catch((error: unknown) =>
          Promise.reject(mapped(error))
        )
      case "value":
        return result as PromiseLike<O>
    }
  }
}

/** What is wrong with a definition's concurrency and weight, if anything. */
const sizingProblem = (
  worker: string,
  policy: Concurrency.Policy | undefined,
  weight: number,
): string | undefined => {
  if (
    typeof policy !== "object" && policy !== undefined &&
    (!Number.isInteger(policy) || policy < 1 || policy > 2 ** 31 - 1)
  ) {
    return `The worker "${worker}" has a concurrency that is not a positive integer.`
  }
  if (
    !Number.isInteger(weight) || weight < 1 ||
    (typeof policy === "object" && policy._tag === "Pool" && weight > policy.capacity)
  ) {
    return `The worker "${worker}" has a weight that is not a positive integer within its pool's capacity.`
  }
  return undefined
}

/** What is wrong with a definition's readiness probes, if anything: their names, or a probe. */
const readinessProblem = (
  worker: string,
  readiness: Readonly<Record<string, unknown>>,
): string | undefined => {
  for (const [name, probe] of Object.entries(readiness)) {
    if (!PROBE_NAME_PATTERN.test(name) || RESERVED_PROBE_NAMES.includes(name)) {
      return `The worker "${worker}" has a readiness probe named "${name}": use letters, digits, ` +
        "'.', '_' or '-', and neither \"broker\" nor \"draining\", which the SDK reports itself."
    }
    if (!Hooks.isHook(probe)) {
      return `The worker "${worker}" has a readiness probe "${name}" that is not an Effect or a function.`
    }
  }
  return undefined
}

/**
 * Checks a definition, returning the worker or why it cannot run.
 *
 * @since 0.1.0
 * @category constructors
 */
export const validate = <A, I, O, R, E = unknown, RL = never, RIn = never>(
  definition: WorkerDefinition<A, I, O, R, E, RL, RIn>,
): Effect.Effect<Worker<A, I, O, Exclude<R, RL> | RIn, RL>, WorkerDefinitionError> =>
  Effect.suspend(() => {
    const d = definition as Partial<WorkerDefinition<A, I, O, R, E, RL, RIn>> | null | undefined
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
    const timeout = Duration.fromInput(d.timeout as Duration.Input)
    if (
      Option.isNone(timeout) || !Duration.isFinite(timeout.value) ||
      Duration.toMillis(timeout.value) <= 0
    ) {
      return problem(
        `The worker "${d.name}" needs a finite, positive timeout, such as "30 seconds".`,
      )
    }
    const policy = d.concurrency
    const weight = d.weight ?? 1
    const sizing = sizingProblem(d.name, policy, weight)
    if (sizing !== undefined) return problem(sizing)
    if (d.onIdle !== undefined && !Hooks.isHook(d.onIdle)) {
      return problem(`The worker "${d.name}" has an onIdle that is not an Effect or a function.`)
    }
    const onStartup = hookList(d.onStartup)
    const onShutdown = hookList(d.onShutdown)
    for (const [key, hooks] of [["onStartup", onStartup], ["onShutdown", onShutdown]] as const) {
      if (hooks === undefined) {
        return problem(
          `The worker "${d.name}" has an ${key} that is not an Effect, a function or a list of them.`,
        )
      }
    }
    const readiness = d.readiness ?? {}
    const probes = readinessProblem(d.name, readiness)
    if (probes !== undefined) return problem(probes)
    const retryOn = ruleList(d.retryOn)
    if (retryOn === undefined) {
      return problem(
        `The worker "${d.name}" has a retryOn that is not a function or a list of functions, ` +
          "such as Transient.network.",
      )
    }
    if (d.layer !== undefined && !Layer.isLayer(d.layer)) {
      return problem(`The worker "${d.name}" has a layer that is not an Effect Layer.`)
    }
    const instances = new Set<InstanceControls>()
    // The handler's and the hooks' services `RL` are the runner's to build from `layer`.
    return Effect.succeed<Worker<A, I, O, any, any>>({
      _tag: "Worker" as const,
      instances,
      // Rejects with the ConcurrencyError itself (not a FiberFailure), running instances or not.
      setConcurrency: (n: number) =>
        Effect.runPromiseExit(
          Effect.andThen(
            Concurrency.validate(n),
            Effect.forEach(instances, (running) => running.setConcurrency(n), { discard: true }),
          ),
        ).then((exit) =>
          Exit.isSuccess(exit) ? undefined : Promise.reject(Cause.squash(exit.cause))
        ),
      stop: () =>
        Effect.runPromise(Effect.forEach(instances, (running) => running.stop, { discard: true })),
      name: d.name,
      input: d.input,
      output: d.output,
      timeout: timeout.value,
      concurrency: typeof policy === "number"
        ? policy
        : policy?._tag === "Adaptive"
        ? policy.initial
        : policy?._tag === "Pool"
        ? Math.floor(policy.capacity / weight)
        : undefined,
      policy: typeof policy === "object" ? policy : undefined,
      weight,
      onIdle: d.onIdle,
      handler: d.errors === undefined
        ? d.handler as Handler<A, O, R>
        : withErrors(d.handler, d.errors as Readonly<Record<string, MapError>>),
      retryOn,
      thread: specOf(d.handler),
      onStartup: onStartup ?? [],
      onShutdown: onShutdown ?? [],
      readiness,
      layer: d.layer as Layer.Layer<never, unknown, never> | undefined,
    })
  })

/**
 * Defines a worker. Throws {@link WorkerDefinitionError} (one clear sentence) when the
 * definition cannot run, so that a bad module fails as it loads.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <A, I, O, R = never, E = never, RL = never, RIn = never>(
  definition: WorkerDefinition<A, I, O, R, E, RL, RIn>,
): Worker<A, I, O, Exclude<R, RL> | RIn, RL> =>
  Effect.runSync(Effect.result(validate(definition))).pipe((result) => {
    if (result._tag === "Failure") throw result.failure
    return result.success
  })

/**
 * A definition to share between workers, or between a worker and its tests, typed as it is
 * written: `Worker.make({ ...shared, name: "fixed", concurrency: 8 })`. An object literal of its
 * own (`const shared = { … } as const`) would leave the handler's parameters untyped, as nothing
 * tells them their types until `make` is called. The name may wait for `make`.
 *
 * @since 0.3.0
 * @category models
 */
export type SharedDefinition<A, I, O, R, E = unknown, RL = never, RIn = never> =
  & Omit<WorkerDefinition<A, I, O, R, E, RL, RIn>, "name">
  & { readonly name?: string | undefined }

/**
 * Types a definition written apart from `make` (see {@link SharedDefinition}); checked only when
 * `make` is given it.
 *
 * @since 0.3.0
 * @category constructors
 */
export const define = <A, I, O, R = never, E = never, RL = never, RIn = never>(
  definition: SharedDefinition<A, I, O, R, E, RL, RIn>,
): SharedDefinition<A, I, O, R, E, RL, RIn> => definition
