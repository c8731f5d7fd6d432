/**
 * A duration given by a person (a setting, a handler's retry delay), checked rather than
 * silently mended: `Duration.fromInputUnsafe` turns a NaN input into zero, reads any object as
 * a duration of its fields (`{}` is zero), and throws on what it cannot read.
 */
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"

const FIELDS: ReadonlySet<string> = new Set([
  "weeks",
  "days",
  "hours",
  "minutes",
  "seconds",
  "milliseconds",
  "microseconds",
  "nanoseconds",
])

// An object names a duration only with fields of one, each a number: `{}` or `{ ms: 5 }` does not.
const isDurationObject = (input: object): boolean => {
  const keys = Object.keys(input)
  return keys.length > 0 && keys.every((key) => {
    const value = (input as Record<string, unknown>)[key]
    return FIELDS.has(key) && (value === undefined || typeof value === "number")
  })
}

/** The duration `input` names, or none when it names none. Never throws. */
export const decodeDuration = (input: unknown): Option.Option<Duration.Duration> => {
  if (
    typeof input === "object" && input !== null && !Array.isArray(input) &&
    !Duration.isDuration(input) && !isDurationObject(input)
  ) {
    return Option.none()
  }
  return Duration.fromInput(input as Duration.Input)
}

/**
 * Whether the input itself is negative or NaN: `Duration.fromInputUnsafe` would make a NaN
 * zero. For a string, a leading minus is enough (`"-0 seconds"` too).
 */
export const isNegativeOrNaN = (input: Duration.Input): boolean => {
  if (typeof input === "number") return !(input >= 0)
  if (typeof input === "bigint") return input < 0n
  if (typeof input === "string") return input.trim().startsWith("-")
  if (Array.isArray(input)) return !(input[0] * 1e9 + input[1] >= 0)
  if (Duration.isDuration(input)) return Duration.isNegative(input)
  const fields = Object.values(input) as ReadonlyArray<number | undefined>
  return fields.some((value) => Number.isNaN(value)) ||
    Duration.isNegative(Duration.fromInputUnsafe(input))
}

/** The duration `input` names, unless it names none, or a negative or NaN one. Never throws. */
export const decodeNonNegative = (input: unknown): Option.Option<Duration.Duration> => {
  const decoded = decodeDuration(input)
  if (Option.isNone(decoded)) return decoded
  try {
    return isNegativeOrNaN(input as Duration.Input) ? Option.none() : decoded
  } catch {
    return Option.none()
  }
}
