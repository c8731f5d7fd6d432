/**
 * What a delivery means, decided without running anything: the planner of the delivery engine.
 * An inbound message comes to an {@link Opening} (poison, a task to conclude at once, or a task to
 * start) and a handler's {@link Result} to a {@link Next} step; every way out is a {@link Plan},
 * which the settlement carries out. Plain functions over plain values, so that the spec's rules
 * are tested without fibers (`test/internal/delivery/plan.test.ts`).
 */
import { Cause, Duration, Either, Exit, Option, type ParseResult } from "effect"
import type * as Concurrency from "../../Concurrency.ts"
import type * as Decision from "../../Decision.ts"
import {
  decodeEnvelope,
  encodeMessageText,
  type Envelope,
  FAILURE_CODE_PATTERN,
  type MessageType,
  type OutboundMessage,
} from "../../Protocol.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { Redeliveries } from "../../Transport.ts"
import type { LeaseLost } from "../../WorkerError.ts"
import { errorKind } from "../describe.ts"
import { decodeNonNegative } from "../codec/duration.ts"
import { formatIssues } from "../codec/issues.ts"

/** The failure message of `INTERNAL_ERROR`: never the exception's text. */
export const INTERNAL_MESSAGE = "The worker failed while running the task."

/** A message that names its task: what every decision about it carries. */
export interface TaskRef {
  readonly taskId: string
  /** Unknown for an envelope too broken to read its delivery count against. */
  readonly attempt?: number | undefined
  readonly deliveryLimit?: number | undefined
}

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
    readonly decision: Decision.Decision
  }
  | { readonly _tag: "Requeue"; readonly decision: Decision.Decision }
  | { readonly _tag: "Fenced"; readonly decision: Decision.Decision }

/** What an inbound message comes to before anything runs. */
export type Opening<A> =
  | { readonly _tag: "Settle"; readonly task: TaskRef | undefined; readonly plan: Plan }
  | {
    readonly _tag: "Start"
    readonly task: Task
    readonly envelope: Envelope
    readonly input: A
  }

/** What the handler's run came to. */
export type Result =
  | { readonly _tag: "Success"; readonly output: unknown }
  | { readonly _tag: "Fatal"; readonly code: string; readonly message: string }
  | {
    readonly _tag: "Retry"
    readonly code: string | undefined
    readonly message: string | undefined
    readonly delay: unknown
    readonly congestion: boolean
  }
  | { readonly _tag: "Timeout" }
  | {
    readonly _tag: "Internal"
    readonly name: string
    /** The handler's whole Cause, for the log line only: never published. */
    readonly cause: Cause.Cause<unknown>
  }
  | { readonly _tag: "Lost"; readonly lost: LeaseLost }
  | { readonly _tag: "Shutdown" }

/** A line the step that carries out a plan logs first. */
export interface Note {
  readonly level: "warning" | "error"
  readonly message: string
  readonly error?: string | undefined
  /** The handler's Cause, logged with the line (its message and stack reach the app's Logger). */
  readonly cause?: Cause.Cause<unknown> | undefined
}

/**
 * The step after the handler: settle as planned (after logging `note`), or wait the retry's
 * backoff (the error's own `delay`, if valid) and then requeue.
 */
export type Next =
  | { readonly _tag: "Settle"; readonly plan: Plan; readonly note?: Note | undefined }
  | { readonly _tag: "Backoff"; readonly delay: unknown; readonly plan: Plan }

/** Whether a broker's delivery count is one: an integer, not negative. */
const isDeliveryCount = (count: unknown): count is number =>
  typeof count === "number" && Number.isInteger(count) && count >= 0

/** The message's attempt and the limit it counts against, from what the broker says. */
export const attemptOf = (
  redeliveries: Redeliveries,
  deliveryLimit: number,
): { readonly attempt: number; readonly deliveryLimit: number } =>
  redeliveries._tag === "Counted"
    // A count that is not one (negative, fractional) is taken as the first attempt.
    ? { attempt: isDeliveryCount(redeliveries.count) ? redeliveries.count + 1 : 1, deliveryLimit }
    // A classic queue says only whether it was delivered before: one retry at most.
    : { attempt: redeliveries.redelivered ? 2 : 1, deliveryLimit: Math.min(deliveryLimit, 2) }

/** The decision of `task` with `outcome` and `action`. */
const decide = (
  task: TaskRef | undefined,
  outcome: Decision.Outcome,
  action: Decision.Action,
  extra: { readonly code?: string | undefined; readonly reason?: string | undefined } = {},
): Decision.Decision => ({
  outcome,
  action,
  taskId: task?.taskId,
  attempt: task?.attempt,
  deliveryLimit: task?.deliveryLimit,
  ...(extra.code === undefined ? {} : { code: extra.code }),
  ...(extra.reason === undefined ? {} : { reason: extra.reason }),
})

/** Requeue the message: the task runs again (or a lease lost first: the broker has it). */
export const requeue = (
  task: TaskRef | undefined,
  outcome: Decision.Outcome,
  extra?: { readonly code?: string | undefined; readonly reason?: string | undefined },
): Plan => ({ _tag: "Requeue", decision: decide(task, outcome, "nack-requeue", extra) })

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
  let encoded: Either.Either<string, { readonly message: string }>
  try {
    encoded = encodeMessageText(message)
  } catch {
    // A response whose getters throw, or a revoked Proxy.
    encoded = Either.left({ message: "it cannot be read" })
  }
  if (Either.isLeft(encoded)) {
    // Only a success can fail to encode here: its response is not JSON data.
    return fail(
      task,
      "INVALID_OUTPUT",
      `The handler's output is not JSON data: ${encoded.left.message}`,
    )
  }
  const code = message.type === "failure" ? message.code : undefined
  return {
    _tag: "Conclude",
    type: message.type,
    text: encoded.right,
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
 * Steps 1 to 3 of a delivery, and the input: decode (the poison rules), the attempt, the
 * delivery limit, the input schema.
 */
export const open = <A>(
  body: Uint8Array,
  redeliveries: Redeliveries,
  settings: Pick<WorkerSettings, "maxMessageBytes" | "deliveryLimit">,
  decodeInput: (u: unknown) => Either.Either<A, ParseResult.ParseError>,
): Opening<A> => {
  const decoded = decodeEnvelope(body, { maxBytes: settings.maxMessageBytes })
  if (decoded._tag === "Poison") {
    return {
      _tag: "Settle",
      task: undefined,
      plan: { _tag: "Ack", decision: decide(undefined, "poison", "ack", decoded) },
    }
  }
  if (decoded._tag === "InvalidEnvelope") {
    const task = { taskId: decoded.taskId }
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
  const task: Task = {
    taskId: envelope.taskId,
    ...attemptOf(redeliveries, settings.deliveryLimit),
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
  if (Either.isLeft(input)) {
    return {
      _tag: "Settle",
      task,
      plan: fail(task, "INVALID_INPUT", `The task input is invalid: ${formatIssues(input.left)}`),
    }
  }
  return { _tag: "Start", task, envelope, input: input.right }
}

const isTagged = (u: unknown, tag: string): u is { readonly _tag: string } =>
  typeof u === "object" && u !== null && (u as { _tag?: unknown })._tag === tag

/**
 * What the handler's exit means. Never throws, whatever the handler failed with (a value with
 * a throwing getter, a revoked Proxy): anything unreadable is an unexpected error.
 */
export const classify = (exit: Exit.Exit<unknown, unknown>): Result => {
  if (Exit.isSuccess(exit)) return { _tag: "Success", output: exit.value }
  if (Cause.isInterruptedOnly(exit.cause)) {
    return { _tag: "Internal", name: "Interrupted", cause: exit.cause }
  }
  try {
    const failure = Cause.failureOption(exit.cause)
    const error = failure._tag === "Some" ? failure.value : Cause.squash(exit.cause)
    if (isTagged(error, "FatalError")) {
      const e = error as unknown as { code: unknown; message: unknown }
      return { _tag: "Fatal", code: String(e.code), message: String(e.message ?? "") }
    }
    if (isTagged(error, "RetryableError")) {
      const e = error as unknown as {
        code?: unknown
        message?: unknown
        delay?: unknown
        congestion?: unknown
      }
      return {
        _tag: "Retry",
        code: e.code === undefined ? undefined : String(e.code),
        // A tagged error made without a message inherits `Error.prototype.message` (""): an
        // empty message falls back to the sentence as an absent one does.
        message: typeof e.message === "string" && e.message !== "" ? e.message : undefined,
        delay: e.delay,
        congestion: e.congestion === true,
      }
    }
    return { _tag: "Internal", name: errorKind(error), cause: exit.cause }
  } catch {
    return { _tag: "Internal", name: "unreadable error", cause: exit.cause }
  }
}

/** How the handler ended, as the adaptive concurrency policy reads it. */
export const handlerEnd = (result: Result): Concurrency.HandlerEnd => {
  switch (result._tag) {
    case "Success":
      return "success"
    case "Retry":
      return result.congestion ? "congestion" : "other"
    case "Timeout":
      return "timeout"
    default:
      return "other"
  }
}

/** Step 6 for a handler that succeeded: its output, encoded by the output schema, is the response. */
const succeeded = (
  output: unknown,
  task: Task,
  encodeOutput: (u: unknown) => Either.Either<unknown, ParseResult.ParseError>,
): Plan => {
  let encoded: Either.Either<unknown, ParseResult.ParseError | undefined>
  try {
    encoded = encodeOutput(output)
  } catch {
    encoded = Either.left(undefined)
  }
  if (Either.isLeft(encoded)) {
    return fail(
      task,
      "INVALID_OUTPUT",
      encoded.left === undefined
        ? "The handler's output could not be encoded with the output schema."
        : `The handler's output does not match the output schema: ${formatIssues(encoded.left)}`,
    )
  }
  const response = encoded.right as Record<string, unknown>
  return conclude({ type: "success", task_id: task.taskId, response }, task, "success")
}

/** A failure with the handler's own code, or `INTERNAL_ERROR` (and a warning) for a bad one. */
const failWithCode = (task: Task, code: string, message: string): Next =>
  FAILURE_CODE_PATTERN.test(code) ? { _tag: "Settle", plan: fail(task, code, message) } : {
    _tag: "Settle",
    plan: fail(task, "INTERNAL_ERROR", INTERNAL_MESSAGE),
    note: {
      level: "warning",
      message: `The handler failed with the code "${code.slice(0, 80)}", which is not a valid code`,
    },
  }

/** Step 6 for any result: what the task comes to. */
export const afterHandler = (
  result: Result,
  task: Task,
  settings: Pick<WorkerSettings, "taskTimeout">,
  encodeOutput: (u: unknown) => Either.Either<unknown, ParseResult.ParseError>,
): Next => {
  switch (result._tag) {
    case "Success":
      return { _tag: "Settle", plan: succeeded(result.output, task, encodeOutput) }
    case "Fatal":
      return failWithCode(task, result.code, result.message)
    case "Retry":
      if (task.attempt < task.deliveryLimit) {
        return {
          _tag: "Backoff",
          delay: result.delay,
          plan: requeue(task, "retry", { code: result.code }),
        }
      }
      return failWithCode(
        task,
        result.code ?? "RETRY_EXHAUSTED",
        result.message ?? `The task failed on each of its ${task.deliveryLimit} attempts.`,
      )
    case "Timeout":
      return {
        _tag: "Settle",
        plan: fail(
          task,
          "TASK_TIMEOUT",
          `The task ran past its time limit of ${Duration.format(settings.taskTimeout)}.`,
        ),
      }
    case "Internal":
      return {
        _tag: "Settle",
        plan: fail(task, "INTERNAL_ERROR", INTERNAL_MESSAGE),
        note: {
          level: "error",
          message: `The handler failed with an unexpected ${result.name}`,
          error: result.name,
          cause: result.cause,
        },
      }
    case "Lost":
      return { _tag: "Settle", plan: fenced(task, `lease_${result.lost.reason}`) }
    case "Shutdown":
      return { _tag: "Settle", plan: requeue(task, "shutdown_requeued") }
  }
}

/**
 * The backoff before the requeue of `attempt`, from a random `r` in [0, 1): exponential from
 * `base`, capped at `max`, with equal jitter (between half and all of it); or the error's own
 * delay (seconds, or a `DurationInput`), capped at `max`. `ownIgnored` says that an own delay was
 * given but names no duration, or a negative or NaN one: an ordinary retry, to warn about.
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

/** The warning a delivery's count calls for, when it is not a count. */
export const countWarning = (redeliveries: Redeliveries): string | undefined =>
  redeliveries._tag === "Counted" && !isDeliveryCount(redeliveries.count)
    ? `The delivery count (x-delivery-count) is not a count: ${
      String(redeliveries.count).slice(0, 40)
    }; taken as the first attempt`
    : undefined
