/**
 * The worker process's logs: one JSON object per line on stdout — `ts`, `level`, `logger`,
 * `msg`, then `task_id`, `service` and `attempt` when bound, then the line's other annotations.
 * `Worker.run` and the CLI install it; an Effect app that brings its own logger keeps it.
 *
 * @since 0.1.0
 */
import { Cause, HashMap, type Layer, Logger, type LogLevel } from "effect"
import { errorKind } from "./internal/describe.ts"

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
  globalThis.console.log(format(options))
)

/**
 * Replaces Effect's default logger with {@link json}.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<never> = Logger.replace(Logger.defaultLogger, json)
