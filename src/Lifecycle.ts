/**
 * The life of a worker process: settings first, startup hooks, consume, then on SIGTERM or
 * SIGINT (or when a job is done) the bounded shutdown — drain, shutdown hooks, close — and the
 * spec's exit code. Process-free: the process comes from the {@link Process} service.
 *
 * @since 0.1.0
 */
import {
  Cause,
  Clock,
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
  Schedule,
  Scope,
  Stream,
  SubscriptionRef,
} from "effect"
import * as AmqpTransport from "./AmqpTransport.ts"
import { errorText } from "./internal/describe.ts"
import { kindOf } from "./internal/handlerResult.ts"
import * as Hooks from "./internal/hooks.ts"
import * as JobMode from "./JobMode.ts"
import { VERSION } from "./internal/version.ts"
import * as MemoryBroker from "./MemoryBroker.ts"
import * as Probes from "./Probes.ts"
import * as Prometheus from "./Prometheus.ts"
import * as RuntimeMetrics from "./RuntimeMetrics.ts"
import { type ExitCode, Process, type Signal } from "./Process.ts"
import * as Settings from "./Settings.ts"
import { type ConnectionStatus, Transport } from "./Transport.ts"
import type * as Worker from "./WorkerDefinition.ts"
import * as WorkerProgram from "./WorkerProgram.ts"
import { type IdleHookError, ProbeError, type TransportError } from "./WorkerError.ts"

/**
 * Where the process is in its life.
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
 * How to run a worker process.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunOptions {
  /** Settings given in code; they win over the environment. */
  readonly settings?: Settings.SettingsOverrides | undefined
  /** The `/__version__` document (default `/app/version.json`). */
  readonly versionFile?: string | undefined
  /** The transport; by default RabbitMQ at `BROKER_URL`, or the embedded broker (`WORKER_TRANSPORT=memory`). */
  readonly transport?: Layer.Layer<Transport, TransportError, Settings.Settings> | undefined
}

/**
 * The most the shutdown may take after the first signal: the grace period (at least 5 s), then
 * 5 s for the requeues, 5 s to close the connection, 5 s for the shutdown hooks and 2 s of slack.
 *
 * @since 0.1.0
 * @category constants
 */
export const shutdownBound = (grace: Duration.Duration): Duration.Duration =>
  Duration.sum(Duration.max(grace, Duration.seconds(5)), Duration.seconds(17))

class StartupFailed extends Data.TaggedError("StartupFailed")<{ readonly cause: unknown }> {}

/**
 * Runs hooks in order, all of them within `budget`, each with what is left of it. A hook that
 * refuses to be interrupted is left behind (`disconnect`) when its time is up, so that the hooks
 * after it still run.
 */
const runShutdownHooks = <R>(
  hooks: ReadonlyArray<Worker.Hook<R>>,
  budget: Duration.Duration,
): Effect.Effect<boolean, never, R> =>
  Effect.gen(function* () {
    const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(budget)
    let clean = true
    for (const [i, hook] of hooks.entries()) {
      // A hook still starts once the budget is spent, with a millisecond: time for one that
      // finishes at once (a flush) after one that hung, well within the bound's slack.
      const left = Math.max(1, deadline - (yield* Clock.currentTimeMillis))
      const result = yield* Hooks.toEffect(hook).pipe(
        Effect.interruptible,
        Effect.disconnect,
        Effect.timeoutOption(Duration.millis(left)),
        Effect.either,
      )
      if (Either.isLeft(result)) {
        clean = false
        yield* Effect.logError(`Shutdown hook ${i + 1} failed: ${errorText(result.left)}`)
      } else if (Option.isNone(result.right)) {
        clean = false
        yield* Effect.logError(
          `Shutdown hook ${i + 1} did not finish within the shutdown hooks' time (${
            Duration.format(budget)
          })`,
        )
      }
    }
    return clean
  })

/** A handler call still running. */
interface Running {
  readonly taskId: string
  readonly startedAt: number
  /** An `async` handler's Promise. */
  readonly promise?: Promise<unknown>
}

/**
 * The worker with its handler calls watched, for `/health` and the shutdown: a handler still
 * running long past its deadline has stopped answering to interruption, and an `async` handler
 * whose Promise is still pending after the drain ignored its `AbortSignal`.
 */
const watchHandlers = <A, I, O, R>(worker: Worker.Worker<A, I, O, R>, clock: Clock.Clock) => {
  const running = new Set<Running>()
  const watched: Worker.Worker<A, I, O, R> = {
    ...worker,
    handler: (input, ctx) => {
      const startedAt = clock.unsafeCurrentTimeMillis()
      const result = worker.handler(input, ctx)
      const kind = kindOf(result)
      if (kind === "effect") {
        const effect = result as Effect.Effect<O, unknown, R>
        const call: Running = { taskId: ctx.taskId, startedAt }
        running.add(call)
        return Effect.ensuring(effect, Effect.sync(() => void running.delete(call)))
      }
      if (kind === "value") return result
      const promise = Promise.resolve(result as PromiseLike<O>)
      const call: Running = { taskId: ctx.taskId, startedAt, promise }
      const settled = () => void running.delete(call)
      running.add(call)
      promise.then(settled, settled)
      return promise
    },
  }
  /** The first call running past `limit` after its start, if any. */
  const overrun = (limit: Duration.Duration): Option.Option<Running> => {
    const since = clock.unsafeCurrentTimeMillis() - Duration.toMillis(limit)
    for (const call of running) if (call.startedAt < since) return Option.some(call)
    return Option.none()
  }
  const pending = () => [...running].filter((call) => call.promise !== undefined)
  return { watched, overrun, pending }
}

/**
 * The embedded broker for local trials: each line of standard input is a task (a whole
 * envelope, or just its `data.body`), each message published is printed on standard output,
 * and intake stops once input has ended and every task is settled.
 */
const layerMemoryTrial: Layer.Layer<Transport, never, Settings.Settings | Process> = Layer.scoped(
  Transport,
  Effect.gen(function* () {
    const broker = yield* MemoryBroker.make()
    const settings = yield* Settings.Settings
    const process = yield* Process
    const transport = yield* broker.transport({
      inQueue: settings.inQueue,
      outQueue: settings.outQueue,
      capacity: settings.concurrency,
      leaseDuration: settings.consumerTimeout,
    })
    let n = 0
    const toEnvelope = (line: string): string => {
      try {
        const parsed: unknown = JSON.parse(line)
        if (typeof parsed === "object" && parsed !== null && "task_id" in parsed) return line
      } catch {
        return line // not JSON: published as it is, to be refused as poison, as RabbitMQ would
      }
      n += 1
      return `{"task_id":"local-${n}","data":{"message_type":"submission","body":${line}}}`
    }
    const settled = Effect.zipWith(
      broker.ready(settings.inQueue),
      broker.unacked(settings.inQueue),
      (ready, unacked) => ready + unacked === 0,
    )
    yield* process.stdinLines.pipe(
      Stream.filter((line) => line.trim() !== ""),
      Stream.runForEach((line) => broker.publish(settings.inQueue, toEnvelope(line))),
      Effect.zipRight(
        settled.pipe(Effect.repeat({ schedule: Schedule.spaced("20 millis"), until: (s) => s })),
      ),
      Effect.zipRight(transport.stopIntake),
      Effect.forkScoped,
    )
    const decoder = new TextDecoder()
    return Transport.of({
      ...transport,
      publish: (body, type) =>
        Effect.tap(transport.publish(body, type), () => process.writeOut(decoder.decode(body))),
    })
  }),
)

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

/** What the steps of a process's life share: where it is, and what it has started. */
interface Life<A, I, O, R> {
  readonly worker: Worker.Worker<A, I, O, R>
  readonly settings: Settings.WorkerSettings
  readonly options: RunOptions
  readonly state: SubscriptionRef.SubscriptionRef<LifecycleState>
  readonly handlers: ReturnType<typeof watchHandlers<A, I, O, R>>
  /** Where the transport and the running worker live: closed after the shutdown hooks. */
  readonly workerScope: Scope.CloseableScope
  running: Worker.RunningWorker | undefined
  connection: SubscriptionRef.SubscriptionRef<ConnectionStatus> | undefined
  startupDone: boolean
}

/** The settings, checked: a configuration problem is one line on stderr and exit code 2. */
const readSettings = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  options: RunOptions,
): Effect.Effect<Either.Either<Settings.WorkerSettings, string>> =>
  Effect.gen(function* () {
    const read = yield* Effect.either(
      Settings.make(
        { name: worker.name, timeout: worker.timeout, concurrency: worker.concurrency },
        options.settings,
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

/** The readiness components: the SDK's own (`broker`, `draining`), then the worker's probes. */
const readiness = <A, I, O, R>(
  life: Life<A, I, O, R>,
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

/** The probe server, up from the start to the end of the shutdown (in `run`'s own scope). */
const serveProbes = <A, I, O, R>(life: Life<A, I, O, R>, context: Context.Context<R>) => {
  const settings = life.settings
  return Probes.make({
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
  })
}

/** How the worker's consuming ends: its transport or hook failing, a job done, `stop()`. */
const consumingEnds = <A, I, O, R>(
  life: Life<A, I, O, R>,
  running: Worker.RunningWorker,
  transport: Transport["Type"],
): Effect.Effect<void, TransportError | IdleHookError | JobMode.BrokerUnreachable> => {
  const settings = life.settings
  const ended = settings.mode !== "job" ? running.await : Effect.raceFirst(
    Effect.raceFirst(
      running.await,
      JobMode.awaitIdle(running.inFlight, transport.status, settings.jobIdleTimeout).pipe(
        Effect.tap(() =>
          Effect.logInfo(`Idle for ${Duration.format(settings.jobIdleTimeout)}: the job is done`)
        ),
      ),
    ),
    JobMode.failWhenUnreachable(transport.status, settings.jobConnectTimeout),
  )
  // `worker.stop()` ends the worker as a signal would.
  return Effect.raceFirst(ended, running.stopRequested)
}

/** The worker's startup hooks, its transport and its consuming, to the end of consuming. */
const consume = <A, I, O, R>(life: Life<A, I, O, R>) =>
  Effect.gen(function* () {
    const { settings, worker } = life
    for (const hook of worker.onStartup) {
      yield* Hooks.toEffect(hook).pipe(Effect.mapError((cause) => new StartupFailed({ cause })))
    }
    life.startupDone = true
    const transportContext = yield* Layer.buildWithScope(
      life.options.transport ?? layerTransport(settings),
      life.workerScope,
    ).pipe(Effect.provideService(Settings.Settings, settings))
    const transport = Context.get(transportContext, Transport)
    life.connection = transport.status
    const running = yield* WorkerProgram.start(life.handlers.watched).pipe(
      Scope.extend(life.workerScope),
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
    life.running = running
    yield* SubscriptionRef.set(life.state, LifecycleState.Running())
    yield* Effect.logInfo(
      `Worker ${worker.name} started in ${settings.mode} mode on ${settings.inQueue}`,
    )
    yield* consumingEnds(life, running, transport)
    return 0 as const
  })

/** {@link consume}, its failures made exit codes: it never fails. */
const main = <A, I, O, R>(life: Life<A, I, O, R>): Effect.Effect<ExitCode, never, R | Process> =>
  consume(life).pipe(
    Effect.catchAll((error) => {
      switch (error._tag) {
        case "StartupFailed":
          return Effect.as(
            Effect.logError(`A startup hook failed: ${errorText(error.cause)}`),
            1 as const,
          )
        case "BrokerUnreachable":
        case "IdleHookError":
          return Effect.as(Effect.logError(error.message), 1 as const)
        case "TransportError":
          // The transport has logged it; refused credentials or a conflicting queue are
          // configuration, which no restart mends.
          return Effect.succeed(error.isConfiguration ? 2 as const : 1 as const)
      }
    }),
    // A defect (in the transport, the engine) is a failure of the process, not of `run`: the
    // shutdown must still drain, run the hooks and close.
    Effect.catchAllCause((cause) =>
      Cause.isInterruptedOnly(cause)
        ? Effect.failCause(cause)
        : Effect.as(Effect.logError("The worker failed", cause), 1 as const)
    ),
  )

/**
 * The shutdown after `first` (the main program's code, or `None` for a signal): drain, stop the
 * main program (a signal during startup cancels the connection attempt and the startup hooks),
 * the shutdown hooks, close the transport, and wait for handlers that ignored their signal.
 */
const shutdown = <A, I, O, R>(
  life: Life<A, I, O, R>,
  signals: Queue.Dequeue<Signal>,
  mainFiber: Fiber.RuntimeFiber<ExitCode>,
  first: Option.Option<ExitCode>,
): Effect.Effect<ExitCode, never, R> =>
  Effect.gen(function* () {
    if (life.running !== undefined) {
      yield* SubscriptionRef.set(life.state, LifecycleState.Draining())
      yield* life.running.drain({
        skipGrace: Queue.take(signals).pipe(
          Effect.tap((signal) =>
            Effect.logWarning(`${signal} received again: skipping the rest of the grace period`)
          ),
        ),
      })
    }
    yield* Fiber.interrupt(mainFiber)
    const hooksClean = life.startupDone
      ? yield* runShutdownHooks(life.worker.onShutdown, life.settings.shutdownHooksTimeout)
      : true
    yield* Scope.close(life.workerScope, Exit.void)
    const pending = life.handlers.pending()
    if (pending.length > 0) {
      for (const call of pending) {
        yield* Effect.logError(
          `The handler of task ${call.taskId} ignored its AbortSignal and is still running`,
        ).pipe(Effect.annotateLogs({ task_id: call.taskId }))
      }
      yield* Effect.promise(() => Promise.allSettled(pending.map((call) => call.promise)))
    }
    const code: ExitCode = Option.getOrElse(first, () => 0 as const)
    return hooksClean ? code : (code === 0 ? 1 : code)
  })

/** {@link shutdown}, raced against {@link shutdownBound} from outside: it always ends in time. */
const boundedShutdown = <A, I, O, R>(
  life: Life<A, I, O, R>,
  shutdownEffect: Effect.Effect<ExitCode, never, R>,
): Effect.Effect<ExitCode, never, R> => {
  const bound = shutdownBound(life.settings.shutdownGrace)
  // `disconnect`: a shutdown that refuses to be interrupted is left behind, not awaited.
  return shutdownEffect.pipe(
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

/** The life after the settings: probes, the main program until it ends or a signal, the shutdown. */
const live = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  settings: Settings.WorkerSettings,
  options: RunOptions,
) =>
  Effect.gen(function* () {
    const process = yield* Process
    const context = yield* Effect.context<R>()
    const signals = yield* process.signals
    const life: Life<A, I, O, R> = {
      worker,
      settings,
      options,
      state: yield* SubscriptionRef.make<LifecycleState>(LifecycleState.Starting()),
      handlers: watchHandlers(worker, yield* Effect.clock),
      workerScope: yield* Scope.make(),
      running: undefined,
      connection: undefined,
      startupDone: false,
    }
    yield* RuntimeMetrics.make()
    const probes = yield* Effect.either(serveProbes(life, context))
    if (Either.isLeft(probes)) {
      yield* process.writeErr(probes.left.message)
      return 2 as ExitCode
    }
    yield* Effect.logInfo(
      `Probes on http://${settings.healthCheckHost}:${probes.right.port} (/health, /ready, /metrics)`,
    )
    const mainFiber = yield* Effect.fork(main(life))
    const first = yield* Effect.raceFirst(
      Fiber.join(mainFiber).pipe(Effect.map(Option.some)),
      Queue.take(signals).pipe(
        Effect.tap((signal) => Effect.logInfo(`${signal} received: shutting down`)),
        Effect.as(Option.none<ExitCode>()),
      ),
    )
    const code = yield* boundedShutdown(life, shutdown(life, signals, mainFiber, first))
    yield* SubscriptionRef.set(life.state, LifecycleState.Stopped({ exitCode: code }))
    return code
  }).pipe(Logger.withMinimumLogLevel(settings.logLevel))

/**
 * The whole life of a worker process, as an Effect that returns the exit code and never exits
 * the process itself (`Worker.run` and the CLI do). The shutdown after a signal is bounded by
 * {@link shutdownBound} whatever a handler, a hook or the broker does: it is raced against the
 * clock from outside, because a time limit inside a finalizer never fires.
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
      const read = yield* readSettings(worker, options)
      if (Either.isLeft(read)) {
        yield* Effect.flatMap(Process, (process) => process.writeErr(read.left))
        return 2 as ExitCode
      }
      return yield* live(worker, read.right, options)
    }).pipe(Effect.annotateLogs({ service: worker.name })),
  )
