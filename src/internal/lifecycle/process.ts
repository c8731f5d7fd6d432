/**
 * A worker's life as the process (`Worker.run`, the CLI): the settings or the one line that says
 * why not, the probe server from the start to the end of the shutdown, the life until it ends or
 * a signal comes, then the bounded shutdown, and the spec's exit code.
 */
import {
  Cause,
  ConfigProvider,
  Context,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Option,
  Queue,
  Ref,
  Result,
  Scope,
} from "effect"
import type { ConsumingError, RunOptions, StartError } from "../../Lifecycle.ts"
import * as Probes from "../../Probes.ts"
import { type ExitCode, Process } from "../../Process.ts"
import * as Settings from "../../Settings.ts"
import type { Worker } from "../../WorkerDefinition.ts"
import type { ProbeServerError } from "../../WorkerError.ts"
import { errorKind, errorMessage } from "../describe.ts"
import { timeoutDetached } from "../detach.ts"
import * as Life from "./life.ts"

/**
 * The process's environment, read as it is: a variable set to nothing (`IN_QUEUE_NAME=`, from a
 * manifest's unset variable) is a problem the settings name, where Effect 4's default provider
 * would read it as unset and quietly take the default (another queue). Made when first read, so
 * that a runtime refusing the environment (Deno without `--allow-env`) says so as a defect.
 */
const processEnvironment = Effect.sync(() => ConfigProvider.fromEnv({ preserveEmptyStrings: true }))

/**
 * The settings of the process, or the one line that says why not (exit code 2); from the
 * environment as it is, unless a `ConfigProvider` was given.
 */
export const processSettings = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options: RunOptions,
): Effect.Effect<Result.Result<Settings.WorkerSettings, string>> =>
  Effect.gen(function* () {
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
          "or run on the embedded broker with --memory (WORKER_TRANSPORT=memory)",
      )
    }
    return Result.succeed(settings)
  })

/** An error of the process's life as the spec's exit code, logged. */
const exitCodeOf = (
  error: StartError | ConsumingError | ProbeServerError,
): Effect.Effect<ExitCode, never, Process> => {
  switch (error._tag) {
    case "TransportError":
      // The transport has logged it; refused credentials or a conflicting queue are
      // configuration, which no restart mends.
      return Effect.succeed(error.isConfiguration ? 2 : 1)
    case "ProbeServerError":
      return Effect.as(Effect.flatMap(Process, (p) => p.writeErr(error.message)), 2)
    default:
      return Effect.as(Effect.logError(error.message), 1)
  }
}

/**
 * The end of the process's life: a startup still under way is cancelled, the life's scope closed
 * (the drain, the shutdown hooks, the transport, the probe server), and handlers that ignored
 * their signal waited for; bounded by {@link Life.shutdownBound} from outside, with a bound that
 * does not wait for what it cuts short (`timeoutDetached`).
 */
const closeLife = (
  settings: Settings.WorkerSettings,
  main: Fiber.Fiber<ExitCode>,
  lifeScope: Scope.Closeable,
  life: Ref.Ref<Option.Option<Life.Life<any, any, any, any>>>,
  first: Option.Option<ExitCode>,
): Effect.Effect<ExitCode> => {
  const bound = Life.shutdownBound(settings.shutdownGrace)
  const close = Effect.gen(function* () {
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
    const code: ExitCode = Option.getOrElse(first, () => 0 as const)
    const clean = Option.isNone(built) || (yield* Ref.get(built.value.hooksClean))
    return clean ? code : (code === 0 ? 1 : code)
  })
  return timeoutDetached(close, bound).pipe(
    Effect.flatMap(Option.match({
      onSome: Effect.succeed,
      onNone: () =>
        Effect.as(
          Effect.logError(`The shutdown did not end within ${Duration.format(bound)}: exiting`),
          1 as const,
        ),
    })),
    Effect.catchCause((cause) =>
      Effect.as(Effect.logError("The shutdown failed", Cause.pretty(cause)), 1 as const)
    ),
  )
}

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
    const process = yield* Process
    const signals = yield* process.signals
    const lifeScope = yield* Scope.make()
    const built = yield* Ref.make(Option.none<Life.Life<A, I, O, R>>())
    const skipGrace = Queue.take(signals).pipe(
      Effect.tap((signal) =>
        Effect.logWarning(`${signal} received again: skipping the rest of the grace period`)
      ),
      Effect.asVoid,
    )
    const graph = Life.layer(worker, options, { beforeStartup: Probes.layer, skipGrace })
    const main = yield* Effect.forkChild(
      Effect.gen(function* () {
        const { life, program } = Life.partsOf(yield* Layer.buildWithScope(graph, lifeScope))
        yield* Ref.set(built, Option.some(life))
        yield* Life.consumingEnds(life, program)
        return 0 as ExitCode
      }).pipe(
        Effect.catch(exitCodeOf),
        // A defect (in the transport, the engine) is a failure of the process, not of `run`:
        // the shutdown must still drain, run the hooks and close.
        Effect.catchCause((cause) =>
          Cause.hasInterruptsOnly(cause)
            ? Effect.failCause(cause)
            : Effect.as(Effect.logError("The worker failed", cause), 1 as ExitCode)
        ),
      ),
    )
    const first = yield* Effect.raceAll([
      Fiber.join(main).pipe(Effect.map(Option.some)),
      Queue.take(signals).pipe(
        Effect.tap((signal) => Effect.logInfo(`${signal} received: shutting down`)),
        Effect.as(Option.none<ExitCode>()),
      ),
      (options.stop ?? Effect.never).pipe(Effect.as(Option.none<ExitCode>())),
    ])
    return yield* closeLife(settings, main, lifeScope, built, first)
  })
