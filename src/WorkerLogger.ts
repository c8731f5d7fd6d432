/**
 * The worker process's logs: one JSON object per line on stdout — `ts`, `level`, `logger`,
 * `msg`, then `task_id`, `service` and `attempt` when bound, then the line's other annotations,
 * and for a line with a cause its kind (`error_type`), message (`error_message`, without the
 * kind) and stack.
 * `Worker.run` and the CLI install it; an Effect app that brings its own logger keeps it.
 *
 * @since 0.1.0
 */
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import type * as LogLevel from "effect/LogLevel"
import * as References from "effect/References"
import { errorKind, errorTextBesideKind } from "./internal/describe.ts"

/**
 * The `logger` of lines that do not name one.
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_LOGGER_NAME = "async_task_worker"

// Python's names, as the platform's other workers log them.
const levelName = (level: LogLevel.LogLevel): string => {
  switch (level) {
    case "Warn":
      return "WARNING"
    case "Fatal":
      return "CRITICAL"
    default:
      return level.toUpperCase()
  }
}

const text = (u: unknown): string => {
  if (typeof u === "string") return u
  try {
    return JSON.stringify(u) ?? String(u)
  } catch {
    return String(u)
  }
}

/** Every failure's error, then every defect: the order `error_type` names them in. */
const errors = (cause: Cause.Cause<unknown>): Array<unknown> => [
  ...cause.reasons.filter(Cause.isFailReason).map((reason) => reason.error),
  ...cause.reasons.filter(Cause.isDieReason).map((reason) => reason.defect),
]

/**
 * The first failure's (else defect's) message and stack, for its author to debug: the worker's
 * own log is where an error's text belongs, never the failure message the platform receives.
 * The message without the error's name, which `error_type` gives beside it.
 */
const errorDetail = (
  cause: Cause.Cause<unknown>,
  redact: ReadonlyArray<string>,
): { readonly message?: string; readonly stack?: string } => {
  const error = errors(cause)[0]
  if (error === undefined) return {}
  const clean = (text: string) =>
    redact.reduce((t, secret) => (secret === "" ? t : t.replaceAll(secret, "***")), text)
  const stack = error instanceof Error && typeof error.stack === "string" ? error.stack : undefined
  return {
    message: clean(errorTextBesideKind(error)),
    ...(stack === undefined ? {} : { stack: clean(stack) }),
  }
}

/**
 * Whether the worker's JSON lines carry an error's message and stack (`WORKER_LOG_ERROR_TEXT`),
 * as the lifecycle sets it from the settings (`Effect.provideService(CurrentErrorText, false)`).
 *
 * @since 0.2.0
 * @category references
 */
export const CurrentErrorText: Context.Reference<boolean> = Context.Reference(
  "@async-task/worker/WorkerLogger/CurrentErrorText",
  { defaultValue: () => true },
)

/**
 * Secrets never written (the broker's password): replaced by `***` in an error's message and
 * stack. The lifecycle sets it from the settings.
 *
 * @since 0.2.0
 * @category references
 */
export const CurrentRedactions: Context.Reference<ReadonlyArray<string>> = Context.Reference<
  ReadonlyArray<string>
>("@async-task/worker/WorkerLogger/CurrentRedactions", { defaultValue: () => [] })

const FIRST = ["task_id", "service", "attempt"] as const

/**
 * Formats one line. `annotations` are the line's log annotations, as a logger reads them
 * (`options.fiber.getRef(References.CurrentLogAnnotations)`).
 *
 * @since 0.1.0
 * @category codecs
 */
export const format = (options: {
  readonly date: Date
  readonly logLevel: LogLevel.LogLevel
  readonly message: unknown
  readonly annotations: Readonly<Record<string, unknown>>
  readonly cause: Cause.Cause<unknown>
  /** Whether an error's message and stack are written (`WORKER_LOG_ERROR_TEXT`); default yes. */
  readonly errorText?: boolean | undefined
  /** Secrets replaced by `***` wherever they appear in an error's message or stack. */
  readonly redact?: ReadonlyArray<string> | undefined
}): string => {
  const annotations = options.annotations
  const record: Record<string, unknown> = {
    ts: options.date.toISOString(),
    level: levelName(options.logLevel),
    logger: Object.hasOwn(annotations, "logger") ? String(annotations.logger) : DEFAULT_LOGGER_NAME,
    msg: (Array.isArray(options.message) ? options.message : [options.message]).map(text).join(
      " ",
    ),
  }
  for (const key of FIRST) {
    if (Object.hasOwn(annotations, key)) record[key] = annotations[key]
  }
  for (const [key, value] of Object.entries(annotations)) {
    if (key !== "logger" && !(key in record)) record[key] = value
  }
  if (options.cause.reasons.length > 0) {
    // What failed, by kind only: an error's text may hold a payload or a secret.
    const types = errors(options.cause).map(errorKind)
    record.error_type = types.length === 0 ? "Interrupted" : types.join(", ")
    if (options.errorText !== false) {
      const detail = errorDetail(options.cause, options.redact ?? [])
      if (detail.message !== undefined) record.error_message = detail.message
      if (detail.stack !== undefined) record.error_stack = detail.stack
    }
  }
  try {
    return JSON.stringify(record)
  } catch {
    // A value JSON cannot write (a BigInt, a cycle) in an annotation: keep the line, as text.
    return JSON.stringify(
      Object.fromEntries(
        Object.entries(record).map((
          [k, v],
        ) => [k, typeof v === "object" ? String(v) : typeof v === "bigint" ? v.toString() : v]),
      ),
    )
  }
}

/**
 * One line for a logger's call: {@link format} with the annotations, {@link CurrentErrorText}
 * and {@link CurrentRedactions} of the fiber that logs. For a logger that writes the JSON lines
 * somewhere other than stdout: `Logger.make((options) => sink(WorkerLogger.formatLog(options)))`.
 *
 * @since 0.2.0
 * @category codecs
 */
export const formatLog = (options: Logger.Options<unknown>): string =>
  format({
    date: options.date,
    logLevel: options.logLevel,
    message: options.message,
    cause: options.cause,
    annotations: options.fiber.getRef(References.CurrentLogAnnotations),
    errorText: options.fiber.getRef(CurrentErrorText),
    redact: options.fiber.getRef(CurrentRedactions),
  })

/**
 * The JSON logger, writing to stdout.
 *
 * @since 0.1.0
 * @category logging
 */
export const json: Logger.Logger<unknown, void> = Logger.make((options) =>
  globalThis.console.log(formatLog(options))
)

/**
 * Replaces Effect's default logger with {@link json}, keeping the others, as the SDK's layer did
 * on Effect 3: Effect's `Logger.tracerLogger` among them, so that a line logged in a
 * span is also an event of that span (a trace shows what its task logged), and an app's own.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<never> = Layer.effect(
  Logger.CurrentLoggers,
  Effect.withFiber((fiber) => {
    const loggers = new Set(fiber.getRef(Logger.CurrentLoggers))
    loggers.delete(Logger.defaultLogger)
    loggers.add(json)
    return Effect.succeed(loggers)
  }),
)
