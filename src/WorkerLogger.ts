/**
 * The worker process's logs: one JSON object per line on stdout — `ts`, `level`, `logger`,
 * `msg`, then `task_id`, `service` and `attempt` when bound, then the line's other annotations,
 * and for a line with a cause its kind (`error_type`), message and stack.
 * `Worker.run` and the CLI install it; an Effect app that brings its own logger keeps it.
 *
 * @since 0.1.0
 */
import { Cause, FiberRef, FiberRefs, HashMap, type Layer, Logger, type LogLevel } from "effect"
import { errorKind, errorText } from "./internal/describe.ts"

/**
 * The `logger` of lines that do not name one.
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_LOGGER_NAME = "async_task_worker"

// Python's names, as the platform's other workers log them.
const levelName = (level: LogLevel.LogLevel): string => {
  switch (level._tag) {
    case "Warning":
      return "WARNING"
    case "Fatal":
      return "CRITICAL"
    default:
      return level.label
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

/** What failed, by kind only: an error's text may hold a payload or a secret. */
const errorTypes = (cause: Cause.Cause<unknown>): Array<string> =>
  [...Cause.failures(cause), ...Cause.defects(cause)].map(errorKind)

/**
 * The first failure's (else defect's) message and stack, for its author to debug: the worker's
 * own log is where an error's text belongs, never the failure message the platform receives.
 */
const errorDetail = (
  cause: Cause.Cause<unknown>,
  redact: ReadonlyArray<string>,
): { readonly message?: string; readonly stack?: string } => {
  const error = [...Cause.failures(cause), ...Cause.defects(cause)][0]
  if (error === undefined) return {}
  const clean = (text: string) =>
    redact.reduce((t, secret) => (secret === "" ? t : t.replaceAll(secret, "***")), text)
  const stack = error instanceof Error && typeof error.stack === "string" ? error.stack : undefined
  return {
    message: clean(errorText(error)),
    ...(stack === undefined ? {} : { stack: clean(stack) }),
  }
}

/**
 * Whether the worker's JSON lines carry an error's message and stack (`WORKER_LOG_ERROR_TEXT`),
 * as the lifecycle sets it from the settings.
 *
 * @since 0.1.0
 * @category fiber refs
 */
export const currentErrorText: FiberRef.FiberRef<boolean> = FiberRef.unsafeMake(true)

/**
 * Secrets never written (the broker's password): replaced by `***` in an error's message and
 * stack. The lifecycle sets it from the settings.
 *
 * @since 0.1.0
 * @category fiber refs
 */
export const currentRedactions: FiberRef.FiberRef<ReadonlyArray<string>> = FiberRef.unsafeMake<
  ReadonlyArray<string>
>([])

const FIRST = ["task_id", "service", "attempt"] as const

/**
 * Formats one line.
 *
 * @since 0.1.0
 * @category formatting
 */
export const format = (options: {
  readonly date: Date
  readonly logLevel: LogLevel.LogLevel
  readonly message: unknown
  readonly annotations: HashMap.HashMap<string, unknown>
  readonly cause: Cause.Cause<unknown>
  /** Whether an error's message and stack are written (`WORKER_LOG_ERROR_TEXT`); default yes. */
  readonly errorText?: boolean | undefined
  /** Secrets replaced by `***` wherever they appear in an error's message or stack. */
  readonly redact?: ReadonlyArray<string> | undefined
}): string => {
  const annotations = options.annotations
  const name = HashMap.get(annotations, "logger")
  const record: Record<string, unknown> = {
    ts: options.date.toISOString(),
    level: levelName(options.logLevel),
    logger: name._tag === "Some" ? String(name.value) : DEFAULT_LOGGER_NAME,
    msg: (Array.isArray(options.message) ? options.message : [options.message]).map(text).join(
      " ",
    ),
  }
  for (const key of FIRST) {
    const value = HashMap.get(annotations, key)
    if (value._tag === "Some") record[key] = value.value
  }
  for (const [key, value] of annotations) {
    if (key !== "logger" && !(key in record)) record[key] = value
  }
  if (!Cause.isEmptyType(options.cause)) {
    const types = errorTypes(options.cause)
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
 * The JSON logger, writing to stdout.
 *
 * @since 0.1.0
 * @category loggers
 */
export const json: Logger.Logger<unknown, void> = Logger.make((options) =>
  globalThis.console.log(format({
    ...options,
    errorText: FiberRefs.getOrDefault(options.context, currentErrorText),
    redact: FiberRefs.getOrDefault(options.context, currentRedactions),
  }))
)

/**
 * Replaces Effect's default logger with {@link json}.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<never> = Logger.replace(Logger.defaultLogger, json)
