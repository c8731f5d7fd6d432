/**
 * What a delivery comes to, decided: pure functions over plain values, tested without fibers
 * (`test/internal/delivery/decide.test.ts`). Every way through a delivery comes to a {@link Plan},
 * which the settlement carries out (`settle.ts`):
 *
 * - **Opening** (steps 1 to 3, and the input): the message decoded by the poison rules, its
 *   attempt read and held against the delivery limit, its input decoded: a task to {@link Start},
 *   or a plan to settle at once ({@link open}).
 * - **The handler's verdict** (step 6): the handler's exit read as a {@link Verdict}
 *   ({@link classify}), and what it comes to ({@link afterHandler}).
 * - **Backoff**: how long a return to the queue waits, and a refused publish before its next try
 *   ({@link backoffMillis}, the one formula).
 */
import * as Cause from "effect/Cause"
import * as Duration from "effect/Duration"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import type * as Schema from "effect/Schema"
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
import type * as Transient from "../../Transient.ts"
import type { Redeliveries } from "../../Transport.ts"
import type { LeaseLost } from "../../WorkerError.ts"
import { decodeNonNegative } from "../codec/duration.ts"
import { formatIssues } from "../codec/issues.ts"
import { utf8Exceeds } from "../codec/utf8.ts"
import { errorKind, errorText } from "../describe.ts"
import type { LeaseExpiries } from "./expiries.ts"

// ---------------------------------------------------------------------------------------------
// Tasks and plans

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

/**
 * A line the settlement logs first: what the handler's run came to, when the worker's author must
 * hear of it.
 */
export interface Note {
  readonly level: "warning" | "error"
  readonly message: string
  readonly error?: string | undefined
  /** The handler's Cause, logged with the line (its message and stack reach the app's Logger). */
  readonly cause?: Cause.Cause<unknown> | undefined
}

/** What every plan carries: the task the message names (none for poison), and its decision. */
interface Planned {
  readonly task: TaskRef | undefined
  readonly decision: Decision.Decision
  readonly note?: Note | undefined
}

/**
 * What settling the delivery will do: ack it publishing nothing, conclude it (publish its terminal
 * message, then ack), give it back to the queue (a retry after its backoff, the error's own
 * `delay` if valid), or, its lease lost, leave it to the broker.
 */
export type Plan =
  | Planned & { readonly _tag: "Ack" }
  | Planned & {
    readonly _tag: "Conclude"
    readonly type: MessageType
    readonly text: string
    /** The message's id, the same for each of its copies. */
    readonly messageId: string
  }
  | Planned & { readonly _tag: "Requeue"; readonly delay?: unknown }
  | Planned & { readonly _tag: "Fenced" }

/** `plan`, with `note` to log before it is carried out. */
const noted = (plan: Plan, note: Note | undefined): Plan =>
  note === undefined ? plan : { ...plan, note }

/** What a decision may carry besides its outcome and action. */
interface Extra {
  readonly code?: string | undefined
  readonly reason?: string | undefined
}

/** The decision of `task` with `outcome` and `action`. */
const decisionOf = (
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
  task,
  decision: decisionOf(task, outcome, "ack", extra),
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
  task,
  decision: decisionOf(task, outcome, returnedAs(outcome, extra?.reason), extra),
})

/**
 * Retry the task: requeued (rejected, so that every broker counts it) after its backoff, the
 * error's own `delay` if it names one.
 */
const retry = (task: Task, delay: unknown, extra: Extra): Plan => ({
  _tag: "Requeue",
  task,
  decision: decisionOf(task, "retry", "reject-requeue", extra),
  delay,
})

/**
 * Whether a requeue waits its attempt's backoff first: a retry, and a requeue that did not come
 * from the handler (so that a fault that lasts cannot spin), but for a service missing, which
 * stops the worker and so cannot spin.
 */
export const waitsBackoff = (decision: Decision.Decision): boolean =>
  decision.outcome === "retry" || decision.outcome === "publish_failed" ||
  (decision.outcome === "engine_error" && decision.reason !== "missing_service")

/** A lost lease: the broker has the message back, and nothing more is published for it. */
export const fenced = (task: TaskRef | undefined, reason: string): Plan => ({
  _tag: "Fenced",
  task,
  decision: decisionOf(task, "cancelled", "nack-requeue", { reason }),
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
    task,
    decision: decisionOf(task, outcome, "conclude", { code, reason }),
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

// ---------------------------------------------------------------------------------------------
// Opening: steps 1 to 3, and the input

/** A task that may run: what its handler is called with. */
export interface Start<A> {
  readonly _tag: "Start"
  readonly task: Task
  readonly envelope: Envelope
  readonly input: A
}

/** What an inbound message comes to before anything runs: a task to start, or a plan at once. */
export type Opening<A> = Start<A> | Plan

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
    return ack(undefined, "poison", { reason: decoded.reason })
  }
  if (decoded._tag === "InvalidEnvelope") {
    return fail(
      { taskId: decoded.taskId, deliveryId },
      "INVALID_MESSAGE",
      `The task message is malformed: ${decoded.problem}.`,
      "poison",
      "invalid_envelope",
    )
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
    return fail(
      task,
      "TASK_ABANDONED_AFTER_REDELIVERIES",
      `The task was delivered ${task.attempt} times, past the limit of ${settings.deliveryLimit}: it was abandoned without running again.`,
    )
  }
  const input = decodeInput(envelope.body)
  if (Result.isFailure(input)) {
    return fail(task, "INVALID_INPUT", `The task input is invalid: ${formatIssues(input.failure)}`)
  }
  return { _tag: "Start", task, envelope, input: input.success }
}

// ---------------------------------------------------------------------------------------------
// The handler's verdict: step 6

/** The failure message of `INTERNAL_ERROR`: never the exception's text. */
export const INTERNAL_MESSAGE = "The worker failed while running the task."

/** What the handler's run came to. */
export type Verdict =
  | { readonly _tag: "Success"; readonly output: unknown }
  | { readonly _tag: "Fatal"; readonly code: string; readonly message: string }
  | {
    readonly _tag: "Retry"
    readonly code: string | undefined
    readonly message: string | undefined
    readonly delay: unknown
    readonly congestion: boolean
  }
  /** An ordinary error the definition's `retryOn` says is transient. */
  | {
    readonly _tag: "Transient"
    readonly name: string
    /** The delay the rule asked for, or undefined for the usual backoff. */
    readonly delay: unknown
    /** The handler's whole Cause, for the log lines only: never published. */
    readonly cause: Cause.Cause<unknown>
  }
  | { readonly _tag: "Timeout" }
  | {
    readonly _tag: "Internal"
    readonly name: string
    /** The handler's whole Cause, for the log line only: never published. */
    readonly cause: Cause.Cause<unknown>
    /** What a `retryOn` rule threw when asked about the error, for the log line only. */
    readonly ruleFailure?: unknown
  }
  | { readonly _tag: "Lost"; readonly lost: LeaseLost }
  | { readonly _tag: "Shutdown" }
  /** The handler asked for a service the worker was not given: the deployment's defect. */
  | { readonly _tag: "MissingService"; readonly service: string }

const isTagged = (u: unknown, tag: string): u is { readonly _tag: string } =>
  typeof u === "object" && u !== null && (u as { _tag?: unknown })._tag === tag

// What Effect dies with when an Effect asks for a service its context lacks (its `Context`
// module's own error, pinned by test/internal/delivery/decide.test.ts).
const SERVICE_NOT_FOUND = /^Service not found: (.+)$/

/** The service a defect of `cause` says is missing, if any. */
const missingService = (cause: Cause.Cause<unknown>): string | undefined => {
  for (const reason of cause.reasons) {
    if (!Cause.isDieReason(reason) || !(reason.defect instanceof Error)) continue
    const match = SERVICE_NOT_FOUND.exec(reason.defect.message)
    if (match !== null) return match[1]
  }
  return undefined
}

/**
 * What the definition's rules say of an ordinary error: the first answer but `false` (or nothing,
 * from a rule written in JavaScript), as the delay to wait (`true`: the usual backoff); or what a
 * rule threw, which ends the asking: a broken rule is a bug to see, not a "no".
 */
const askRules = (
  rules: ReadonlyArray<Transient.Rule>,
  error: unknown,
): { readonly delay: unknown } | { readonly failure: unknown } | undefined => {
  for (const rule of rules) {
    let answer: unknown
    try {
      answer = rule(error)
    } catch (failure) {
      return { failure }
    }
    if (answer === true) return { delay: undefined }
    if (answer !== false && answer !== undefined && answer !== null) return { delay: answer }
  }
  return undefined
}

/**
 * What the handler's exit means. Never throws, whatever the handler failed with (a value with
 * a throwing getter, a revoked Proxy): anything unreadable is an unexpected error. A missing
 * service is only an Effect's: not when the handler `threw` as it was called (a plain function's
 * `throw new Error("Service not found: …")` is the task's error, not the deployment's). Any other
 * error, failed or thrown or died with alike (an `async` handler's `TypeError` is an Effect's
 * defect), is put to the definition's `retryOn` rules.
 */
export const classify = (
  exit: Exit.Exit<unknown, unknown>,
  threw = false,
  retryOn: ReadonlyArray<Transient.Rule> = [],
): Verdict => {
  if (Exit.isSuccess(exit)) return { _tag: "Success", output: exit.value }
  if (Cause.hasInterruptsOnly(exit.cause)) {
    return { _tag: "Internal", name: "Interrupted", cause: exit.cause }
  }
  try {
    const service = threw ? undefined : missingService(exit.cause)
    if (service !== undefined) return { _tag: "MissingService", service }
    const failure = Cause.findErrorOption(exit.cause)
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
    const answer = askRules(retryOn, error)
    if (answer !== undefined && "delay" in answer) {
      return { _tag: "Transient", name: errorKind(error), delay: answer.delay, cause: exit.cause }
    }
    return {
      _tag: "Internal",
      name: errorKind(error),
      cause: exit.cause,
      ruleFailure: answer?.failure,
    }
  } catch {
    return { _tag: "Internal", name: "unreadable error", cause: exit.cause }
  }
}

/** How the handler ended, as the adaptive concurrency policy reads it. */
export const handlerEnd = (verdict: Verdict): Concurrency.HandlerEnd => {
  switch (verdict._tag) {
    case "Success":
      return "success"
    case "Retry":
      return verdict.congestion ? "congestion" : "other"
    case "Timeout":
      return "timeout"
    default:
      return "other"
  }
}

/**
 * The failure of a result the output cannot carry: past `WORKER_MAX_OUTPUT_BYTES`, or past the
 * largest message the broker takes (learned from its refusal). Not retried: the same handler
 * would return the same result.
 */
export const outputTooLarge = (task: TaskRef, maxBytes: number | undefined): Plan =>
  fail(
    task,
    "OUTPUT_TOO_LARGE",
    maxBytes === undefined
      ? "The handler's result is larger than the broker takes."
      : `The handler's result is larger than the ${maxBytes} bytes a message may have.`,
    "failure",
    "output_too_large",
  )

/** Step 6 for a handler that succeeded: its output, encoded by the output schema, is the response. */
const succeeded = (
  output: unknown,
  task: Task,
  maxOutputBytes: number,
  encodeOutput: (u: unknown) => Result.Result<unknown, Schema.SchemaError>,
): Plan => {
  let encoded: Result.Result<unknown, Schema.SchemaError | undefined>
  try {
    encoded = encodeOutput(output)
  } catch {
    encoded = Result.fail(undefined)
  }
  if (Result.isFailure(encoded)) {
    return fail(
      task,
      "INVALID_OUTPUT",
      encoded.failure === undefined
        ? "The handler's output could not be encoded with the output schema."
        : `The handler's output does not match the output schema: ${formatIssues(encoded.failure)}`,
    )
  }
  const response = encoded.success as Record<string, unknown>
  const plan = conclude({ type: "success", task_id: task.taskId, response }, task, "success")
  return plan._tag === "Conclude" && utf8Exceeds(plan.text, maxOutputBytes)
    ? outputTooLarge(task, maxOutputBytes)
    : plan
}

/** The message of a retried task's last failure that has none of its own. */
const exhausted = (task: Task): string =>
  `The task failed on each of its ${task.deliveryLimit} attempts.`

/** A failure with the handler's own code, or `INTERNAL_ERROR` (and a warning) for a bad one. */
const failWithCode = (task: Task, code: string, message: string): Plan =>
  FAILURE_CODE_PATTERN.test(code)
    ? fail(task, code, message)
    : noted(fail(task, "INTERNAL_ERROR", INTERNAL_MESSAGE), {
      level: "warning",
      message: `The handler failed with the code "${code.slice(0, 80)}", which is not a valid code`,
    })

/**
 * Step 6 for a transient error: retried as a `RetryableError` without a code, but with the
 * error's text in the worker's log (a warning for each retry, an error for the last attempt),
 * never in the failure the platform gets; `reason=transient` on the decision tells it apart.
 */
const transient = (verdict: Extract<Verdict, { _tag: "Transient" }>, task: Task): Plan => {
  const last = task.attempt >= task.deliveryLimit
  const note: Note = {
    level: last ? "error" : "warning",
    message: `The handler failed with a transient ${verdict.name}` +
      (last ? " at its last attempt" : ": the task is retried"),
    error: verdict.name,
    cause: verdict.cause,
  }
  return noted(
    last
      ? fail(task, "RETRY_EXHAUSTED", exhausted(task), "failure", "transient")
      : retry(task, verdict.delay, { reason: "transient" }),
    note,
  )
}

/** Step 6 for any verdict: what the task comes to. */
export const afterHandler = (
  verdict: Verdict,
  task: Task,
  settings: Pick<WorkerSettings, "taskTimeout" | "maxOutputBytes">,
  encodeOutput: (u: unknown) => Result.Result<unknown, Schema.SchemaError>,
): Plan => {
  switch (verdict._tag) {
    case "Success":
      return succeeded(verdict.output, task, settings.maxOutputBytes, encodeOutput)
    case "Fatal":
      return failWithCode(task, verdict.code, verdict.message)
    case "Retry":
      if (task.attempt < task.deliveryLimit) {
        return retry(task, verdict.delay, { code: verdict.code })
      }
      return failWithCode(
        task,
        verdict.code ?? "RETRY_EXHAUSTED",
        verdict.message ?? exhausted(task),
      )
    case "Transient":
      return transient(verdict, task)
    case "Timeout":
      return fail(
        task,
        "TASK_TIMEOUT",
        `The task ran past its time limit of ${Duration.format(settings.taskTimeout)}.`,
      )
    case "Internal":
      return noted(fail(task, "INTERNAL_ERROR", INTERNAL_MESSAGE), {
        level: "error",
        message: `The handler failed with an unexpected ${verdict.name}` + (
          verdict.ruleFailure === undefined
            ? ""
            : `; a retryOn rule failed on it: ${errorText(verdict.ruleFailure)}`
        ),
        error: verdict.name,
        cause: verdict.cause,
      })
    case "Lost":
      return fenced(task, `lease_${verdict.lost.reason}`)
    case "Shutdown":
      return requeue(task, "shutdown_requeued")
    case "MissingService":
      // Not the task's fault: given back as it is, with no backoff, as the worker stops.
      return noted(requeue(task, "engine_error", { reason: "missing_service" }), {
        level: "error",
        message: `The handler needs the service "${verdict.service}", which this worker was ` +
          "not given: the task is requeued and the worker stops",
        error: "MissingService",
      })
  }
}

// ---------------------------------------------------------------------------------------------
// Backoff

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

/** How a refused publish backs off between its tries: from 100 ms, capped at 5 s. */
export const PUBLISH_BACKOFF: Pick<WorkerSettings, "retryBackoffBase" | "retryBackoffMax"> = {
  retryBackoffBase: Duration.millis(100),
  retryBackoffMax: Duration.seconds(5),
}
