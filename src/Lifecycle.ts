/**
 * The life of a worker, one for its three entry points: the settings first, the startup hooks,
 * the transport and consuming; then, when its scope closes (a signal, an app's shutdown), the
 * bounded drain, the shutdown hooks, and the transport closed — only then what the scope's owner
 * holds. `Worker.layer` lives it in a scope ({@link make}), `Worker.serve` as a program
 * ({@link serve}), `Worker.run` and the CLI as the process ({@link run}), with probes, signals and
 * the spec's exit code. The process comes from the {@link Process} service (the real one only
 * where none is given and a local trial reads standard input).
 *
 * The life's steps are one layer graph, in `internal/lifecycle/life.ts`; the process's life is in
 * `internal/lifecycle/process.ts`, what the probes read in `internal/lifecycle/probes.ts`.
 *
 * @since 0.1.0
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Ref from "effect/Ref"
import * as Result from "effect/Result"
import type * as Scope from "effect/Scope"
import * as Life from "./internal/lifecycle/life.ts"
import type { LifeOptions, StartError } from "./internal/lifecycle/life.ts"
import { live, processSettings, type RunOptions } from "./internal/lifecycle/process.ts"
import type { ConsumingError, LifecycleState } from "./internal/lifecycle/state.ts"
import type * as Probes from "./Probes.ts"
import { type ExitCode, Process } from "./Process.ts"
import * as Settings from "./Settings.ts"
import type { Transport } from "./Transport.ts"
import type * as Worker from "./WorkerDefinition.ts"
import type { TransportError } from "./WorkerError.ts"
import type { RunningWorker } from "./WorkerProgram.ts"

export { type ConsumingError, LifecycleState } from "./internal/lifecycle/state.ts"
export type { LifeOptions, StartError } from "./internal/lifecycle/life.ts"
export type { RunOptions } from "./internal/lifecycle/process.ts"

/**
 * A worker living its life in a scope, as {@link make} gives it.
 *
 * @since 0.2.0
 * @category models
 */
export interface StartedWorker {
  readonly running: RunningWorker
  /** Its probes, for `Probes.layer` or an app's own router. */
  readonly probes: Probes.ProbeServerOptions
  /** Where it is in its life now. */
  readonly state: Effect.Effect<LifecycleState>
}

/**
 * The most the shutdown may take after the first signal: the grace period (at least 5 s), then
 * 5 s for the requeues, 5 s to close the connection, 5 s for the shutdown hooks and 2 s of slack.
 *
 * @since 0.1.0
 * @category constants
 */
export const shutdownBound: (grace: Duration.Duration) => Duration.Duration = Life.shutdownBound

/**
 * The process's transport: RabbitMQ at `BROKER_URL`, or the embedded broker for local trials.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransport: (
  settings: Settings.WorkerSettings,
) => Layer.Layer<Transport, TransportError, Settings.Settings | Process> = Life.layerTransport

/**
 * Lives the worker's life in the current scope — settings, startup hooks, the transport,
 * consuming — and completes once it is connected. Closing the scope drains it (within the grace),
 * runs the shutdown hooks and closes the transport, in that order. Fails, without starting, on
 * invalid settings, a failing startup hook, refused credentials or a queue declared with other
 * arguments. After the start, a transport that fails for good (or `onIdle`) is logged and the
 * state is `Failed`: the app decides what next; `worker.stop()` (or a job done) drains it at once.
 *
 * @since 0.2.0
 * @category running
 */
export const make = <A, I, O, R>(
  worker: Worker.Worker<A, I, O, R>,
  options: LifeOptions = {},
): Effect.Effect<StartedWorker, StartError | ConsumingError, Scope.Scope | R> =>
  Effect.gen(function* () {
    const context = yield* Layer.build(Life.layer(worker, options))
    const { life, program } = Life.partsOf(context)
    const reports = yield* Life.LifeReports
    yield* Effect.forkScoped(
      Life.consumingEnds(life, program).pipe(
        Effect.matchEffect({
          onFailure: (error) =>
            Effect.andThen(
              Effect.logError(`The worker stopped: ${error.message}`),
              reports.ended(Option.some(error)),
            ),
          onSuccess: () =>
            Life.beginDraining(life).pipe(
              Effect.andThen(program.running.drain()),
              Effect.andThen(reports.ended(Option.none())),
            ),
        }),
        Effect.provideContext(context),
      ),
    )
    return { running: program.running, probes: life.probes, state: Ref.get(life.state) }
  })

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
): Effect.Effect<void, StartError | ConsumingError, R> =>
  Effect.scoped(Effect.gen(function* () {
    const context = yield* Layer.build(Life.layer(worker, options))
    const { life, program } = Life.partsOf(context)
    yield* Effect.provideContext(Life.consumingEnds(life, program), context)
  }))

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
  Effect.scoped(Effect.gen(function* () {
    const read = yield* processSettings(worker, options)
    if (Result.isFailure(read)) {
      yield* Effect.flatMap(Process, (process) => process.writeErr(read.failure))
      return 2 as ExitCode
    }
    const settings = read.success
    return yield* live(worker, settings, options).pipe(
      Effect.provideContext(yield* Life.logContext(settings, worker.name)),
      Effect.provideService(Settings.Settings, settings),
    )
  }))
