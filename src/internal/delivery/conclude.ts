/**
 * Step 6 decided: what a handler's run comes to. Its exit is read as a {@link Verdict}
 * ({@link classify}), which comes to the {@link Next} step: a {@link Plan} to settle (a `success`
 * or `failure` to publish, a requeue, a lease lost), or a retry's backoff before the requeue.
 * Plain functions, tested without fibers (`test/internal/delivery/conclude.test.ts`).
 */
import { Cause, Duration, Exit, Result, type Schema } from "effect"
import type * as Concurrency from "../../Concurrency.ts"
import { FAILURE_CODE_PATTERN } from "../../Protocol.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type * as Transient from "../../Transient.ts"
import type { LeaseLost } from "../../WorkerError.ts"
import { errorKind, errorText } from "../describe.ts"
import { formatIssues } from "../codec/issues.ts"
import { utf8Exceeds } from "../codec/utf8.ts"
import { conclude, fail, fenced, type Plan, requeue, type Task, type TaskRef } from "./plan.ts"

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

/** A line the step that carries out a plan logs first. */
export interface Note {
  readonly level: "warning" | "error"
  readonly message: string
  readonly error?: string | undefined
  /** The handler's Cause, logged with the line (its message and stack reach the app's Logger). */
  readonly cause?: Cause.Cause<unknown> | undefined
}

/**
 * The step after the handler: settle as planned, or wait the retry's backoff (the error's own
 * `delay`, if valid) and then requeue; either after logging `note`.
 */
export type Next =
  | { readonly _tag: "Settle"; readonly plan: Plan; readonly note?: Note | undefined }
  | {
    readonly _tag: "Backoff"
    readonly delay: unknown
    readonly plan: Plan
    readonly note?: Note | undefined
  }

const isTagged = (u: unknown, tag: string): u is { readonly _tag: string } =>
  typeof u === "object" && u !== null && (u as { _tag?: unknown })._tag === tag

// What Effect dies with when an Effect asks for a service its context lacks (its `Context`
// module's own error, pinned by test/internal/delivery/conclude.test.ts).
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
const failWithCode = (task: Task, code: string, message: string): Next =>
  FAILURE_CODE_PATTERN.test(code) ? { _tag: "Settle", plan: fail(task, code, message) } : {
    _tag: "Settle",
    plan: fail(task, "INTERNAL_ERROR", INTERNAL_MESSAGE),
    note: {
      level: "warning",
      message: `The handler failed with the code "${code.slice(0, 80)}", which is not a valid code`,
    },
  }

/**
 * Step 6 for a transient error: retried as a `RetryableError` without a code, but with the
 * error's text in the worker's log (a warning for each retry, an error for the last attempt),
 * never in the failure the platform gets; `reason=transient` on the decision tells it apart.
 */
const transient = (verdict: Extract<Verdict, { _tag: "Transient" }>, task: Task): Next => {
  const last = task.attempt >= task.deliveryLimit
  const note: Note = {
    level: last ? "error" : "warning",
    message: `The handler failed with a transient ${verdict.name}` +
      (last ? " at its last attempt" : ": the task is retried"),
    error: verdict.name,
    cause: verdict.cause,
  }
  return last
    ? {
      _tag: "Settle",
      plan: fail(task, "RETRY_EXHAUSTED", exhausted(task), "failure", "transient"),
      note,
    }
    : {
      _tag: "Backoff",
      delay: verdict.delay,
      plan: requeue(task, "retry", { reason: "transient" }),
      note,
    }
}

/** Step 6 for any verdict: what the task comes to. */
export const afterHandler = (
  verdict: Verdict,
  task: Task,
  settings: Pick<WorkerSettings, "taskTimeout" | "maxOutputBytes">,
  encodeOutput: (u: unknown) => Result.Result<unknown, Schema.SchemaError>,
): Next => {
  switch (verdict._tag) {
    case "Success":
      return {
        _tag: "Settle",
        plan: succeeded(verdict.output, task, settings.maxOutputBytes, encodeOutput),
      }
    case "Fatal":
      return failWithCode(task, verdict.code, verdict.message)
    case "Retry":
      if (task.attempt < task.deliveryLimit) {
        return {
          _tag: "Backoff",
          delay: verdict.delay,
          plan: requeue(task, "retry", { code: verdict.code }),
        }
      }
      return failWithCode(
        task,
        verdict.code ?? "RETRY_EXHAUSTED",
        verdict.message ?? exhausted(task),
      )
    case "Transient":
      return transient(verdict, task)
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
          message: `The handler failed with an unexpected ${verdict.name}` + (
            verdict.ruleFailure === undefined
              ? ""
              : `; a retryOn rule failed on it: ${errorText(verdict.ruleFailure)}`
          ),
          error: verdict.name,
          cause: verdict.cause,
        },
      }
    case "Lost":
      return { _tag: "Settle", plan: fenced(task, `lease_${verdict.lost.reason}`) }
    case "Shutdown":
      return { _tag: "Settle", plan: requeue(task, "shutdown_requeued") }
    case "MissingService":
      // Not the task's fault: given back as it is, with no backoff, as the worker stops.
      return {
        _tag: "Settle",
        plan: requeue(task, "engine_error", { reason: "missing_service" }),
        note: {
          level: "error",
          message: `The handler needs the service "${verdict.service}", which this worker was ` +
            "not given: the task is requeued and the worker stops",
          error: "MissingService",
        },
      }
  }
}
