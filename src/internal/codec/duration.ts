/**
 * A duration given by a person (a setting, a handler's retry delay), checked rather than
 * silently mended: `Duration.decode` turns a negative or NaN input into zero, and throws on
 * what it cannot read.
 */
import { Duration, Option } from "effect"

/** Whether the input itself is negative or NaN, which `Duration.decode` would make zero. */
export const isNegativeOrNaN = (input: Duration.DurationInput): boolean => {
  if (typeof input === "number") return !(input >= 0)
  if (typeof input === "bigint") return input < 0n
  if (typeof input === "string") return input.trim().startsWith("-")
  if (Array.isArray(input)) return !(input[0] * 1e9 + input[1] >= 0)
  return false
}

/** The duration `input` names, unless it names none, or a negative or NaN one. Never throws. */
export const decodeNonNegative = (input: unknown): Option.Option<Duration.Duration> => {
  const decoded = Duration.decodeUnknown(input)
  if (Option.isNone(decoded)) return decoded
  try {
    return isNegativeOrNaN(input as Duration.DurationInput) ? Option.none() : decoded
  } catch {
    return Option.none()
  }
}
