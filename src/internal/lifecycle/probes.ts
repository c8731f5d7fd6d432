/**
 * What a life's probes read: `/health` a handler past its deadline, `/ready` the broker, the
 * drain and the worker's own probes, `/metrics` the registry with the process's figures sampled
 * as of the scrape.
 */
import type * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Ref from "effect/Ref"
import * as SubscriptionRef from "effect/SubscriptionRef"
import type * as Probes from "../../Probes.ts"
import * as RuntimeMetrics from "../../RuntimeMetrics.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { ConnectionStatus, Transport } from "../../Transport.ts"
import type { Worker } from "../../WorkerDefinition.ts"
import { ProbeError } from "../../WorkerError.ts"
import { VERSION } from "../version.ts"
import * as Hooks from "./hooks.ts"
import type { LifecycleState } from "./state.ts"
import type { HandlerWatch } from "./handlerWatch.ts"

/** What readiness reads of the transport: its status, and the node it names. */
export type ObservedConnection = Pick<Transport["Service"], "status" | "node">

/** What the probes read of a life. */
export interface Observed<R> {
  readonly worker: Worker<any, any, any, R>
  readonly settings: WorkerSettings
  readonly state: Ref.Ref<LifecycleState>
  readonly handlers: HandlerWatch
  /** The transport, once it is built. */
  readonly connection: Ref.Ref<Option.Option<ObservedConnection>>
  readonly versionFile: string | undefined
}

const notReady = (message: string) => Effect.fail(new ProbeError({ message }))

const STATUS_TEXT: Record<Exclude<ConnectionStatus, "connected">, string> = {
  connecting: "is connecting",
  blocked: "is blocked by a resource alarm of the broker",
  stalled: "is stalled: a heartbeat is overdue",
  disconnected: "is lost: reconnecting",
  closed: "is closed",
}

/** Ready while connected, naming the node; else why not. */
const brokerCheck = (connection: ObservedConnection): Effect.Effect<string | void, ProbeError> =>
  Effect.gen(function* () {
    const status = yield* SubscriptionRef.get(connection.status)
    const node = connection.node === undefined ? undefined : yield* connection.node
    if (status === "connected") return node
    const where = node === undefined ? "" : ` to ${node}`
    return yield* notReady(`the broker connection${where} ${STATUS_TEXT[status]}`)
  })

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
        onSome: brokerCheck,
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
    metrics: RuntimeMetrics.scrape,
    sdkVersion: VERSION,
    ...(life.versionFile === undefined ? {} : { versionFile: life.versionFile }),
  }
}
