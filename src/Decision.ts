/**
 * How a delivery ended: the one decision line logged per delivery, as the spec names it.
 *
 * @since 0.1.0
 */
import { Effect, FiberRef, HashMap, LogLevel } from "effect"
import * as WorkerMetrics from "./WorkerMetrics.ts"

/**
 * What became of the task.
 *
 * @since 0.1.0
 * @category models
 */
export type Outcome =
  | "success"
  | "failure"
  | "poison"
  | "retry"
  | "publish_failed"
  | "shutdown_requeued"
  | "cancelled"
  | "engine_error"

/**
 * What was done with the message: acked, concluded (terminal message confirmed, then acked), or
 * given back to the queue (by this worker, or by the broker when the lease was lost).
 *
 * @since 0.1.0
 * @category models
 */
export type Action = "ack" | "conclude" | "nack-requeue"

/**
 * One delivery's decision.
 *
 * @since 0.1.0
 * @category models
 */
export interface Decision {
  readonly outcome: Outcome
  readonly action: Action
  readonly taskId?: string | undefined
  readonly code?: string | undefined
  readonly attempt?: number | undefined
  readonly deliveryLimit?: number | undefined
  /** The poison reason, or why a settlement failed. */
  readonly reason?: string | undefined
}

/**
 * The decision's log line, e.g. `Delivery settled: outcome=failure action=conclude
 * code=NOT_ALLOWED attempt=1/5`.
 *
 * @since 0.1.0
 * @category formatting
 */
export const format = (d: Decision): string => {
  let line = `Delivery settled: outcome=${d.outcome} action=${d.action}`
  if (d.code !== undefined) line += ` code=${d.code}`
  if (d.reason !== undefined) line += ` reason=${d.reason}`
  if (d.attempt !== undefined) line += ` attempt=${d.attempt}/${d.deliveryLimit}`
  return line
}

/** Counts the decision, and logs its line at INFO through `annotated` when INFO is on. */
const logWith = (
  d: Decision,
  annotated: (
    line: Effect.Effect<void>,
    annotate: (current: HashMap.HashMap<string, unknown>) => HashMap.HashMap<string, unknown>,
  ) => Effect.Effect<void>,
): Effect.Effect<void> =>
  Effect.withFiberRuntime((fiber) => {
    WorkerMetrics.count(WorkerMetrics.tasksTotal(d.outcome))
    // Skipped whole when INFO is off: building the line and its annotations is most of its cost.
    return LogLevel.greaterThan(fiber.getFiberRef(FiberRef.currentMinimumLogLevel), LogLevel.Info)
      ? Effect.void
      : annotated(Effect.logInfo(format(d)), annotate(d))
  })

/**
 * Logs the decision at INFO with its fields as annotations of that line, and counts it.
 *
 * @since 0.1.0
 * @category logging
 */
export const log = (d: Decision): Effect.Effect<void> =>
  logWith(d, (line, f) => Effect.locallyWith(line, FiberRef.currentLogAnnotations, f))

/**
 * {@link log}, with the fields set on the fiber's annotations rather than scoped to the line: for
 * a fiber that runs deliveries one after another and sets its annotations anew for each (the
 * engine's), as a scoped change costs a dozen runtime steps per delivery.
 *
 * @since 0.1.0
 * @category logging
 */
export const logOnFiber = (d: Decision): Effect.Effect<void> =>
  logWith(d, (line, f) => Effect.zipRight(FiberRef.update(FiberRef.currentLogAnnotations, f), line))

/**
 * The log annotations with the decision's fields added (`task_id`, `attempt`, `delivery_limit`,
 * `outcome`, `action`, `code`, `reason`): one mutation for all of them, as the decision line of
 * every delivery carries them.
 *
 * @since 0.1.0
 * @category formatting
 */
export const annotate = (d: Decision) =>
(
  current: HashMap.HashMap<string, unknown>,
): HashMap.HashMap<string, unknown> =>
  HashMap.mutate(current, (annotations) => {
    HashMap.set(annotations, "outcome", d.outcome)
    HashMap.set(annotations, "action", d.action)
    if (d.taskId !== undefined) HashMap.set(annotations, "task_id", d.taskId)
    if (d.attempt !== undefined) {
      HashMap.set(annotations, "attempt", d.attempt)
      HashMap.set(annotations, "delivery_limit", d.deliveryLimit)
    }
    if (d.code !== undefined) HashMap.set(annotations, "code", d.code)
    if (d.reason !== undefined) HashMap.set(annotations, "reason", d.reason)
  })
