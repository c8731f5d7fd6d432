/**
 * Every metric the SDK records, declared once. Effect `Metric`s, so that a handler's own
 * metrics and the SDK's share one registry.
 *
 * @since 0.1.0
 */
import { Array as Arr, Metric, MetricBoundaries, MetricLabel } from "effect"

/**
 * `Metric.tagged`, with its labels made once. `Metric.tagged` builds a new array of labels at
 * each update, so the metric's hook cache (keyed by that array) never hits and every update
 * looks its metric up by a freshly hashed key: several times per delivery.
 */
const tagged = (metric: Metric.Metric.Counter<number>, key: string) => {
  const cache = new Map<string, Metric.Metric.Counter<number>>()
  return (value: string): Metric.Metric.Counter<number> => {
    let m = cache.get(value)
    if (m === undefined) {
      const labels = [MetricLabel.make(key, value)]
      const all = (extra: ReadonlyArray<MetricLabel.MetricLabel>) =>
        extra.length === 0 ? labels : Arr.union(labels, extra)
      m = Metric.make(
        metric.keyType,
        (input: number, extra) => metric.unsafeUpdate(input, all(extra)),
        (extra) => metric.unsafeValue(all(extra)),
        (input: number, extra) => metric.unsafeModify(input, all(extra)),
      )
      cache.set(value, m)
    }
    return m
  }
}

/**
 * Settled deliveries by outcome (`success`, `failure`, `retry`, `poison`, …).
 *
 * @since 0.1.0
 * @category metrics
 */
export const tasksTotal = tagged(
  Metric.counter("worker_tasks_total", { description: "Deliveries settled, by outcome" }),
  "status",
)

/**
 * Handler run time.
 *
 * @since 0.1.0
 * @category metrics
 */
export const taskDuration = Metric.histogram(
  "worker_task_duration_seconds",
  MetricBoundaries.exponential({ start: 0.005, factor: 2, count: 16 }),
  "Time from a task's start to its conclusion",
)

/**
 * Messages the broker confirmed, by type.
 *
 * @since 0.1.0
 * @category metrics
 */
export const messagesPublished = tagged(
  Metric.counter("worker_messages_published_total", {
    description: "Messages published and confirmed",
  }),
  "message_type",
)

/**
 * Failures concluded, by code.
 *
 * @since 0.1.0
 * @category metrics
 */
export const taskFailures = tagged(
  Metric.counter("worker_task_failures_total", { description: "Failures concluded, by code" }),
  "code",
)

/**
 * Deliveries requeued for a retry.
 *
 * @since 0.1.0
 * @category metrics
 */
export const taskRetries = Metric.counter("worker_task_retries_total", {
  description: "Deliveries requeued for a retry",
})

/**
 * Poison messages, by reason.
 *
 * @since 0.1.0
 * @category metrics
 */
export const poisonMessages = tagged(
  Metric.counter("worker_poison_messages_total", { description: "Poison messages, by reason" }),
  "reason",
)

/**
 * Publishes that the broker did not confirm, by type.
 *
 * @since 0.1.0
 * @category metrics
 */
export const publishFailures = tagged(
  Metric.counter("worker_publish_failures_total", { description: "Publishes not confirmed" }),
  "message_type",
)

/**
 * Acks or requeues that failed (the lease was gone).
 *
 * @since 0.1.0
 * @category metrics
 */
export const ackFailures = Metric.counter("worker_ack_failures_total", {
  description: "Settlements refused by the broker",
})

/**
 * Deliveries in hand.
 *
 * @since 0.1.0
 * @category metrics
 */
export const tasksInFlight = Metric.gauge("worker_tasks_in_flight", {
  description: "Deliveries in hand",
})

/**
 * Tasks requeued by a shutdown.
 *
 * @since 0.1.0
 * @category metrics
 */
export const shutdownRequeued = Metric.counter("worker_shutdown_requeued_total", {
  description: "Tasks requeued by a shutdown",
})

/**
 * Progress updates not sent, by reason (`invalid`, `regressed`, `superseded`, `concluded`,
 * `publish_failed`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const progressDropped = tagged(
  Metric.counter("worker_progress_dropped_total", { description: "Progress updates not sent" }),
  "reason",
)

/**
 * Adds one to `counter` at once, outside any Effect: for the engine's hot path, where an
 * Effect per increment would cost more than the rest of a task's bookkeeping.
 *
 * @since 0.1.0
 * @category metrics
 */
export const count = (counter: Metric.Metric.Counter<number>): void => counter.unsafeUpdate(1, [])
