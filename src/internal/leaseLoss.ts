/**
 * The loss of a lease, as both transports report it: once, to every listener, and at once to a
 * listener that comes late.
 */
import { LeaseLost } from "../WorkerError.ts"

export class LeaseLoss {
  /** Why the lease was lost, once it is. */
  lost: LeaseLost | undefined
  private listeners: Set<(lost: LeaseLost) => void> | undefined

  /** Calls `listener` when the lease is lost (at once if it is); returns how to stop listening. */
  onLost(listener: (lost: LeaseLost) => void): () => void {
    if (this.lost !== undefined) {
      listener(this.lost)
      return () => {}
    }
    const listeners = (this.listeners ??= new Set())
    listeners.add(listener)
    return () => void listeners.delete(listener)
  }

  /** Loses the lease, if it is not lost yet, and tells every listener. */
  lose(reason: LeaseLost["reason"]): void {
    if (this.lost !== undefined) return
    const lost = new LeaseLost({ reason })
    this.lost = lost
    const listeners = this.listeners
    this.listeners = undefined
    if (listeners === undefined) return
    for (const listener of listeners) {
      try {
        listener(lost)
      } catch {
        // A listener's failure is its own: the transport's state must stay whole.
      }
    }
  }
}
