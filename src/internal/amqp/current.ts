/**
 * The one holder of a transport's current session: `now` is a plain read, for the publish path
 * (an Effect per publish to read a `Ref` is a cost the bench sees); `get` waits for the next
 * session between connections. Replaces a `Ref`, a `Ref` of `Deferred` and a variable that had to
 * be kept in step.
 */
import * as Effect from "effect/Effect"

export class Current<A> {
  private value: A | undefined = undefined
  private latest: A | undefined = undefined
  private readonly waiting = new Set<(value: A) => void>()

  /** The value now, if there is one. */
  get now(): A | undefined {
    return this.value
  }

  /** The value held last, cleared or not: what readiness names after a loss. */
  get last(): A | undefined {
    return this.latest
  }

  /** The value now, or the next one set: a wait that is interrupted is forgotten. */
  readonly get: Effect.Effect<A> = Effect.suspend(() => {
    if (this.value !== undefined) return Effect.succeed(this.value)
    return Effect.callback<A>((resume) => {
      const waiter = (value: A) => resume(Effect.succeed(value))
      this.waiting.add(waiter)
      return Effect.sync(() => void this.waiting.delete(waiter))
    })
  })

  /** Holds `value`, and hands it to every wait. */
  set(value: A): void {
    this.value = value
    this.latest = value
    const waiting = [...this.waiting]
    this.waiting.clear()
    for (const waiter of waiting) waiter(value)
  }

  /** Holds nothing: `get` waits for the next value. */
  clear(): void {
    this.value = undefined
  }
}
