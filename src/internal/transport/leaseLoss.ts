/**
 * The loss of a lease, as both transports report it: once, to every listener, and at once to a
 * listener that comes late.
 */
import { LeaseLost } from "../../WorkerError.ts"

type Listener = (lost: LeaseLost) => void

export class LeaseLoss {
  /** Why the lease was lost, once it is. */
  lost: LeaseLost | undefined
  /** The listeners: one alone (every delivery's lease has one, the engine's), or a set. */
  private listeners: Listener | Set<Listener> | undefined

  /** Calls `listener` when the lease is lost (at once if it is); returns how to stop listening. */
  onLost(listener: Listener): () => void {
    if (this.lost !== undefined) {
      listener(this.lost)
      return () => {}
    }
    const current = this.listeners
    if (current === undefined) this.listeners = listener
    else if (current instanceof Set) current.add(listener)
    else this.listeners = new Set([current, listener])
    return () => this.forget(listener)
  }

  private forget(listener: Listener): void {
    const current = this.listeners
    if (current === listener) this.listeners = undefined
    else if (current instanceof Set) current.delete(listener)
  }

  /** Loses the lease, if it is not lost yet, and tells every listener. */
  lose(reason: LeaseLost["reason"]): void {
    if (this.lost !== undefined) return
    const lost = new LeaseLost({ reason })
    this.lost = lost
    const current = this.listeners
    this.listeners = undefined
    if (current === undefined) return
    const listeners = current instanceof Set ? current : [current]
    for (const listener of listeners) {
      try {
        listener(lost)
      } catch {
        // A listener's failure is its own: the transport's state must stay whole.
      }
    }
  }
}
