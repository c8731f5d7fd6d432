/**
 * A worker's life as the process (`Worker.run`, the CLI): the settings or the one line that says
 * why not, the probe server from the start to the end of the shutdown, the life until it ends or
 * a signal comes, then the bounded shutdown, and the spec's exit code.
 */
import * as Cause from "effect/Cause"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Redacted from "effect/Redacted"
import * as Ref from "effect/Ref"
import * as Result from "effect/Result"
import * as Scope from "effect/Scope"
import * as Probes from "../../Probes.ts"
import { describeStop, type ExitCode, missingPermissions, Process } from "../../Process.ts"
import * as Settings from "../../Settings.ts"
import type { Worker } from "../../WorkerDefinition.ts"
import { type ProbeServerError, WorkerDefinitionError } from "../../WorkerError.ts"
import { errorKind, errorMessage } from "../describe.ts"
import { timeoutDetached } from "../detach.ts"
import * as Life from "./life.ts"
import type { ConsumingError } from "./state.ts"

/**
 * How to run a worker process.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunOptions extends Life.LifeOptions {
  /** Ends the worker as a signal would (`Worker.run`'s handle): a clean stop, exit code 0. */
  readonly stop?: Effect.Effect<void> | undefined
}

/**
 * The process's environment, read as it is: a variable set to nothing (`IN_QUEUE_NAME=`, from a
 * manifest's unset variable) is a problem the settings name, where Effect 4's default provider
 * would read it as unset and quietly take the default (another queue). Made when first read, so
 * that a runtime refusing the environment (Deno without `--allow-env`) says so as a defect.
 */
const processEnvironment = Effect.sync(() => ConfigProvider.fromEnv({ preserveEmptyStrings: true }))

/**
 * How the process is told to run on the embedded broker: `WORKER_TRANSPORT=memory`, which every
 * runner reads; the CLI, which alone takes `--memory`, provides its flag.
 */
export const EmbeddedBrokerHint = Context.Reference<string>(
  "@async-task/worker/EmbeddedBrokerHint",
  { defaultValue: () => "WORKER_TRANSPORT=memory" },
)

/**
 * The settings of the process, or the one line that says why not (exit code 2); from the
 * environment as it is, unless a `ConfigProvider` was given.
 */
export const processSettings = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options: RunOptions,
): Effect.Effect<Result.Result<Settings.WorkerSettings, string>> =>
  Effect.gen(function* () {
    // Before the first that Deno would refuse: every missing permission in one line.
    const unpermitted = missingPermissions()
    if (unpermitted !== undefined) return Result.fail(unpermitted)
    const given = Context.getOrUndefined(
      yield* Effect.context<never>(),
      ConfigProvider.ConfigProvider,
    )
    const make = Settings.make(worker, options.settings)
    const read = yield* Effect.result(
      given === undefined
        ? Effect.provideServiceEffect(make, ConfigProvider.ConfigProvider, processEnvironment)
        : make,
    ).pipe(
      // A runtime that refuses to read the environment (Deno without --allow-env) says which
      // permission and flag it wants in its message.
      Effect.catchDefect((defect) =>
        Effect.succeed(Result.fail({
          message: errorKind(defect) === "NotCapable"
            ? `A Deno permission is missing: ${errorMessage(defect)}`
            : `The settings could not be read: ${errorMessage(defect)}`,
        }))
      ),
    )
    if (Result.isFailure(read)) return Result.fail(read.failure.message)
    const settings = read.success
    if (
      options.transport === undefined && settings.transport === "amqp" &&
      Option.isNone(settings.brokerUrl)
    ) {
      return Result.fail(
        "BROKER_URL is not set: set it to the RabbitMQ URL (amqp://user:password@host:5672/vhost), " +
          `or run on the embedded broker with ${yield* EmbeddedBrokerHint}`,
      )
    }
    const unreached = missingPermissions({ net: addressesOf(settings, options) })
    return unreached === undefined ? Result.succeed(settings) : Result.fail(unreached)
  })

/** The addresses the process listens on and connects to: the probe server's, the broker's. */
const addressesOf = (settings: Settings.WorkerSettings, options: RunOptions): Array<string> => {
  const addresses = [`${settings.healthCheckHost}:${settings.healthCheckPort}`]
  if (
    options.transport !== undefined || settings.transport !== "amqp" ||
    Option.isNone(settings.brokerUrl)
  ) return addresses
  try {
    const url = new URL(Redacted.value(settings.brokerUrl.value))
    const port = url.port === "" ? (url.protocol === "amqps:" ? "5671" : "5672") : url.port
    return [...addresses, `${url.hostname}:${port}`]
  } catch {
    // The settings have checked it: the transport says what is wrong with it.
    return addresses
  }
}

/** An error of the process's life as the spec's exit code, logged. */
const exitCodeOf = (
  error: Life.StartError | ConsumingError | ProbeServerError,
): Effect.Effect<ExitCode, never, Process> => {
  switch (error._tag) {
    case "TransportError":
      // The transport has logged it; refused credentials or a conflicting queue are
      // configuration, which no restart mends.
      return Effect.succeed(error.isConfiguration ? 2 : 1)
    case "ProbeServerError":
      return Effect.as(Effect.flatMap(Process, (p) => p.writeErr(error.message)), 2)
    case "MissingServiceError":
      // The deployment's defect, which the engine has said: no restart mends it.
      return Effect.succeed(2)
    default:
      return Effect.as(Effect.logError(error.message), 1)
  }
}

/**
 * The end of the process's life: a startup still under way is cancelled, the life's scope closed
 * (the drain, the shutdown hooks, the transport, the probe server), and handlers that ignored
 * their signal waited for.
 */
const closeLife = (
  main: Fiber.Fiber<ExitCode>,
  lifeScope: Scope.Closeable,
  life: Ref.Ref<Option.Option<Life.Life<any, any, any, any>>>,
): Effect.Effect<void> =>
  Effect.gen(function* () {
    yield* Fiber.interrupt(main)
    yield* Scope.close(lifeScope, Exit.void)
    const built = yield* Ref.get(life)
    const pending = Option.isSome(built) ? built.value.handlers.pending() : []
    for (const call of pending) {
      yield* Effect.logError(
        `The handler of task ${call.taskId} ignored its AbortSignal and is still running`,
      ).pipe(Effect.annotateLogs({ task_id: call.taskId }))
    }
    if (pending.length > 0) {
      yield* Effect.promise(() => Promise.allSettled(pending.map((call) => call.promise)))
    }
  })

/**
 * A life as the process, until it ends or is stopped: `start` forked, with the second stop (a
 * signal after the first) as the end of the drain's grace ({@link Life.SkipGrace}) and the
 * lives' reports ({@link Life.LifeReports}: `ended` given on); held until `start` ends (its exit
 * code), the first stop (said) or `stop`; then `close`, given `start`'s fiber, bounded from
 * outside by `bound` with a bound that does not wait for what it cuts short
 * (`timeoutDetached`). The exit code is `start`'s, or 0 when a stop came first; 1 if a shutdown
 * hook failed, past the bound, or if the close fails.
 */
export const untilStopped = <R>(options: {
  readonly start: Effect.Effect<ExitCode, never, R>
  readonly stop: Effect.Effect<void>
  readonly bound: Duration.Duration
  readonly close: (main: Fiber.Fiber<ExitCode>) => Effect.Effect<void>
  readonly ended?: ((error: Option.Option<ConsumingError>) => Effect.Effect<void>) | undefined
}): Effect.Effect<ExitCode, never, R | Process | Scope.Scope> =>
  Effect.gen(function* () {
    const signals = yield* (yield* Process).signals
    const second = yield* Deferred.make<void>()
    const hooksFailed = yield* Ref.make(false)
    const main = yield* Effect.forkChild(
      options.start.pipe(
        Effect.provideService(Life.SkipGrace, Deferred.await(second)),
        Effect.provideService(Life.LifeReports, {
          ended: options.ended ?? (() => Effect.void),
          hooksFailed: Ref.set(hooksFailed, true),
        }),
      ),
    )
    const first = yield* Effect.raceAll([
      Fiber.join(main).pipe(Effect.map(Option.some)),
      Queue.take(signals).pipe(
        Effect.tap((stop) => Effect.logInfo(`${describeStop(stop)}: shutting down`)),
        Effect.as(Option.none<ExitCode>()),
      ),
      options.stop.pipe(Effect.as(Option.none<ExitCode>())),
    ])
    yield* Effect.forkScoped(
      Queue.take(signals).pipe(
        Effect.tap((stop) =>
          Effect.logWarning(`${describeStop(stop)} again: skipping the rest of the grace period`)
        ),
        Effect.andThen(Deferred.succeed(second, undefined)),
      ),
    )
    const closed = Effect.andThen(options.close(main), Ref.get(hooksFailed)).pipe(
      Effect.map((failed): ExitCode => {
        const code = Option.getOrElse(first, () => 0 as const)
        return failed && code === 0 ? 1 : code
      }),
    )
    return yield* timeoutDetached(closed, options.bound).pipe(
      Effect.flatMap(Option.match({
        onSome: Effect.succeed,
        onNone: () =>
          Effect.as(
            Effect.logError(
              `The shutdown did not end within ${Duration.format(options.bound)}: exiting`,
            ),
            1 as const,
          ),
      })),
      Effect.catchCause((cause) =>
        Effect.as(Effect.logError("The shutdown failed", Cause.pretty(cause)), 1 as const)
      ),
    )
  })

/**
 * The process's life after its settings: the worker's life until it ends, a signal or
 * `options.stop`, then its close; the exit code.
 */
export const live = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  settings: Settings.WorkerSettings,
  options: RunOptions,
): Effect.Effect<ExitCode, never, Process | R | Scope.Scope> =>
  Effect.gen(function* () {
    const lifeScope = yield* Scope.make()
    const built = yield* Ref.make(Option.none<Life.Life<A, I, O, R>>())
    const graph = Life.layer(worker, options, { beforeStartup: Probes.layer })
    return yield* untilStopped({
      start: Effect.gen(function* () {
        const { life, program } = Life.partsOf(yield* Layer.buildWithScope(graph, lifeScope))
        yield* Ref.set(built, Option.some(life))
        yield* Life.consumingEnds(life, program)
        return 0 as ExitCode
      }).pipe(
        Effect.catch(exitCodeOf),
        // A defect (in the transport, the engine) is a failure of the process, not of `run`:
        // the shutdown must still drain, run the hooks and close.
        Effect.catchCause((cause) => {
          if (Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause)
          // A threaded handler's module that cannot load (its pool's start, in the engine): the
          // definition's defect, which no restart mends.
          const definition = cause.reasons.flatMap((r) =>
            Cause.isDieReason(r) && r.defect instanceof WorkerDefinitionError ? [r.defect] : []
          )[0]
          return definition === undefined
            ? Effect.as(Effect.logError("The worker failed", cause), 1 as ExitCode)
            : Effect.as(Effect.logError(definition.message), 2 as ExitCode)
        }),
      ),
      stop: options.stop ?? Effect.never,
      bound: Life.shutdownBound(settings.shutdownGrace),
      close: (main) => closeLife(main, lifeScope, built),
    })
  })
