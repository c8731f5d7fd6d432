/**
 * Steps 1 to 3 of a delivery, and its input: decode the message (the poison rules), read its
 * attempt, hold it against the delivery limit, decode its input. A message comes to an
 * {@link Opening}: a task to start, or a {@link Plan} to settle at once (poison, an invalid
 * envelope, a task past its limit, an invalid input). Plain functions, tested without fibers
 * (`test/internal/delivery/open.test.ts`).
 */
import type { LeaseExpiries } from "./expiries.ts"
import { Result, type Schema } from "effect"
import { decodeEnvelope, type Envelope } from "../../Protocol.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { Redeliveries } from "../../Transport.ts"
import { formatIssues } from "../codec/issues.ts"
import { ack, fail, type Plan, type Task, type TaskRef } from "./plan.ts"

/** What an inbound message comes to before anything runs. */
export type Opening<A> =
  | { readonly _tag: "Settle"; readonly task: TaskRef | undefined; readonly plan: Plan }
  | {
    readonly _tag: "Start"
    readonly task: Task
    readonly envelope: Envelope
    readonly input: A
  }

/** Whether a broker's delivery count is one: an integer, not negative. */
const isDeliveryCount = (count: unknown): count is number =>
  typeof count === "number" && Number.isInteger(count) && count >= 0

/**
 * Step 2: the message's attempt (its failed deliveries plus one), the limit it counts against,
 * and, where the broker counts them apart (RabbitMQ 4's acquired count), its deliveries.
 */
export const attemptOf = (
  redeliveries: Redeliveries,
  deliveryLimit: number,
): {
  readonly attempt: number
  readonly deliveryLimit: number
  readonly deliveries?: number | undefined
} => {
  if (redeliveries._tag === "Flagged") {
    // A classic queue says only whether it was delivered before: one retry at most.
    return { attempt: redeliveries.redelivered ? 2 : 1, deliveryLimit: Math.min(deliveryLimit, 2) }
  }
  // A count that is not one (negative, fractional) is taken as the first attempt.
  const attempt = isDeliveryCount(redeliveries.count) ? redeliveries.count + 1 : 1
  const acquired = redeliveries.acquired
  return isDeliveryCount(acquired)
    ? { attempt, deliveryLimit, deliveries: acquired + 1 }
    : { attempt, deliveryLimit }
}

/** The warning a delivery's count calls for, when it is not a count. */
export const countWarning = (redeliveries: Redeliveries): string | undefined =>
  redeliveries._tag === "Counted" && !isDeliveryCount(redeliveries.count)
    ? `The delivery count (x-delivery-count) is not a count: ${
      String(redeliveries.count).slice(0, 40)
    }; taken as the first attempt`
    : undefined

/**
 * Steps 1 to 3 of a delivery, and the input: decode (the poison rules), the attempt, the
 * delivery limit, the input schema. The task it names carries `deliveryId`, the delivery's own;
 * its attempt counts the leases the broker ended without counting them (`expiries`).
 */
export const open = <A>(
  body: Uint8Array,
  redeliveries: Redeliveries,
  settings: Pick<WorkerSettings, "maxMessageBytes" | "deliveryLimit">,
  decodeInput: (u: unknown) => Result.Result<A, Schema.SchemaError>,
  deliveryId: string,
  expiries?: Pick<LeaseExpiries, "attemptOf">,
): Opening<A> => {
  const decoded = decodeEnvelope(body, { maxBytes: settings.maxMessageBytes })
  if (decoded._tag === "Poison") {
    return {
      _tag: "Settle",
      task: undefined,
      plan: ack(undefined, "poison", { reason: decoded.reason }),
    }
  }
  if (decoded._tag === "InvalidEnvelope") {
    const task = { taskId: decoded.taskId, deliveryId }
    return {
      _tag: "Settle",
      task,
      plan: fail(
        task,
        "INVALID_MESSAGE",
        `The task message is malformed: ${decoded.problem}.`,
        "poison",
        "invalid_envelope",
      ),
    }
  }
  const envelope = decoded.envelope
  const counted = attemptOf(redeliveries, settings.deliveryLimit)
  const task: Task = {
    taskId: envelope.taskId,
    deliveryId,
    ...counted,
    // A lease the broker ended uncounted is counted here (`expiries.ts`).
    attempt: expiries === undefined
      ? counted.attempt
      : expiries.attemptOf(envelope.taskId, counted.attempt),
  }
  if (task.attempt > settings.deliveryLimit) {
    return {
      _tag: "Settle",
      task,
      plan: fail(
        task,
        "TASK_ABANDONED_AFTER_REDELIVERIES",
        `The task was delivered ${task.attempt} times, past the limit of ${settings.deliveryLimit}: it was abandoned without running again.`,
      ),
    }
  }
  const input = decodeInput(envelope.body)
  if (Result.isFailure(input)) {
    return {
      _tag: "Settle",
      task,
      plan: fail(
        task,
        "INVALID_INPUT",
        `The task input is invalid: ${formatIssues(input.failure)}`,
      ),
    }
  }
  return { _tag: "Start", task, envelope, input: input.success }
}
