/**
 * What a handler returned, asked without trusting it: a handler may return anything, a Proxy
 * whose every trap throws included, and neither the engine nor the lifecycle may throw for it.
 */
import * as Effect from "effect/Effect"

/** An Effect, a Promise or thenable, or a plain value (an output, for the schema to judge). */
export type ResultKind = "effect" | "promise" | "value"

const readThen = (u: object): unknown => (u as { then?: unknown }).then

export const kindOf = (result: unknown): ResultKind => {
  if (typeof result !== "object" && typeof result !== "function") return "value"
  if (result === null) return "value"
  try {
    if (Effect.isEffect(result)) return "effect"
  } catch {
    // Not an Effect, whatever it is.
  }
  try {
    return typeof readThen(result) === "function" ? "promise" : "value"
  } catch {
    // A `then` that throws when read: as `Promise.resolve` takes it, a rejection.
    return "promise"
  }
}
