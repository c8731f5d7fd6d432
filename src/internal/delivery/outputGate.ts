/**
 * Whether the output queue takes publishes, as the latest publish found it: a refused publish
 * closes the gate, a confirmed one opens it again. While it is closed, deliveries in hand are
 * held (their publishes retried with backoff) and new tasks wait before `started`: a full output
 * queue must neither burn the tasks' attempts nor make the worker spin. Each change of state is
 * logged once, so the rate of log lines stays bounded however many publishes are refused.
 */
import * as Effect from "effect/Effect"
import type { PublishError } from "../../WorkerError.ts"

export class OutputGate {
  private refusedWith: PublishError | undefined
  private readonly waiters = new Set<() => void>()

  /** Whether the latest publish was refused. */
  get refusing(): boolean {
    return this.refusedWith !== undefined
  }

  /**
   * A publish was confirmed: the gate opens and every waiter goes. `undefined` when it was open
   * already, as for nearly every publish: nothing to run.
   */
  accepted(): Effect.Effect<void> | undefined {
    if (this.refusedWith === undefined) return undefined
    this.refusedWith = undefined
    const waiters = [...this.waiters]
    this.waiters.clear()
    for (const wake of waiters) wake()
    return Effect.logInfo("The output queue accepts publishes again: held tasks go on")
  }

  /** A publish was refused: the gate closes, logged when it was open. */
  refused(error: PublishError): Effect.Effect<void> {
    const wasOpen = this.refusedWith === undefined
    this.refusedWith = error
    return wasOpen
      ? Effect.logWarning(
        `The output queue refused a publish (${error.reason}): tasks are held and their ` +
          "publishes retried until it accepts again",
      )
      : Effect.void
  }

  /**
   * Calls `listener` once when the gate is open: at once if it is, else at the next confirmed
   * publish. The returned function stops listening.
   */
  onOpen(listener: () => void): () => void {
    if (this.refusedWith === undefined) {
      listener()
      return () => {}
    }
    this.waiters.add(listener)
    return () => void this.waiters.delete(listener)
  }
}
