/**
 * A worker's life in a scope, as one layer graph ({@link layer}): the settings, the log settings,
 * the definition's services, the life's own state and runtime figures, the startup hooks, the
 * transport (with job mode's intake over it), and the program consuming, whose finalizer is the
 * shutdown. Closing the scope releases them in the reverse order: the drain and the shutdown
 * hooks, then the transport, the services, and only then what the scope's owner holds.
 * `Lifecycle.make`, `serve` and `run` all build it.
 */
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as MutableRef from "effect/MutableRef"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import * as Ref from "effect/Ref"
import * as References from "effect/References"
import * as Stream from "effect/Stream"
import * as SubscriptionRef from "effect/SubscriptionRef"
import * as AmqpTransport from "../../AmqpTransport.ts"
import * as EventLoop from "../../EventLoop.ts"
import * as JobMode from "../../JobMode.ts"
import * as Probes from "../../Probes.ts"
import * as ProcessModule from "../../Process.ts"
import { Process } from "../../Process.ts"
import * as RuntimeMetrics from "../../RuntimeMetrics.ts"
import * as Settings from "../../Settings.ts"
import { type ConnectionStatus, isLive, Transport } from "../../Transport.ts"
import type { Worker } from "../../WorkerDefinition.ts"
import {
  type BrokerUnreachable,
  type ServicesError,
  type SettingsError,
  StartupHookError,
  type TransportError,
} from "../../WorkerError.ts"
import * as WorkerLogger from "../../WorkerLogger.ts"
import * as WorkerProgram from "../../WorkerProgram.ts"
import { redactUrl } from "../amqp/errors.ts"
import { timeoutDetached } from "../detach.ts"
import { layerMemoryTrial } from "../memory/trial.ts"
import { watchHandlers } from "./handlerWatch.ts"
import * as Hooks from "./hooks.ts"
import { type Observed, type ObservedConnection, probesOf } from "./probes.ts"
import { runShutdownHooks } from "./shutdownHooks.ts"
import { type ConsumingError, LifecycleState, moveTo } from "./state.ts"

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
 * Why a worker could not start: its settings, its services (the definition's `layer`), a
 * startup hook, or its transport (refused
 * credentials, a queue declared with other arguments, no `BROKER_URL`, a job's broker out of
 * reach past `WORKER_JOB_CONNECT_TIMEOUT_S`).
 *
 * @since 0.1.0
 * @category models
 */
export type StartError =
  | SettingsError
  | ServicesError
  | StartupHookError
  | TransportError
  | BrokerUnreachable

/** A worker's life: what its steps share, made by the first step after the settings. */
export interface Life<A, I, O, R> extends Observed<R> {
  readonly worker: Worker<A, I, O, R>
  /** The worker as its program runs it: its handler calls watched. */
  readonly watched: Worker<A, I, O, R>
  readonly probes: Probes.ProbeServerOptions
  /** Where the transport consumes, as the log names it: the broker's URL without its password. */
  readonly broker: Ref.Ref<string>
  /** In job mode, the deliveries the broker took back unsettled (`JobMode.countTakenBack`). */
  readonly takenBack: MutableRef.MutableRef<number>
}

/** The life being built, for the steps after its first. */
export class CurrentLife extends Context.Service<CurrentLife, Life<any, any, any, any>>()(
  "@async-task/worker/internal/lifecycle/Life",
) {}

/** The worker consuming: the last step, what the entry points wait on. */
export class CurrentProgram extends Context.Service<CurrentProgram, {
  readonly running: WorkerProgram.RunningWorker
  readonly status: SubscriptionRef.SubscriptionRef<ConnectionStatus>
}>()("@async-task/worker/internal/lifecycle/CurrentProgram") {}

/**
 * The most the shutdown may take after the first signal: the grace period (at least 5 s), then
 * 5 s for the requeues, 5 s to close the connection, 5 s for the shutdown hooks and 2 s of slack.
 */
export const shutdownBound = (grace: Duration.Duration): Duration.Duration =>
  Duration.sum(Duration.max(grace, Duration.seconds(5)), Duration.seconds(17))

/** The process's transport: RabbitMQ at `BROKER_URL`, or the embedded broker for local trials. */
export const layerTransport = (
  settings: Settings.WorkerSettings,
): Layer.Layer<Transport, TransportError, Settings.Settings | Process> =>
  settings.transport === "memory" ? layerMemoryTrial : AmqpTransport.layer

// --- The steps, in the order they are built ---

/** The settings: the context's, else the definition's with the environment and the overrides. */
const settingsStep = <A, I, O, R>(worker: Worker<A, I, O, R>, options: LifeOptions) =>
  Layer.effect(
    Settings.Settings,
    Effect.flatMap(
      Effect.serviceOption(Settings.Settings),
      Option.match({
        onSome: Effect.succeed,
        onNone: () => Settings.make(worker, options.settings),
      }),
    ),
  )

/** The broker's password, never to be written in an error's text. */
const secretsOf = (settings: Settings.WorkerSettings): ReadonlyArray<string> =>
  Option.match(settings.brokerUrl, {
    onNone: () => [],
    onSome: (url) => {
      try {
        return [decodeURIComponent(new URL(Redacted.value(url)).password)]
      } catch {
        return []
      }
    },
  })

/**
 * The log settings of the life, for every step after and every fiber forked in them: the level,
 * how much of an error's text a line shows, the secrets it never shows, and the `service`.
 */
export const logContext = (
  settings: Settings.WorkerSettings,
  service: string,
): Effect.Effect<Context.Context<never>> =>
  Effect.map(
    References.CurrentLogAnnotations,
    (annotations) =>
      Context.make(References.MinimumLogLevel, settings.logLevel).pipe(
        Context.add(WorkerLogger.CurrentErrorText, settings.logErrorText),
        Context.add(WorkerLogger.CurrentRedactions, secretsOf(settings)),
        Context.add(References.CurrentLogAnnotations, { ...annotations, service }),
      ),
  )

const loggingStep = (service: string) =>
  Layer.effectContext(Effect.flatMap(Settings.Settings, (s) => logContext(s, service)))

/**
 * The life itself, in the `Starting` state, with its probes, its runtime figures sampled and its
 * event loop watched (the engine reads the watch).
 */
const lifeStep = <A, I, O, R>(worker: Worker<A, I, O, R>, options: LifeOptions) =>
  Layer.effectContext(Effect.gen(function* () {
    yield* RuntimeMetrics.make()
    const loop = yield* EventLoop.make()
    const settings = yield* Settings.Settings
    const context = yield* Effect.context<R>()
    const { watched, watch } = watchHandlers(worker, yield* Clock.Clock)
    const observed: Observed<R> = {
      worker,
      settings,
      state: yield* Ref.make<LifecycleState>(LifecycleState.Starting()),
      handlers: watch,
      connection: yield* Ref.make(Option.none<ObservedConnection>()),
      versionFile: options.versionFile,
    }
    const probes = probesOf(observed, context)
    const life: Life<A, I, O, R> = {
      ...observed,
      worker,
      watched,
      probes,
      broker: yield* Ref.make("the transport given"),
      takenBack: MutableRef.make(0),
    }
    return Context.make(CurrentLife, life).pipe(
      Context.add(Probes.WorkerProbes, probes),
      Context.add(EventLoop.EventLoop, loop),
    )
  }))

const startupStep = Layer.effectDiscard(Effect.gen(function* () {
  const life = yield* CurrentLife
  for (const hook of life.worker.onStartup) {
    yield* Hooks.toEffect(hook).pipe(Effect.mapError((cause) => new StartupHookError({ cause })))
  }
}))

/**
 * The process in context, else the real one: the embedded broker of a local trial
 * (`WORKER_TRANSPORT=memory`) reads its tasks from standard input.
 */
const withProcess = <A, E, R>(
  layer: Layer.Layer<A, E, R | Process>,
): Layer.Layer<A, E, Exclude<R, Process>> =>
  Layer.unwrap(Effect.map(
    Effect.serviceOption(Process),
    (given) => Option.isSome(given) ? layer : Layer.provide(layer, ProcessModule.layer),
  )) as Layer.Layer<A, E, Exclude<R, Process>>

/** The broker the settings name, as a log line may show it: its URL without the password. */
const brokerOf = (settings: Settings.WorkerSettings): string =>
  settings.transport === "memory" ? "the embedded broker" : Option.match(settings.brokerUrl, {
    onNone: () => "no broker",
    onSome: (url) => redactUrl(Redacted.value(url)),
  })

/**
 * The transport: `options.transport`, else a `Transport` in the context, else the settings' own
 * (RabbitMQ at `BROKER_URL`, or the embedded trial broker); in job mode, its intake limited.
 */
const transportStep = (options: LifeOptions) => {
  const built = Layer.unwrap(Effect.gen(function* () {
    const given = yield* Effect.serviceOption(Transport)
    if (Option.isSome(given) && options.transport === undefined) {
      return Layer.succeed(Transport, given.value)
    }
    if (options.transport !== undefined) return options.transport
    const settings = yield* Settings.Settings
    yield* Ref.set((yield* CurrentLife).broker, brokerOf(settings))
    return withProcess(layerTransport(settings))
  }))
  const limited = Layer.effect(
    Transport,
    Effect.gen(function* () {
      const transport = yield* Transport
      const life = yield* CurrentLife
      yield* Ref.set(life.connection, Option.some(transport))
      const counted = life.settings.mode === "job"
        ? JobMode.countTakenBack(transport, life.takenBack)
        : transport
      // Done taking: no longer ready, while the last tasks finish.
      return JobMode.intake(counted, life.settings, beginDraining(life))
    }),
  )
  return Layer.provide(limited, built)
}

/**
 * What ends the drain's grace early where the life's own steps give nothing (`Worker.layer`
 * inside an app): the process (`Worker.run`, the CLI, `Worker.launch`) provides its second stop;
 * by default nothing does.
 */
export const SkipGrace = Context.Reference<Effect.Effect<void>>("@async-task/worker/SkipGrace", {
  defaultValue: () => Effect.never,
})

/**
 * What a worker's life tells whoever runs it as the process (`untilStopped`: `Worker.run`, the
 * CLI, `Worker.launch`): that a shutdown hook failed or ran out of time (the exit is then 1), and,
 * inside an app (`Lifecycle.make`, under `Worker.layer`), that consuming has ended, drained (with
 * the error, if it failed: a job's end or `worker.stop()` is none). By default nobody listens: an
 * app that composes the layer itself decides.
 */
export const LifeReports = Context.Reference<{
  readonly ended: (error: Option.Option<ConsumingError>) => Effect.Effect<void>
  readonly hooksFailed: Effect.Effect<void>
}>("@async-task/worker/LifeReports", {
  defaultValue: () => ({ ended: () => Effect.void, hooksFailed: Effect.void }),
})

/** The share of {@link shutdownBound} left to the transport's close, after the drain and hooks. */
const CLOSE_SHARE = Duration.seconds(5)

/** The life is `Draining`, unless it has `Failed`: that says why the shutdown came. */
export const beginDraining = <A, I, O, R>(life: Life<A, I, O, R>): Effect.Effect<void> =>
  moveTo(life.state, LifecycleState.Draining())

/**
 * The shutdown, as the finalizer of the consuming step: the drain within the grace
 * ({@link SkipGrace} ends it early), then the shutdown hooks; bounded by
 * {@link shutdownBound} less the transport's close whatever they do, with a bound that does not
 * wait for what it cuts short (`timeoutDetached`: Effect 4's time limits wait for the loser, even
 * in a finalizer).
 */
const shutdown = <A, I, O, R>(
  life: Life<A, I, O, R>,
  running: WorkerProgram.RunningWorker,
): Effect.Effect<void, never, R> => {
  const bound = Duration.subtract(shutdownBound(life.settings.shutdownGrace), CLOSE_SHARE)
  const steps = Effect.gen(function* () {
    yield* beginDraining(life)
    yield* running.drain({ skipGrace: yield* SkipGrace })
    return yield* runShutdownHooks(life.worker.onShutdown, life.settings.shutdownHooksTimeout)
  })
  return Effect.gen(function* () {
    const clean = yield* timeoutDetached(steps, bound)
    if (Option.isNone(clean)) {
      yield* Effect.logError(`The shutdown did not end within ${Duration.format(bound)}`)
    }
    if (!Option.getOrElse(clean, () => false)) yield* (yield* LifeReports).hooksFailed
  })
}

/**
 * Completes once the transport is connected (up, if blocked or stalled already); fails at once if
 * the worker fails first.
 */
const awaitConnected = (
  status: SubscriptionRef.SubscriptionRef<ConnectionStatus>,
  running: WorkerProgram.RunningWorker,
): Effect.Effect<void, ConsumingError> =>
  Effect.raceFirst(
    SubscriptionRef.changes(status).pipe(
      Stream.takeUntil(isLive),
      Stream.runDrain,
    ),
    Effect.andThen(running.await, Effect.never),
  )

/** The program consuming, connected; its finalizer is the shutdown. */
const consumingStep = Layer.effect(
  CurrentProgram,
  Effect.gen(function* () {
    const life = yield* CurrentLife
    const transport = yield* Transport
    // Its services are built already, by the services step.
    const running = yield* WorkerProgram.consume({ ...life.watched, layer: undefined })
    yield* Effect.addFinalizer(() => shutdown(life, running))
    yield* moveTo(life.state, LifecycleState.Running())
    const { mode, inQueue } = life.settings
    const name = life.worker.name
    const broker = yield* Ref.get(life.broker)
    yield* Effect.logInfo(`Worker ${name} connecting to ${broker} (${mode} mode, ${inQueue})`)
    yield* JobMode.whenConnected(
      awaitConnected(transport.status, running),
      transport.status,
      life.settings,
    )
    yield* Effect.logInfo(`Worker ${name} started in ${mode} mode on ${inQueue}, at ${broker}`)
    return { running, status: transport.status }
  }),
)

/**
 * Layers built in the order given, each with what the ones before it provide, all they provide
 * merged; closing the scope releases them in the reverse order.
 */
const inOrder = (...steps: ReadonlyArray<Layer.Any>): Layer.Layer<any, any, any> =>
  (steps as ReadonlyArray<Layer.Layer<any, any, any>>).reduce((built, step) =>
    step.pipe(Layer.provideMerge(built))
  )

/**
 * The life of `worker` as one layer graph: its steps in the order they are built. The shutdown
 * releases them in the reverse order, so that it goes:
 *
 * 1. the drain (intake stopped, in-flight tasks given the grace, the rest requeued), then the
 *    shutdown hooks: the consuming step's finalizer, within {@link shutdownBound};
 * 2. the transport: the broker connection closed;
 * 3. the probe server (`beforeStartup`), up until here so that `/ready` says `draining`;
 * 4. the runtime metrics and the event loop's watch;
 * 5. the definition's services (its `layer`);
 * 6. only then what the scope's owner holds (an app's own layers).
 *
 * `beforeStartup` runs right after the life is made.
 */
export const layer = <A, I, O, R, E2 = never>(
  worker: Worker<A, I, O, R>,
  options: LifeOptions,
  steps: {
    readonly beforeStartup?: Layer.Layer<never, E2, Probes.WorkerProbes> | undefined
  } = {},
): Layer.Layer<
  CurrentProgram | CurrentLife | Probes.WorkerProbes,
  StartError | ConsumingError | E2,
  R
> =>
  // Fresh: Effect 4 shares a layer value across the graphs built with one memo map, and each
  // worker of an app lives a life of its own.
  Layer.fresh(inOrder(
    settingsStep(worker, options),
    loggingStep(worker.name),
    WorkerProgram.layerServices(worker),
    lifeStep(worker, options),
    steps.beforeStartup ?? Layer.empty,
    startupStep,
    transportStep(options),
    consumingStep,
  ))

/**
 * How consuming ends — the transport or `onIdle` failing, a job done (failing if the broker took
 * back a task it held) or out of reach of its broker, `worker.stop()` — with the life's state
 * `Failed` on a failure.
 */
export const consumingEnds = <A, I, O, R>(
  life: Life<A, I, O, R>,
  program: CurrentProgram["Service"],
): Effect.Effect<void, ConsumingError> => {
  const { running, status } = program
  return Effect.raceFirst(
    JobMode.consumingEnds(running.await, running.inFlight, status, life.settings).pipe(
      Effect.andThen(JobMode.failIfTakenBack(life.takenBack)),
    ),
    running.stopRequested,
  ).pipe(
    Effect.tapError((error) => moveTo(life.state, LifecycleState.Failed({ error }))),
  )
}

/** The built life's parts. */
export const partsOf = (context: Context.Context<CurrentLife | CurrentProgram>) => ({
  life: Context.get(context, CurrentLife),
  program: Context.get(context, CurrentProgram),
})
