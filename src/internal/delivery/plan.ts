/**
 * What settling a delivery will do: a {@link Plan}, the one value every way through a delivery
 * comes to (`open.ts` before the handler, `conclude.ts` after it), which the settlement carries
 * out (`settle.ts`); the messages it names ({@link Task}, {@link TaskRef}); its constructors; and
 * how long a requeue waits ({@link backoffMillis}). Plain functions over plain values, tested
 * without fibers (`test/internal/delivery/plan.test.ts`).
 */
import { Duration, Option, Result } from "effect"
import type * as Decision from "../../Decision.ts"
import { encodeMessageText, type MessageType, type OutboundMessage } from "../../Protocol.ts"
import type { WorkerSettings } from "../../Settings.ts"
import { decodeNonNegative } from "../codec/duration.ts"

/** A message that names its task: what every decision about it carries. */
export interface TaskRef {
  readonly taskId: string
  /** Unknown for an envelope too broken to read its delivery count against. */
  readonly attempt?: number | undefined
  readonly deliveryLimit?: number | undefined
  /** Its deliveries, this one included, where the broker counts them apart from its attempts. */
  readonly deliveries?: number | undefined
  /** This delivery's own id, made by the worker ({@link deliveryIdOf}): in its messages' ids. */
  readonly deliveryId: string
}

/**
 * A delivery's id, from a random `r` in [0, 1): eight base-36 characters. The broker gives no id
 * that tells two deliveries of one attempt apart (after a return RabbitMQ 4 does not count, a
 * shutdown's, and after every return past the first on a classic queue, the attempt is the same;
 * RabbitMQ 4's `x-acquired-count` is its quorum queues' only): the worker draws its own.
 */
export const deliveryIdOf = (r: number): string =>
  Math.floor(r * 36 ** 8).toString(36).padStart(8, "0")

/**
 * The id of a message of the delivery of `task`, the same for each copy of it (the tries of one
 * publish) and no other message: its task, its attempt (the first for a delivery that does not
 * count them), its delivery's id (a task run again under the same attempt publishes ids of its
 * own) and its type, a progress message's number in its delivery beside.
 */
export const messageIdOf = (task: TaskRef, type: MessageType, sequence?: number): string =>
  `${task.taskId}:${task.attempt ?? 1}:${task.deliveryId}:${type}${
    sequence === undefined ? "" : `:${sequence}`
  }`

/** A task whose attempt is known: one that may run. */
export interface Task extends TaskRef {
  readonly attempt: number
  readonly deliveryLimit: number
}

/** What settling the delivery will do. */
export type Plan =
  | { readonly _tag: "Ack"; readonly decision: Decision.Decision }
  | {
    readonly _tag: "Conclude"
    readonly type: MessageType
    readonly text: string
    /** The message's id, the same for each of its copies. */
    readonly messageId: string
    readonly decision: Decision.Decision
  }
  | { readonly _tag: "Requeue"; readonly decision: Decision.Decision }
  | { readonly _tag: "Fenced"; readonly decision: Decision.Decision }

/** What a decision may carry besides its outcome and action. */
interface Extra {
  readonly code?: string | undefined
  readonly reason?: string | undefined
}

/** The decision of `task` with `outcome` and `action`. */
const decide = (
  task: TaskRef | undefined,
  outcome: Decision.Outcome,
  action: Decision.Action,
  extra: Extra = {},
): Decision.Decision => ({
  outcome,
  action,
  taskId: task?.taskId,
  attempt: task?.attempt,
  deliveryLimit: task?.deliveryLimit,
  deliveries: task?.deliveries,
  ...(extra.code === undefined ? {} : { code: extra.code }),
  ...(extra.reason === undefined ? {} : { reason: extra.reason }),
})

/** Ack the message, publishing nothing: what nothing can be correlated for (poison) comes to. */
export const ack = (task: TaskRef | undefined, outcome: Decision.Outcome, extra?: Extra): Plan => ({
  _tag: "Ack",
  decision: decide(task, outcome, "ack", extra),
})

/**
 * How a message goes back to the queue, by what sent it back (docs/protocol.md, "Returning a
 * message"): a task that failed on this attempt is rejected, which every broker counts against
 * its delivery limit; a task not processed through no fault of its own (a shutdown, a service
 * missing) is nacked, which RabbitMQ 4 does not count, and so neither spends an attempt nor
 * nears the queue's own delivery-limit.
 */
export const returnedAs = (
  outcome: Decision.Outcome,
  reason: string | undefined,
): "reject-requeue" | "nack-requeue" =>
  outcome === "shutdown_requeued" || outcome === "cancelled" ||
    (outcome === "engine_error" && reason === "missing_service")
    ? "nack-requeue"
    : "reject-requeue"

/** Requeue the message: the task runs again, rejected or nacked as {@link returnedAs} says. */
export const requeue = (
  task: TaskRef | undefined,
  outcome: Decision.Outcome,
  extra?: Extra,
): Plan => ({
  _tag: "Requeue",
  decision: decide(task, outcome, returnedAs(outcome, extra?.reason), extra),
})

/** A lost lease: the broker has the message back, and nothing more is published for it. */
export const fenced = (task: TaskRef | undefined, reason: string): Plan => ({
  _tag: "Fenced",
  decision: decide(task, "cancelled", "nack-requeue", { reason }),
})

/**
 * Conclude with `message`: its exact text, or, for a response that is not JSON data (or cannot
 * even be read), `INVALID_OUTPUT`.
 */
export const conclude = (
  message: OutboundMessage,
  task: TaskRef,
  outcome: Decision.Outcome,
  reason?: string,
): Plan => {
  let encoded: Result.Result<string, { readonly message: string }>
  try {
    encoded = encodeMessageText(message)
  } catch {
    // A response whose getters throw, or a revoked Proxy.
    encoded = Result.fail({ message: "it cannot be read" })
  }
  if (Result.isFailure(encoded)) {
    // Only a success can fail to encode here: its response is not JSON data.
    return fail(
      task,
      "INVALID_OUTPUT",
      `The handler's output is not JSON data: ${encoded.failure.message}`,
    )
  }
  const code = message.type === "failure" ? message.code : undefined
  return {
    _tag: "Conclude",
    type: message.type,
    text: encoded.success,
    messageId: messageIdOf(task, message.type),
    decision: decide(task, outcome, "conclude", { code, reason }),
  }
}

/** Conclude with a `failure` of `code`. */
export const fail = (
  task: TaskRef,
  code: string,
  message: string,
  outcome: Decision.Outcome = "failure",
  reason?: string,
): Plan => conclude({ type: "failure", task_id: task.taskId, code, message }, task, outcome, reason)

/**
 * The backoff before the requeue of `attempt`, from a random `r` in [0, 1): exponential from
 * `base`, capped at `max`, with equal jitter (between half and all of it); or the error's own
 * delay (seconds, or a `Duration.Input`), capped at `max`. `ownIgnored` says that an own delay
 * was given but names no duration, or a negative or NaN one: an ordinary retry, to warn about.
 */
export const backoffMillis = (
  settings: Pick<WorkerSettings, "retryBackoffBase" | "retryBackoffMax">,
  attempt: number,
  delay: unknown,
  r: number,
): { readonly millis: number; readonly ownIgnored: boolean } => {
  const maxMillis = Duration.toMillis(settings.retryBackoffMax)
  if (delay !== undefined) {
    const own = decodeNonNegative(typeof delay === "number" ? delay * 1000 : delay)
    if (Option.isSome(own)) {
      return { millis: Math.min(Duration.toMillis(own.value), maxMillis), ownIgnored: false }
    }
  }
  const full = Math.min(
    Duration.toMillis(settings.retryBackoffBase) * 2 ** (attempt - 1),
    maxMillis,
  )
  return { millis: full / 2 + (r * full) / 2, ownIgnored: delay !== undefined }
}
