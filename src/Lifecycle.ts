/**
 * The life of a worker, one for its three entry points: the settings first, the startup hooks,
 * the transport and consuming; then, when its scope closes (a signal, an app's shutdown), the
 * bounded drain, the shutdown hooks, and the transport closed — only then what the scope's owner
 * holds. `Worker.serve` and `Worker.layer` live it inside a program ({@link start}); `Worker.run`
 * and the CLI as the process ({@link run}), with probes, signals and the spec's exit code.
 * Process-free: the process comes from the {@link Process} service.
 *
 * @since 0.1.0
 */
import {
  Cause,
  Context,
  Data,
  Duration,
  Effect,
  Either,
  Exit,
  Fiber,
  Layer,
  Logger,
  Option,
  Queue,
  Redacted,
  Scope,
  Stream,
  SubscriptionRef,
} from "effect"
import * as AmqpTransport from "./AmqpTransport.ts"
import { errorKind, errorMessage } from "./internal/describe.ts"
import { watchHandlers } from "./internal/lifecycle/handlerWatch.ts"
import * as Hooks from "./internal/lifecycle/hooks.ts"
import { layerMemoryTrial } from "./internal/memory/trial.ts"
import { runShutdownHooks } from "./internal/lifecycle/shutdownHooks.ts"
import { VERSION } from "./internal/version.ts"
import * as JobMode from "./JobMode.ts"
import * as Probes from "./Probes.ts"
import * as ProcessModule from "./Process.ts"
import { type ExitCode, Process } from "./Process.ts"
import * as Prometheus from "./Prometheus.ts"
import * as RuntimeMetrics from "./RuntimeMetrics.ts"
import * as Settings from "./Settings.ts"
import { type ConnectionStatus, Transport } from "./Transport.ts"
import type * as Worker from "./WorkerDefinition.ts"
import {
  type BrokerUnreachable,
  type IdleHookError,
  ProbeError,
  type SettingsError,
  StartupHookError,
  type TransportError,
} from "./WorkerError.ts"
import * as WorkerLogger from "./WorkerLogger.ts"
import * as WorkerProgram from "./WorkerProgram.ts"

/**
 * Where the worker is in its life.
 *
 * @since 0.1.0
 * @category models
 */
export type LifecycleState = Data.TaggedEnum<{
  // deno-lint-ignore ban-types
  Starting: {}
  // deno-lint-ignore ban-types
  Running: {}
  // deno-lint-ignore ban-types
  Draining: {}
  Stopped: { readonly exitCode: ExitCode }
}>

/**
 * Constructors and matchers for {@link LifecycleState}.
 *
 * @since 0.1.0
 * @category models
 */
export const LifecycleState = Data.taggedEnum<LifecycleState>()

/**
 * How to live a worker's life.
 *
 * @since 0.1.0
 * @category models
 */
export interface LifeOptions {
  /**
   * Settings given in code; they win over the environment. Settings in the context (a
   * `Settings` layer the app provides) win over both.
   */
  readonly settings?: Settings.SettingsOverrides | undefined
  /**
   * The transport. By default a `Transport` in the context, else RabbitMQ at `BROKER_URL` (or
   * the embedded broker with `WORKER_TRANSPORT=memory`).
   */
  readonly transport?: Layer.Layer<Transport, TransportError, Settings.Settings> | undefined
  /** The `/__version__` document (default `/app/version.json`). */
  readonly versionFile?: string | undefined
}

/**
 * How to run a worker process.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunOptions extends LifeOptions {
  /** Ends the worker as a signal would (`Worker.run`'s handle): a clean stop, exit code 0. */
  readonly stop?: Effect.Effect<void> | undefined
}

/**
 * Why a worker could not start: its settings, a startup hook, or its transport (refused
 * credentials, a queue declared with other arguments, no `BROKER_URL`, a job's broker out of
 * reach past `WORKER_JOB_CONNECT_TIMEOUT_S`).
 *
 * @since 0.1.0
 * @category models
 */
export type StartError = SettingsError | StartupHookError | TransportError | BrokerUnreachable

/**
 * The most the shutdown may take after the first signal: the grace period (at least 5 s), then
 * 5 s for the requeues, 5 s to close the connection, 5 s for the shutdown hooks and 2 s of slack.
 *
 * @since 0.1.0
 * @category constants
 */
export const shutdownBound = (grace: Duration.Duration): Duration.Duration =>
  Duration.sum(Duration.max(grace, Duration.seconds(5)), Duration.seconds(17))

/**
 * The process's transport: RabbitMQ at `BROKER_URL`, or the embedded broker for local trials.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransport = (
  settings: Settings.WorkerSettings,
): Layer.Layer<Transport, TransportError, Settings.Settings | Process> =>
  settings.transport === "memory" ? layerMemoryTrial : AmqpTransport.layer

/** A worker's life: what its steps share. */
interface Life<A, I, O, R> {
  readonly worker: Worker.Worker<A, I, O, R>
  readonly settings: Settings.WorkerSettings
  readonly options: LifeOptions
  readonly state: SubscriptionRef.SubscriptionRef<LifecycleState>
  readonly handlers: ReturnType<typeof watchHandlers<A, I, O, R>>
  readonly probes: Probes.ProbeServerOptions
  connection: SubscriptionRef.SubscriptionRef<ConnectionStatus> | undefined
  /** Whether the shutdown hooks all ended in time, once they have run. */
  hooksClean: boolean
}

/** The readiness components: the SDK's own (`broker`, `draining`), then the worker's probes. */
const readiness = <A, I, O, R>(
  life: Omit<Life<A, I, O, R>, "probes">,
  context: Context.Context<R>,
): ReadonlyArray<Probes.ReadinessComponent> => [
  {
    name: "broker",
    check: Effect.suspend(() =>
      life.connection === undefined
        ? Effect.fail(new ProbeError({ message: "not connected yet" }))
        : Effect.flatMap(
          SubscriptionRef.get(life.connection),
          (status) =>
            status === "connected"
              ? Effect.void
              : Effect.fail(new ProbeError({ message: `the broker connection is ${status}` })),
        )
    ),
  },
  {
    name: "draining",
    check: Effect.flatMap(
      SubscriptionRef.get(life.state),
      (s) =>
        s._tag === "Draining" || s._tag === "Stopped"
          ? Effect.fail(new ProbeError({ message: "the worker is shutting down" }))
          : Effect.void,
    ),
  },
  ...Object.entries(life.worker.readiness).map(([name, probe]) => ({
    name,
    check: Effect.provide(Hooks.toEffect(probe), context),
  })),
]

/** What the probes read of the life: `/health` a handler past its deadline, `/ready`, `/metrics`. */
const probesOf = <A, I, O, R>(
  life: Omit<Life<A, I, O, R>, "probes">,
  context: Context.Context<R>,
): Probes.ProbeServerOptions => {
  const settings = life.settings
  return {
    host: settings.healthCheckHost,
    port: settings.healthCheckPort,
    health: Effect.sync(() =>
      Option.map(
        life.handlers.overrun(Duration.sum(settings.taskTimeout, settings.taskOverrunGrace)),
        (call) => ({
          code: "TASK_OVERRUN",
          message: `The handler of task ${call.taskId} is still running ${
            Duration.format(settings.taskOverrunGrace)
          } past its deadline`,
        }),
      )
    ),
    readiness: readiness(life, context),
    probeTimeout: settings.probeTimeout,
    // Process figures as of the scrape, not of the last periodic sample.
    metrics: Effect.zipRight(RuntimeMetrics.sample, Prometheus.exposition),
    sdkVersion: VERSION,
    ...(life.options.versionFile === undefined ? {} : { versionFile: life.options.versionFile }),
  }
}

/** The settings: the context's, else the definition's with the environment and the overrides. */
const settingsOf = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  options: LifeOptions,
): Effect.Effect<Settings.WorkerSettings, SettingsError> =>
  Effect.flatMap(
    Effect.serviceOption(Settings.Settings),
    Option.match({
      onSome: Effect.succeed,
      onNone: () => Settings.make(worker, options.settings),
    }),
  )

/** The worker's log line of this life: its level, and how much of an error's text it shows. */
const logged = <A, E, R>(settings: Settings.WorkerSettings, effect: Effect.Effect<A, E, R>) =>
  effect.pipe(
    Logger.withMinimumLogLevel(settings.logLevel),
    Effect.locally(WorkerLogger.currentErrorText, settings.logErrorText),
    Effect.locally(
      WorkerLogger.currentRedactions,
      Option.match(settings.brokerUrl, {
        onNone: () => [],
        onSome: (url) => {
          try {
            return [decodeURIComponent(new URL(Redacted.value(url)).password)]
          } catch {
            return []
          }
        },
      }),
    ),
  )

/** A life of `worker` with `settings`, in the `Starting` state, its runtime figures sampled. */
const prepare = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  settings: Settings.WorkerSettings,
  options: LifeOptions,
): Effect.Effect<Life<A, I, O, R>, never, Scope.Scope | R> =>
  Effect.gen(function* () {
    yield* RuntimeMetrics.make()
    const context = yield* Effect.context<R>()
    const life: Omit<Life<A, I, O, R>, "probes"> = {
      worker,
      settings,
      options,
      state: yield* SubscriptionRef.make<LifecycleState>(LifecycleState.Starting()),
      handlers: watchHandlers(worker, yield* Effect.clock),
      connection: undefined,
      hooksClean: true,
    }
    return Object.assign(life, { probes: probesOf(life, context) })
  })

/**
 * The process in context, else the real one: the embedded broker of a local trial
 * (`WORKER_TRANSPORT=memory`) reads its tasks from standard input.
 */
const withProcess = <A, E, R>(effect: Effect.Effect<A, E, R | Process>): Effect.Effect<A, E, R> =>
  Effect.flatMap(
    Effect.serviceOption(Process),
    (given) =>
      Option.isSome(given) ? effect : Effect.provideService(effect, Process, ProcessModule.live),
  ) as Effect.Effect<A, E, R>

/** Completes once the transport is connected; fails at once if the worker fails first. */
const awaitConnected = (
  status: SubscriptionRef.SubscriptionRef<ConnectionStatus>,
  running: Worker.RunningWorker,
): Effect.Effect<void, TransportError | IdleHookError> =>
  Effect.raceFirst(
    status.changes.pipe(Stream.takeUntil((s) => s === "connected"), Stream.runDrain),
    Effect.zipRight(running.await, Effect.never),
  )

/**
 * The shutdown, as a finalizer of the life's scope: the drain within the grace (`skipGrace` ends
 * it early), then the shutdown hooks; bounded by {@link shutdownBound} whatever they do. The
 * transport, built earlier in the same scope, closes after it.
 */
const shutdown = <A, I, O, R>(
  life: Life<A, I, O, R>,
  running: Worker.RunningWorker,
  skipGrace: Effect.Effect<void> | undefined,
): Effect.Effect<void, never, R> => {
  const bound = shutdownBound(life.settings.shutdownGrace)
  return Effect.gen(function* () {
    yield* SubscriptionRef.set(life.state, LifecycleState.Draining())
    yield* running.drain(skipGrace === undefined ? {} : { skipGrace })
    life.hooksClean = yield* runShutdownHooks(
      life.worker.onShutdown,
      life.settings.shutdownHooksTimeout,
    )
  }).pipe(
    // A shutdown that refuses to be interrupted is left behind, not awaited.
    Effect.interruptible,
    Effect.disconnect,
    Effect.timeoutOption(bound),
    Effect.flatMap(Option.match({
      onSome: () => Effect.void,
      onNone: () => {
        life.hooksClean = false
        return Effect.logError(`The shutdown did not end within ${Duration.format(bound)}`)
      },
    })),
  )
}

/**
 * The startup and the consuming: the startup hooks, the transport (built in the scope), the
 * worker consuming, connected. The shutdown is set as the scope's next finalizer.
 */
const begin = <A, I, O, R>(
  life: Life<A, I, O, R>,
  skipGrace?: Effect.Effect<void>,
): Effect.Effect<
  Worker.RunningWorker,
  StartupHookError | TransportError | IdleHookError | BrokerUnreachable,
  Scope.Scope | R
> =>
  Effect.gen(function* () {
    const { settings, worker } = life
    for (const hook of worker.onStartup) {
      yield* Hooks.toEffect(hook).pipe(Effect.mapError((cause) => new StartupHookError({ cause })))
    }
    const given = yield* Effect.serviceOption(Transport)
    const transport = Option.isSome(given) && life.options.transport === undefined
      ? given.value
      : Context.get(
        yield* Layer.build(life.options.transport ?? layerTransport(settings)).pipe(
          Effect.provideService(Settings.Settings, settings),
          withProcess,
        ),
        Transport,
      )
    life.connection = transport.status
    const running = yield* WorkerProgram.start(life.handlers.watched).pipe(
      Effect.provideService(
        Transport,
        settings.mode === "job"
          ? JobMode.limitIntake(
            transport,
            settings.jobMaxTasks,
            // Done taking: no longer ready, while the last tasks finish.
            SubscriptionRef.set(life.state, LifecycleState.Draining()),
          )
          : transport,
      ),
      Effect.provideService(Settings.Settings, settings),
    )
    yield* Effect.addFinalizer(() => shutdown(life, running, skipGrace))
    yield* SubscriptionRef.set(life.state, LifecycleState.Running())
    yield* Effect.logInfo(
      `Worker ${worker.name} started in ${settings.mode} mode on ${settings.inQueue}`,
    )
    const connected = awaitConnected(transport.status, running)
    // A job waits for its broker only so long.
    yield* settings.mode === "job"
      ? Effect.raceFirst(
        connected,
        JobMode.failWhenUnreachable(transport.status, settings.jobConnectTimeout),
      )
      : connected
    return running
  })

/** How consuming ends: the transport or `onIdle` failing, a job done, `worker.stop()`. */
const consumingEnds = <A, I, O, R>(
  life: Life<A, I, O, R>,
  running: Worker.RunningWorker,
): Effect.Effect<void, TransportError | IdleHookError | BrokerUnreachable> => {
  const settings = life.settings
  const status = life.connection!
  const ended = settings.mode !== "job" ? running.await : Effect.raceFirst(
    Effect.raceFirst(
      running.await,
      JobMode.awaitIdle(running.inFlight, status, settings.jobIdleTimeout).pipe(
        Effect.tap(() =>
          Effect.logInfo(`Idle for ${Duration.format(settings.jobIdleTimeout)}: the job is done`)
        ),
      ),
    ),
    JobMode.failWhenUnreachable(status, settings.jobConnectTimeout),
  )
  return Effect.raceFirst(ended, running.stopRequested)
}

/**
 * Lives the worker's life in the current scope: settings, startup hooks, the transport,
 * consuming — and completes once it is connected, with its probes (for `Probes.layer` or an
 * app's own router). Closing the scope drains it (within the grace), runs the shutdown hooks
 * and closes the transport, in that order. Fails, without starting, on invalid settings, a
 * failing startup hook, refused credentials or a queue declared with other arguments.
 *
 * @since 0.1.0
 * @category running
 */
export const start = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  options: LifeOptions = {},
): Effect.Effect<
  { readonly running: Worker.RunningWorker; readonly probes: Probes.ProbeServerOptions },
  StartError | IdleHookError,
  Scope.Scope | R
> =>
  Effect.gen(function* () {
    const settings = yield* settingsOf(worker, options)
    return yield* logged(
      settings,
      Effect.gen(function* () {
        const life = yield* prepare(worker, settings, options)
        const running = yield* begin(life)
        // After its start, a transport that fails for good is said, and the app decides what
        // next; `worker.stop()` (or a job done) drains the worker at once.
        yield* Effect.forkScoped(
          consumingEnds(life, running).pipe(
            Effect.matchEffect({
              onFailure: (error) => Effect.logError(`The worker stopped: ${error.message}`),
              onSuccess: () => running.drain(),
            }),
          ),
        )
        return { running, probes: life.probes }
      }),
    )
  }).pipe(Effect.annotateLogs({ service: worker.name }))

/**
 * Lives the worker's life until consuming ends (intake stopped, a job done, `worker.stop()`) or
 * the program is interrupted, then the bounded shutdown.
 *
 * @since 0.1.0
 * @category running
 */
export const serve = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  options: LifeOptions = {},
): Effect.Effect<void, StartError | IdleHookError | BrokerUnreachable, R> =>
  Effect.scoped(Effect.gen(function* () {
    const settings = yield* settingsOf(worker, options)
    yield* logged(
      settings,
      Effect.gen(function* () {
        const life = yield* prepare(worker, settings, options)
        const running = yield* begin(life)
        yield* consumingEnds(life, running)
      }),
    )
  })).pipe(Effect.annotateLogs({ service: worker.name }))

/** An error of the process's life as the spec's exit code, logged. */
const exitCodeOf = (
  error: StartupHookError | TransportError | IdleHookError | BrokerUnreachable,
): Effect.Effect<ExitCode> => {
  switch (error._tag) {
    case "TransportError":
      // The transport has logged it; refused credentials or a conflicting queue are
      // configuration, which no restart mends.
      return Effect.succeed(error.isConfiguration ? 2 : 1)
    default:
      return Effect.as(Effect.logError(error.message), 1)
  }
}

/** The settings of the process, or the one line that says why not (exit code 2). */
const processSettings = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  options: LifeOptions,
): Effect.Effect<Either.Either<Settings.WorkerSettings, string>> =>
  Effect.gen(function* () {
    const read = yield* Effect.either(Settings.make(worker, options.settings)).pipe(
      // A runtime that refuses to read the environment (Deno without --allow-env) says which
      // permission and flag it wants in its message.
      Effect.catchAllDefect((defect) =>
        Effect.succeed(Either.left({
          message: errorKind(defect) === "NotCapable"
            ? `A Deno permission is missing: ${errorMessage(defect)}`
            : `The settings could not be read: ${errorMessage(defect)}`,
        }))
      ),
    )
    if (Either.isLeft(read)) return Either.left(read.left.message)
    const settings = read.right
    if (
      options.transport === undefined && settings.transport === "amqp" &&
      Option.isNone(settings.brokerUrl)
    ) {
      return Either.left(
        "BROKER_URL is not set: set it to the RabbitMQ URL (amqp://user:password@host:5672/vhost), " +
          "or run on the embedded broker with --memory (WORKER_TRANSPORT=memory)",
      )
    }
    return Either.right(settings)
  })

/** The process's life after its settings: probes, the worker until it ends or a signal, the shutdown. */
const live = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  settings: Settings.WorkerSettings,
  options: RunOptions,
): Effect.Effect<ExitCode, never, Process | R | Scope.Scope> =>
  Effect.gen(function* () {
    const process = yield* Process
    const signals = yield* process.signals
    const lifeScope = yield* Scope.make()
    const life = yield* prepare(worker, settings, options)
    // Up from the start to the end of the shutdown: in `run`'s own scope, outliving `lifeScope`.
    const server = yield* Effect.either(Probes.make(life.probes))
    if (Either.isLeft(server)) {
      yield* process.writeErr(server.left.message)
      return 2 as ExitCode
    }
    yield* Effect.logInfo(
      `Probes on http://${settings.healthCheckHost}:${server.right.port} (/health, /ready, /metrics)`,
    )
    const skipGrace = Queue.take(signals).pipe(
      Effect.tap((signal) =>
        Effect.logWarning(`${signal} received again: skipping the rest of the grace period`)
      ),
      Effect.asVoid,
    )
    const main = yield* Effect.fork(
      Effect.gen(function* () {
        const running = yield* begin(life, skipGrace).pipe(Scope.extend(lifeScope))
        yield* consumingEnds(life, running)
        return 0 as ExitCode
      }).pipe(
        Effect.catchAll(exitCodeOf),
        // A defect (in the transport, the engine) is a failure of the process, not of `run`:
        // the shutdown must still drain, run the hooks and close.
        Effect.catchAllCause((cause) =>
          Cause.isInterruptedOnly(cause)
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
    const code = yield* closeLife(life, main, lifeScope, first)
    yield* SubscriptionRef.set(life.state, LifecycleState.Stopped({ exitCode: code }))
    return code
  })

/**
 * The end of the process's life: a startup still under way is cancelled, the life's scope closed
 * (the drain, the shutdown hooks, the transport), and handlers that ignored their signal waited
 * for; raced against {@link shutdownBound} from outside, because a time limit inside a finalizer
 * never fires.
 */
const closeLife = <A, I, O, R>(
  life: Life<A, I, O, R>,
  main: Fiber.RuntimeFiber<ExitCode>,
  lifeScope: Scope.CloseableScope,
  first: Option.Option<ExitCode>,
): Effect.Effect<ExitCode, never, R> => {
  const bound = shutdownBound(life.settings.shutdownGrace)
  return Effect.gen(function* () {
    yield* Fiber.interrupt(main)
    yield* Scope.close(lifeScope, Exit.void)
    const pending = life.handlers.pending()
    for (const call of pending) {
      yield* Effect.logError(
        `The handler of task ${call.taskId} ignored its AbortSignal and is still running`,
      ).pipe(Effect.annotateLogs({ task_id: call.taskId }))
    }
    if (pending.length > 0) {
      yield* Effect.promise(() => Promise.allSettled(pending.map((call) => call.promise)))
    }
    const code: ExitCode = Option.getOrElse(first, () => 0 as const)
    return life.hooksClean ? code : (code === 0 ? 1 : code)
  }).pipe(
    // `disconnect`: a shutdown that refuses to be interrupted is left behind, not awaited.
    Effect.disconnect,
    Effect.timeoutOption(bound),
    Effect.flatMap(Option.match({
      onSome: Effect.succeed,
      onNone: () =>
        Effect.as(
          Effect.logError(`The shutdown did not end within ${Duration.format(bound)}: exiting`),
          1 as const,
        ),
    })),
    Effect.catchAllCause((cause) =>
      Effect.as(Effect.logError("The shutdown failed", Cause.pretty(cause)), 1 as const)
    ),
  )
}

/**
 * The whole life of a worker process, as an Effect that returns the exit code and never exits
 * the process itself (`Worker.run` and the CLI do). The shutdown after a signal is bounded by
 * {@link shutdownBound} whatever a handler, a hook or the broker does.
 *
 * @since 0.1.0
 * @category running
 */
export const run = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  options: RunOptions = {},
): Effect.Effect<ExitCode, never, Process | R> =>
  Effect.scoped(
    Effect.gen(function* () {
      const read = yield* processSettings(worker, options)
      if (Either.isLeft(read)) {
        yield* Effect.flatMap(Process, (process) => process.writeErr(read.left))
        return 2 as ExitCode
      }
      return yield* logged(read.right, live(worker, read.right, options))
    }).pipe(Effect.annotateLogs({ service: worker.name })),
  )
