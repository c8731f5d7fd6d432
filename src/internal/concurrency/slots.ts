/**
 * A counting semaphore taken and given back by every task: a worker's own limit, and a pool's.
 * Effect's `Semaphore` takes a permit through an `Effect.callback` even when one is free, and gives
 * it back through the fiber's runtime: most of a no-op task's steps. Here slots are taken
 * synchronously, by whoever records them in the same step, and only waiting is an Effect:
 * a wait that is interrupted, or a taker interrupted as it takes, cannot hold a slot it does not
 * know of.
 */
import * as Effect from "effect/Effect"

export class Slots {
  private taken = 0
  private readonly waiters = new Set<() => void>()
  private permits: number

  constructor(permits: number) {
    this.permits = permits
  }

  get free(): number {
    return this.permits - this.taken
  }

  /** Takes `n` slots now, if they are free. */
  tryTake(n = 1): boolean {
    if (this.free < n) return false
    this.taken += n
    return true
  }

  release(n = 1): void {
    this.taken -= n
    this.wake()
  }

  /** Sets the number of slots: takers keep theirs; waiters are woken if some are free. */
  resize(permits: number): void {
    this.permits = permits
    this.wake()
  }

  /**
   * Completes when `n` slots are free, taking none: a wake-up, after which {@link tryTake} may
   * still lose them to another taker. Every waiter that fits is woken, as any of them may be
   * interrupted before it takes. Free slots are checked as the wait begins, so a release between
   * a failed `tryTake` and this wait is not missed.
   */
  awaitFree(n = 1): Effect.Effect<void> {
    return Effect.callback<void>((resume) => {
      if (this.free >= n) return resume(Effect.void)
      const wake = () => {
        if (this.free < n) return
        this.waiters.delete(wake)
        resume(Effect.void)
      }
      this.waiters.add(wake)
      return Effect.sync(() => void this.waiters.delete(wake))
    })
  }

  private wake(): void {
    if (this.free <= 0) return
    for (const wake of this.waiters) wake()
  }
}
