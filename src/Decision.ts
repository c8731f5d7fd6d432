/**
 * How a delivery ended: the one decision line logged per delivery, as the spec names it.
 *
 * @since 0.1.0
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import type * as Fiber from "effect/Fiber"
import type * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as References from "effect/References"
import type { Outcome } from "./internal/outcome.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"

export type { Outcome } from "./internal/outcome.ts"

/**
 * What was done with the message: acked, concluded (terminal message confirmed, then acked), given
 * back to the queue as a failed attempt (`reject-requeue`, counted by every broker: since 0.3.0),
 * or given back unprocessed (`nack-requeue`: by this worker, not counted by RabbitMQ 4; or by the
 * broker when the lease was lost).
 *
 * @since 0.1.0
 * @category models
 */
export type Action = "ack" | "conclude" | "reject-requeue" | "nack-requeue"

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
  /**
   * The message's deliveries, this one included, where the broker counts them apart from failed
   * attempts (RabbitMQ 4's `x-acquired-count` plus one). Since 0.3.0.
   */
  readonly deliveries?: number | undefined
  /** The poison reason, or why a settlement failed. */
  readonly reason?: string | undefined
  /**
   * A lease lost after the event loop was blocked during the delivery: the block's seconds
   * (`blocked_s`), the likely cause. Since 0.3.0.
   */
  readonly blockedSeconds?: number | undefined
}

/**
 * A block's seconds as a decision line says them: to a tenth.
 */
const blockedOf = (seconds: number): number => Math.round(seconds * 10) / 10

/**
 * The decision's log line, e.g. `Delivery settled: outcome=failure action=conclude
 * code=NOT_ALLOWED attempt=1/5`.
 *
 * @since 0.1.0
 * @category codecs
 */
export const format = (d: Decision): string => {
  let line = `Delivery settled: outcome=${d.outcome} action=${d.action}`
  if (d.code !== undefined) line += ` code=${d.code}`
  if (d.reason !== undefined) line += ` reason=${d.reason}`
  if (d.attempt !== undefined) line += ` attempt=${d.attempt}/${d.deliveryLimit}`
  if (d.deliveries !== undefined) line += ` deliveries=${d.deliveries}`
  if (d.blockedSeconds !== undefined) line += ` blocked_s=${blockedOf(d.blockedSeconds)}`
  return line
}

/**
 * Counts the decision, and logs its line at INFO with its fields as annotations of that line, on
 * `fiber`, which must be the fiber running this call: the engine logs a decision per delivery on
 * a fiber it holds.
 *
 * The line goes to the fiber's loggers as `Effect.logInfo` would send it, with the fiber's
 * annotations and the decision's, and leaves the fiber's annotations as they were: a logger
 * reads a line's annotations from the fiber, so the decision's are set on the fiber for the
 * call and taken off after it, without an Effect per delivery. A logger that throws does not
 * stop the others, nor the delivery, which is settled already.
 *
 * @since 0.2.0
 * @category logging
 */
export const logUnsafe = (fiber: Fiber.Fiber<unknown, unknown>, d: Decision): void => {
  const context = fiber.context
  WorkerMetrics.count(WorkerMetrics.tasksTotal(d.outcome), context)
  if (LogLevel.isGreaterThan(fiber.cache.minimumLogLevel, "Info")) return
  const loggers = fiber.getRef(References.CurrentLoggers)
  if (loggers.size === 0) return
  const options: Logger.Options<ReadonlyArray<string>> = {
    message: [format(d)],
    logLevel: "Info",
    cause: Cause.empty,
    fiber,
    date: new Date(fiber.getRef(Clock.Clock).currentTimeMillisUnsafe()),
  }
  fiber.setContext(
    Context.add(
      context,
      References.CurrentLogAnnotations,
      annotate(d)(fiber.getRef(References.CurrentLogAnnotations)),
    ),
  )
  try {
    for (const logger of loggers) {
      try {
        logger.log(options)
      } catch {
        // A logger's failure is its own: the delivery is settled, and the other loggers write.
      }
    }
  } finally {
    fiber.setContext(context)
  }
}

/**
 * The log annotations with the decision's fields added (`task_id`, `attempt`, `delivery_limit`,
 * `deliveries`, `outcome`, `action`, `code`, `reason`, `blocked_s`): one copy for all of them, as the decision line of
 * every delivery carries them.
 *
 * @since 0.1.0
 * @category codecs
 */
export const annotate = (d: Decision) =>
(
  current: Readonly<Record<string, unknown>>,
): Readonly<Record<string, unknown>> => {
  const annotations: Record<string, unknown> = { ...current }
  annotations.outcome = d.outcome
  annotations.action = d.action
  if (d.taskId !== undefined) annotations.task_id = d.taskId
  if (d.attempt !== undefined) {
    annotations.attempt = d.attempt
    annotations.delivery_limit = d.deliveryLimit
  }
  if (d.deliveries !== undefined) annotations.deliveries = d.deliveries
  if (d.code !== undefined) annotations.code = d.code
  if (d.reason !== undefined) annotations.reason = d.reason
  if (d.blockedSeconds !== undefined) annotations.blocked_s = blockedOf(d.blockedSeconds)
  return annotations
}
