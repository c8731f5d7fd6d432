/**
 * A worker: its definition (`make`, validated as it loads) and the ways to run it — `serve` and
 * `layer` inside an Effect program, `consume` for the bare engine, `run` as the process, and
 * `launch` for an app's layer as the process.
 *
 * @since 0.1.0
 */
import type * as Config from "effect/Config"
import * as Deferred from "effect/Deferred"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import { launch as launchApp } from "./internal/lifecycle/launch.ts"
import type { LifeOptions, StartError } from "./internal/lifecycle/life.ts"
import type { RunOptions } from "./internal/lifecycle/process.ts"
import type { ConsumingError } from "./internal/lifecycle/state.ts"
import * as Lifecycle from "./Lifecycle.ts"
import * as MemoryBroker from "./MemoryBroker.ts"
import * as Probes from "./Probes.ts"
import * as Process from "./Process.ts"
import type * as Settings from "./Settings.ts"
import type { Transport } from "./Transport.ts"
import type { Worker } from "./WorkerDefinition.ts"
import type { ServicesError } from "./WorkerError.ts"
import * as WorkerProgram from "./WorkerProgram.ts"

export * from "./WorkerDefinition.ts"

// The types the ways to run a worker name, each defined where its code is.
export type { DrainReport } from "./Drain.ts"
export type { LifeOptions, StartError } from "./internal/lifecycle/life.ts"
export type { RunOptions } from "./internal/lifecycle/process.ts"
export type { ConsumingError } from "./internal/lifecycle/state.ts"
export type { ExitCode } from "./Process.ts"
export type { RunningWorker } from "./WorkerProgram.ts"

/**
 * Consumes in the current scope and returns the running worker, with none of the lifecycle
 * (settings and transport from the context, no hooks), its definition's services (`layer`) built
 * in the scope first. Closing the scope interrupts whatever is in hand (each such task is
 * requeued); call `drain` first for a graceful stop, as {@link serve} does. An app uses
 * {@link layer} or {@link serve}.
 *
 * @since 0.2.0
 * @category running
 */
export const consume = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Effect.Effect<
  WorkerProgram.RunningWorker,
  ServicesError,
  Scope.Scope | Settings.Settings | Transport | R
> => WorkerProgram.consume(worker)

/**
 * Lives the worker's whole life inside a program until it ends or the program is interrupted:
 * settings (the definition's, the environment's, `options.settings`, or a `Settings` in the
 * context), startup hooks, the transport (RabbitMQ at `BROKER_URL`, or a `Transport` in the
 * context), consuming; then the bounded drain, the shutdown hooks, and the transport closed.
 * Fails on what stops it from starting (invalid settings, a startup hook, refused credentials,
 * a conflicting queue). Never exits the process.
 *
 * @since 0.1.0
 * @category running
 */
export const serve: <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options?: LifeOptions,
) => Effect.Effect<void, StartError | ConsumingError, R> = Lifecycle.serve

/**
 * The worker as a scoped layer inside an app: built once the worker has started and connected
 * (its settings, startup hooks and transport as {@link serve} has them; a failure to start fails
 * the layer); released by the drain, the shutdown hooks and the transport's close, before the
 * app's own services are. It provides the worker's probes: serve them with `Probes.layer` on
 * their own port, or add them to the app's `effect/http` router with `Probes.layerRoutes()`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options?: LifeOptions,
): Layer.Layer<Probes.WorkerProbes, StartError | ConsumingError, R> =>
  Layer.effect(
    Probes.WorkerProbes,
    Effect.map(Lifecycle.make(worker, options), (started) => started.probes),
  )

/**
 * {@link layer} with the settings read from `config` (e.g. an app's `Config.all({ … })`) on top
 * of the environment and the definition.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  config: Config.Config<Settings.SettingsOverrides>,
  options?: Omit<LifeOptions, "settings">,
): Layer.Layer<
  Probes.WorkerProbes,
  StartError | ConsumingError | Config.ConfigError,
  R
> =>
  Layer.unwrap(
    Effect.map(config, (settings) => layer(worker, { ...options, settings })),
  )

/**
 * {@link layer} on the embedded broker, which the layer provides too: the app (or its tests)
 * publishes tasks with `MemoryBroker.publish` and reads what the worker published.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerMemory = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options?: Omit<LifeOptions, "transport">,
): Layer.Layer<
  Probes.WorkerProbes | MemoryBroker.MemoryBroker,
  StartError | ConsumingError,
  R
> =>
  Layer.unwrap(Effect.gen(function* () {
    // One broker, in the layer's scope: the transport's and the app's.
    const broker = Layer.succeed(MemoryBroker.MemoryBroker, yield* MemoryBroker.make())
    const transport = MemoryBroker.layerTransport().pipe(Layer.provide(broker))
    return Layer.merge(layer(worker, { ...options, transport }), broker)
  }))

/**
 * A worker process started by {@link run} or {@link launch}.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunningProcess {
  /** The exit code, once the worker has ended (the process exits with it, unless stopped). */
  readonly exited: Promise<Process.ExitCode>
  /**
   * Stops the worker as a signal would (the drain, the shutdown hooks, the close) without
   * exiting the process: for a program that embeds the worker and owns its process.
   */
  readonly stop: () => Promise<Process.ExitCode>
}

/**
 * What {@link run} asks of a worker whose handler requires services `R` and is given no layer:
 * a type error that names them first, where the worker's type alone would name a hook it may
 * not have (`onIdle`).
 *
 * @since 0.2.0
 * @category models
 */
export interface HandlerRequires<R> {
  readonly "the handler requires services: give them with Worker.run(worker, { layer })": R
}

/**
 * Runs the worker as the process: reads and validates the settings, runs the startup hooks,
 * consumes (RabbitMQ at `BROKER_URL`, or the embedded broker with `WORKER_TRANSPORT=memory`),
 * drains on SIGTERM or SIGINT, and exits with the spec's code (0 clean, 1 failure, 2
 * configuration). For a script: `if (import.meta.main) Worker.run(worker)`. A worker whose
 * handler requires services gets them from `options.layer`.
 *
 * @since 0.1.0
 * @category running
 */
export function run<A, I, O, R>(
  worker: Worker<A, I, O, R> & ([R] extends [never] ? unknown : HandlerRequires<R>),
  options?: RunOptions,
): RunningProcess
export function run<A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options: RunOptions & { readonly layer: Layer.Layer<R, unknown> },
): RunningProcess
export function run<A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options?: RunOptions & { readonly layer?: Layer.Layer<R, unknown> },
): RunningProcess {
  return runProcess((stopped) =>
    Lifecycle.run(worker, {
      ...options,
      stop: Effect.raceFirst(options?.stop ?? Effect.never, stopped),
    }).pipe(
      Effect.provide(options?.layer ?? (Layer.empty as Layer.Layer<R>)),
      Effect.catchCause((cause) =>
        Effect.as(Effect.logError("The worker's services could not be built", cause), 1 as const)
      ),
    )
  )
}

/**
 * `program` as the process (`Process.runMain`), with the handle on it: `stopped` completes on
 * the handle's `stop()`, after which the process is its owner's and is not exited.
 */
const runProcess = (
  program: (
    stopped: Effect.Effect<void>,
  ) => Effect.Effect<Process.ExitCode, never, Process.Process>,
): RunningProcess => {
  const stopped = Deferred.makeUnsafe<void>()
  let owned = true
  const exited = Process.runMain(program(Deferred.await(stopped)), { exits: () => owned })
  return {
    exited,
    stop: () => {
      owned = false
      Deferred.doneUnsafe(stopped, Effect.void)
      return exited
    },
  }
}

/**
 * How to launch an app's layer as the process.
 *
 * @since 0.2.0
 * @category models
 */
export interface LaunchOptions {
  /** Ends the app as a signal would (`launch`'s handle): a clean stop, exit code 0. */
  readonly stop?: Effect.Effect<void> | undefined
  /**
   * The grace the app's workers drain within, which the shutdown's bound allows for: by
   * default `WORKER_SHUTDOWN_GRACE_S`, as their settings read it. Give it when the app sets
   * their `shutdownGrace` in code.
   */
  readonly shutdownGrace?: Duration.Input | undefined
}

/**
 * Runs an app's layer as the process, as {@link run} runs a bare worker: the layer built (one
 * that includes {@link layer}: the worker starts and connects), then held until SIGTERM or
 * SIGINT, the launcher's exit (`npx` gone), or the end of a worker's life in it (a job done,
 * `worker.stop()`, a failure); its release is the worker's drain, its shutdown hooks and the
 * transport's close, then the app's own services. A second signal skips the rest of the drain's
 * grace. Logs JSON lines, as `Worker.run` does, and exits: 0 clean stop, 1 failure (the layer
 * failed to build, a worker failed, a shutdown hook failed, a defect, the shutdown past its
 * bound), 2 configuration (invalid settings, refused credentials, an unknown vhost, a conflicting
 * queue, a probe port taken, a missing service), with one line saying why. The shutdown ends
 * within `max(grace, 5) + 17` seconds.
 *
 * @example
 * ```ts
 * const App = Probes.layer.pipe(
 *   Layer.provideMerge(Worker.layer(worker)),
 *   Layer.provide(DatabaseLive),
 * )
 * if (import.meta.main) Worker.launch(App)
 * ```
 *
 * @since 0.2.0
 * @category running
 */
export const launch = <ROut, E>(
  app: Layer.Layer<ROut, E, never>,
  options: LaunchOptions = {},
): RunningProcess =>
  runProcess((stopped) =>
    launchApp(app, Effect.raceFirst(options.stop ?? Effect.never, stopped), options.shutdownGrace)
  )
