/**
 * How a delivery ended: the one decision line logged per delivery, as the spec names it.
 *
 * @since 0.1.0
 */
import {
  Cause,
  Clock,
  Context,
  DefaultServices,
  type Fiber,
  FiberRef,
  HashMap,
  HashSet,
  Inspectable,
  type Logger,
  LogLevel,
} from "effect"
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

/**
 * Counts the decision, and logs its line at INFO with its fields as annotations of that line, on
 * `fiber`, which must be the fiber running this call: the engine logs a decision per delivery on
 * a fiber it holds.
 *
 * The line goes to the fiber's loggers as `Effect.logInfo` would send it, with the fiber's
 * annotations and the decision's, but without changing the fiber's annotations: a change, even a
 * scoped one, copies every FiberRef of the fiber, and every delivery logs this line.
 *
 * @since 0.1.0
 * @category logging
 */
export const unsafeLog = (fiber: Fiber.RuntimeFiber<unknown, unknown>, d: Decision): void => {
  WorkerMetrics.count(WorkerMetrics.tasksTotal(d.outcome))
  if (LogLevel.greaterThan(fiber.getFiberRef(FiberRef.currentMinimumLogLevel), LogLevel.Info)) {
    return
  }
  const loggers = fiber.getFiberRef(FiberRef.currentLoggers)
  if (HashSet.size(loggers) === 0) return
  const context = fiber.getFiberRefs()
  const clock = Context.get(fiber.getFiberRef(DefaultServices.currentServices), Clock.Clock)
  const options: Logger.Logger.Options<unknown> = {
    fiberId: fiber.id(),
    logLevel: LogLevel.Info,
    message: [format(d)],
    cause: Cause.empty,
    context,
    spans: fiber.getFiberRef(FiberRef.currentLogSpan),
    annotations: annotate(d)(fiber.getFiberRef(FiberRef.currentLogAnnotations)),
    date: new Date(clock.unsafeCurrentTimeMillis()),
  }
  Inspectable.withRedactableContext(context, () => {
    for (const logger of loggers) {
      try {
        logger.log(options)
      } catch {
        // A logger's failure is its own: the delivery is settled, and the other loggers write.
      }
    }
  })
}

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
