/**
 * Every metric the SDK records, declared once. Effect `Metric`s, so that a handler's own
 * metrics and the SDK's share one registry: the `Metric.MetricRegistry` of the context they
 * are updated in (Effect's global one unless a program provides its own).
 *
 * @since 0.1.0
 */
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"
import * as Stream from "effect/Stream"
import * as SubscriptionRef from "effect/SubscriptionRef"
import type { Outcome } from "./internal/outcome.ts"
import type { MessageType, PoisonReason } from "./Protocol.ts"
import { type ConnectionStatus, isLive } from "./Transport.ts"

/**
 * A counter labelled by one key: the series of a label value.
 *
 * @since 0.2.0
 * @category models
 */
export type LabelledCounter = (value: string) => Metric.Counter<number>

/**
 * A counter labelled by one key, as a factory of one series per label value, each made once.
 * Each value gets its own declaration under `withAttributes`: a metric caches its series key
 * for the last attribute set it saw, so values sharing one declaration (a delivery's `started`
 * then `success` publishes) would rebuild the key at every update (`bench/engine.ts`).
 */
const labelled = (
  name: string,
  description: string,
  key: string,
): LabelledCounter => {
  const byValue = new Map<string, Metric.Counter<number>>()
  return (value) => {
    let metric = byValue.get(value)
    if (metric === undefined) {
      metric = Metric.withAttributes(Metric.counter(name, { description }), { [key]: value })
      byValue.set(value, metric)
    }
    return metric
  }
}

/**
 * Settled deliveries by outcome (`success`, `failure`, `retry`, `poison`, …).
 *
 * @since 0.1.0
 * @category metrics
 */
export const tasksTotal: LabelledCounter = labelled(
  "worker_tasks_total",
  "Deliveries settled, by outcome",
  "status",
)

/**
 * Handler run time: from the handler's start (once `started` is confirmed) to its end, a retry's
 * backoff and the terminal message's publish left out.
 *
 * @since 0.1.0
 * @category metrics
 */
export const taskDuration: Metric.Histogram<number> = Metric.histogram(
  "worker_task_duration_seconds",
  {
    description: "Time a task's handler ran",
    boundaries: Metric.exponentialBoundaries({ start: 0.005, factor: 2, count: 16 }),
  },
)

/**
 * Messages the broker confirmed, by type.
 *
 * @since 0.1.0
 * @category metrics
 */
export const messagesPublished: LabelledCounter = labelled(
  "worker_messages_published_total",
  "Messages published and confirmed",
  "message_type",
)

/**
 * Failures concluded, by code.
 *
 * @since 0.1.0
 * @category metrics
 */
export const taskFailures: LabelledCounter = labelled(
  "worker_task_failures_total",
  "Failures concluded, by code",
  "code",
)

/**
 * Deliveries requeued for a retry.
 *
 * @since 0.1.0
 * @category metrics
 */
export const taskRetries: Metric.Counter<number> = Metric.counter("worker_task_retries_total", {
  description: "Deliveries requeued for a retry",
})

/**
 * Poison messages, by reason.
 *
 * @since 0.1.0
 * @category metrics
 */
export const poisonMessages: LabelledCounter = labelled(
  "worker_poison_messages_total",
  "Poison messages, by reason",
  "reason",
)

/**
 * Publishes that the broker did not confirm, by type.
 *
 * @since 0.1.0
 * @category metrics
 */
export const publishFailures: LabelledCounter = labelled(
  "worker_publish_failures_total",
  "Publishes not confirmed",
  "message_type",
)

/**
 * Acks or requeues that failed (the lease was gone).
 *
 * @since 0.1.0
 * @category metrics
 */
export const ackFailures: Metric.Counter<number> = Metric.counter("worker_ack_failures_total", {
  description: "Settlements refused by the broker",
})

/**
 * Deliveries in hand.
 *
 * @since 0.1.0
 * @category metrics
 */
export const tasksInFlight: Metric.Gauge<number> = Metric.gauge("worker_tasks_in_flight", {
  description: "Deliveries in hand",
})

/**
 * Tasks requeued by a shutdown.
 *
 * @since 0.1.0
 * @category metrics
 */
export const shutdownRequeued: Metric.Counter<number> = Metric.counter(
  "worker_shutdown_requeued_total",
  {
    description: "Tasks requeued by a shutdown",
  },
)

/**
 * Progress updates not sent, by reason (`invalid`, `regressed`, `superseded`, `concluded`,
 * `publish_failed`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const progressDropped: LabelledCounter = labelled(
  "worker_progress_dropped_total",
  "Progress updates not sent",
  "reason",
)

/**
 * Adds one to `counter` at once, outside any Effect: for the engine's hot path, where an
 * Effect per increment would cost more than the rest of a task's bookkeeping. `context` is the
 * running fiber's (`fiber.context`): it holds the registry the count goes to.
 *
 * @since 0.1.0
 * @category metrics
 */
export const count = (
  counter: Metric.Counter<number>,
  context: Context.Context<never>,
): void => counter.updateUnsafe(1, context)

/** A label's values, each named once: the record's type makes the list the union's. */
const valuesOf = <K extends string>(record: Record<K, null>): ReadonlyArray<K> =>
  Object.keys(record) as Array<K>

const OUTCOMES = valuesOf<Outcome>({
  success: null,
  failure: null,
  poison: null,
  retry: null,
  publish_failed: null,
  shutdown_requeued: null,
  cancelled: null,
  engine_error: null,
})

const MESSAGE_TYPES = valuesOf<MessageType>({
  started: null,
  progress: null,
  success: null,
  failure: null,
})

/** The envelope's poison reasons, and a task message whose envelope is malformed. */
const POISON_REASONS = valuesOf<PoisonReason | "invalid_envelope">({
  too_large: null,
  not_utf8: null,
  not_json: null,
  not_object: null,
  no_task_id: null,
  invalid_envelope: null,
})

const PROGRESS_DROP_REASONS = [
  "invalid",
  "regressed",
  "superseded",
  "concluded",
  "publish_failed",
  "too_large",
]

/**
 * The workers' broker connections in each `state` (`connecting`, `connected`, `blocked`,
 * `stalled`, `disconnected`): a worker's connection counts 1 in the state it is in, and none once
 * its transport is closed. Set by {@link followConnection}.
 *
 * @since 0.2.0
 * @category metrics
 */
export const brokerConnection = (state: GaugedState): Metric.Gauge<number> =>
  connectionGauges[state]

/**
 * Connections made again after a loss.
 *
 * @since 0.2.0
 * @category metrics
 */
export const brokerReconnects: Metric.Counter<number> = Metric.counter(
  "worker_broker_reconnects_total",
  {
    description: "Broker connections made again after a loss",
  },
)

/** The states a connection is counted in: a closed transport has no connection. */
type GaugedState = Exclude<ConnectionStatus, "closed">

const GAUGED_STATES = valuesOf<GaugedState>({
  connecting: null,
  connected: null,
  blocked: null,
  stalled: null,
  disconnected: null,
})

const connectionGauges = Object.fromEntries(GAUGED_STATES.map((state) => [
  state,
  Metric.withAttributes(
    Metric.gauge("worker_broker_connection", {
      description: "Broker connections in each state (a worker has one)",
    }),
    { state },
  ),
])) as Record<GaugedState, Metric.Gauge<number>>

/**
 * Follows `status` into {@link brokerConnection} and {@link brokerReconnects}, for as long as it
 * runs: each change moves the connection's count from one state to the next (so that the workers
 * of one process add up), and its end takes it away. A connection up again after a loss is a
 * reconnect, whatever its state (`blocked` too).
 *
 * @since 0.2.0
 * @category metrics
 */
export const followConnection = (
  status: SubscriptionRef.SubscriptionRef<ConnectionStatus>,
): Effect.Effect<void> => {
  let counted: GaugedState | undefined
  let lost = false
  const countIn = (state: ConnectionStatus) =>
    Effect.gen(function* () {
      if (counted !== undefined) yield* Metric.modify(connectionGauges[counted], -1)
      counted = state === "closed" ? undefined : state
      if (counted !== undefined) yield* Metric.modify(connectionGauges[counted], 1)
    })
  return SubscriptionRef.changes(status).pipe(
    Stream.runForEach((state) =>
      Effect.gen(function* () {
        if (state === counted) return
        yield* countIn(state)
        if (state === "disconnected") lost = true
        else if (lost && isLive(state)) {
          lost = false
          yield* Metric.update(brokerReconnects, 1)
        }
      })
    ),
    Effect.ensuring(Effect.suspend(() => countIn("closed"))),
  )
}

/** Every series known before any task, each once. */
const known = (): ReadonlyArray<Metric.Metric<never, unknown>> => [
  ...OUTCOMES.map(tasksTotal),
  taskDuration,
  ...MESSAGE_TYPES.map(messagesPublished),
  taskRetries,
  ...POISON_REASONS.map(poisonMessages),
  ...MESSAGE_TYPES.map(publishFailures),
  ackFailures,
  tasksInFlight,
  shutdownRequeued,
  ...PROGRESS_DROP_REASONS.map(progressDropped),
  ...GAUGED_STATES.map(brokerConnection),
  brokerReconnects,
  eventLoopLag,
]

/**
 * Registers the SDK's series at zero in the registry of the context it runs in, so that
 * `/metrics` shows them from the start (`worker_task_retries_total 0`), as a scraper expects,
 * rather than from their first event. A labelled counter gets a series for every value the SDK
 * knows up front: `status` for every outcome, `message_type` for the four types, the poison and
 * progress-drop `reason`s. `worker_task_failures_total{code}` appears with its first failure,
 * as its codes are the handlers' own. A worker registers them as it starts (`RuntimeMetrics.make`,
 * the test harness).
 *
 * @since 0.1.0
 * @category metrics
 */
export const register: Effect.Effect<void> = Effect.withFiber((fiber) => {
  for (const metric of known()) metric.valueUnsafe(fiber.context)
  return Effect.void
})

/**
 * Always 1, labelled with the SDK's `version` and the `runtime` it runs on (`node 22.3.0`,
 * `deno 2.1.4`). Set by `RuntimeMetrics`.
 *
 * @since 0.1.0
 * @category metrics
 */
export const sdkInfo: Metric.Gauge<number> = Metric.gauge("worker_sdk_info", {
  description: "The worker SDK's version and the runtime it runs on (always 1)",
})

/**
 * The event loop's worst lag since the last scrape, in seconds: how late the timer of
 * `EventLoop.make` woke at worst (a block of the loop shows whole), back to 0 after each scrape of
 * `/metrics` (`component="worker"`). Since 0.3.0; before, the lag at the last sample.
 *
 * @since 0.1.0
 * @category metrics
 */
export const eventLoopLag: Metric.Gauge<number> = Metric.gauge("event_loop_lag_seconds", {
  description:
    "The worst lag of the event loop since the last scrape (how late a timer of the worker fired), in seconds",
  attributes: { component: "worker" },
})

/**
 * CPU time of the process (user + system), in seconds (`process.cpuUsage`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const processCpuSeconds: Metric.Counter<number> = Metric.counter(
  "process_cpu_seconds_total",
  {
    description: "Total user and system CPU time spent in seconds",
  },
)

/**
 * User CPU time of the process, in seconds.
 *
 * @since 0.1.0
 * @category metrics
 */
export const processCpuUserSeconds: Metric.Counter<number> = Metric.counter(
  "process_cpu_user_seconds_total",
  {
    description: "Total user CPU time spent in seconds",
  },
)

/**
 * System CPU time of the process, in seconds.
 *
 * @since 0.1.0
 * @category metrics
 */
export const processCpuSystemSeconds: Metric.Counter<number> = Metric.counter(
  "process_cpu_system_seconds_total",
  {
    description: "Total system CPU time spent in seconds",
  },
)

/**
 * Resident set size of the process, in bytes (`process.memoryUsage().rss`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const processResidentMemory: Metric.Gauge<number> = Metric.gauge(
  "process_resident_memory_bytes",
  {
    description: "Resident memory size in bytes",
  },
)

/**
 * When the process started, in seconds since the Unix epoch.
 *
 * @since 0.1.0
 * @category metrics
 */
export const processStartTime: Metric.Gauge<number> = Metric.gauge("process_start_time_seconds", {
  description: "Start time of the process since unix epoch in seconds",
})

/**
 * V8 heap in use, in bytes (`process.memoryUsage().heapUsed`). Named as prom-client names it,
 * on Deno too (same V8 figures).
 *
 * @since 0.1.0
 * @category metrics
 */
export const heapUsed: Metric.Gauge<number> = Metric.gauge("nodejs_heap_size_used_bytes", {
  description: "V8 heap size used in bytes",
})

/**
 * V8 heap reserved, in bytes (`process.memoryUsage().heapTotal`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const heapTotal: Metric.Gauge<number> = Metric.gauge("nodejs_heap_size_total_bytes", {
  description: "V8 heap size reserved in bytes",
})

/**
 * Memory of C++ objects bound to JavaScript objects, in bytes (`process.memoryUsage().external`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const externalMemory: Metric.Gauge<number> = Metric.gauge("nodejs_external_memory_bytes", {
  description: "V8 external memory size in bytes",
})

/**
 * Resources keeping the event loop alive, by `type` (`TCPWrap`, `Timeout`, …), where the runtime
 * tells (`process.getActiveResourcesInfo`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const activeResources: Metric.Gauge<number> = Metric.gauge("nodejs_active_resources", {
  description: "Resources keeping the event loop alive, by type",
})

/**
 * Resources keeping the event loop alive, all types together.
 *
 * @since 0.1.0
 * @category metrics
 */
export const activeResourcesTotal: Metric.Gauge<number> = Metric.gauge(
  "nodejs_active_resources_total",
  {
    description: "Resources keeping the event loop alive",
  },
)

/**
 * Garbage collection pauses, in seconds, by `kind` (`minor`, `major`, `incremental`, `weakcb`),
 * where the runtime reports them (Node; Deno does not).
 *
 * @since 0.1.0
 * @category metrics
 */
export const gcDuration: Metric.Histogram<number> = Metric.histogram(
  "nodejs_gc_duration_seconds",
  {
    description: "Garbage collection duration by kind, in seconds",
    boundaries: Metric.boundariesFromIterable([0.001, 0.01, 0.1, 1, 2, 5]),
  },
)

/**
 * The adaptive concurrency's current target.
 *
 * @since 0.1.0
 * @category metrics
 */
export const concurrencyTarget: Metric.Gauge<number> = Metric.gauge("worker_concurrency_target", {
  description: "The adaptive concurrency's current target",
})
