/**
 * What a life's probes read: `/health` a handler past its deadline, `/ready` the broker, the
 * drain and the worker's own probes, `/metrics` the registry with the process's figures sampled
 * as of the scrape.
 */
import { type Context, Duration, Effect, Option, Ref, SubscriptionRef } from "effect"
import type { LifecycleState } from "../../Lifecycle.ts"
import type * as Probes from "../../Probes.ts"
import * as Prometheus from "../../Prometheus.ts"
import * as RuntimeMetrics from "../../RuntimeMetrics.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { ConnectionStatus } from "../../Transport.ts"
import type { Worker } from "../../WorkerDefinition.ts"
import { ProbeError } from "../../WorkerError.ts"
import { VERSION } from "../version.ts"
import * as Hooks from "./hooks.ts"
import type { HandlerWatch } from "./handlerWatch.ts"

/** What the probes read of a life. */
export interface Observed<R> {
  readonly worker: Worker<any, any, any, R>
  readonly settings: WorkerSettings
  readonly state: Ref.Ref<LifecycleState>
  readonly handlers: HandlerWatch
  /** The transport's status, once it is built. */
  readonly connection: Ref.Ref<Option.Option<SubscriptionRef.SubscriptionRef<ConnectionStatus>>>
  readonly versionFile: string | undefined
}

const notReady = (message: string) => Effect.fail(new ProbeError({ message }))

/** The readiness components: the SDK's own (`broker`, `draining`), then the worker's probes. */
const readiness = <R>(
  life: Observed<R>,
  context: Context.Context<R>,
): ReadonlyArray<Probes.ReadinessComponent> => [
  {
    name: "broker",
    check: Effect.flatMap(
      Ref.get(life.connection),
      Option.match({
        onNone: () => notReady("not connected yet"),
        onSome: (connection) =>
          Effect.flatMap(
            SubscriptionRef.get(connection),
            (status) =>
              status === "connected" ? Effect.void : notReady(`the broker connection is ${status}`),
          ),
      }),
    ),
  },
  {
    name: "draining",
    check: Effect.flatMap(
      Ref.get(life.state),
      (state) =>
        state._tag === "Running" || state._tag === "Starting"
          ? Effect.void
          : notReady("the worker is shutting down"),
    ),
  },
  ...Object.entries(life.worker.readiness).map(([name, probe]) => ({
    name,
    check: Effect.provideContext(Hooks.toEffect(probe), context),
  })),
]

/** The probes of a life, as `Probes.WorkerProbes` holds them. */
export const probesOf = <R>(
  life: Observed<R>,
  context: Context.Context<R>,
): Probes.ProbeServerOptions => {
  const settings = life.settings
  const overrun = Duration.sum(settings.taskTimeout, settings.taskOverrunGrace)
  return {
    host: settings.healthCheckHost,
    port: settings.healthCheckPort,
    health: Effect.sync(() =>
      Option.map(life.handlers.overrun(overrun), (call) => ({
        code: "TASK_OVERRUN",
        message: `The handler of task ${call.taskId} is still running ${
          Duration.format(settings.taskOverrunGrace)
        } past its deadline`,
      }))
    ),
    readiness: readiness(life, context),
    probeTimeout: settings.probeTimeout,
    metrics: Effect.andThen(RuntimeMetrics.sample, Prometheus.exposition),
    sdkVersion: VERSION,
    ...(life.versionFile === undefined ? {} : { versionFile: life.versionFile }),
  }
}
