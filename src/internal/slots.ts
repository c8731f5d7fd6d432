/**
 * A counting semaphore for the engine's own limit, taken and given back by every task. Effect's
 * `Semaphore` takes a permit through an `Effect.async` even when one is free, and gives it back
 * through the fiber's runtime: most of a no-op task's steps. Here a free slot is taken in one
 * step, and only a take that must wait is an `Effect.async`.
 */
import { Effect } from "effect"

export class Slots {
  private taken = 0
  /** Takes waiting for a free slot, oldest first. */
  private readonly waiters = new Set<() => void>()

  constructor(private permits: number) {}

  get free(): number {
    return this.permits - this.taken
  }

  /**
   * Takes a slot, waiting for one. Waiters are woken, not given a slot: each takes one when it
   * runs, or waits again, so that a waiter interrupted in between holds no slot it cannot give
   * back. All are woken, as any of them may be the one interrupted.
   */
  readonly take: Effect.Effect<void> = Effect.suspend(() => {
    if (this.tryTake()) return Effect.void
    return Effect.async<void>((resume) => {
      const wake = () => {
        this.waiters.delete(wake)
        resume(this.take)
      }
      this.waiters.add(wake)
      return Effect.sync(() => void this.waiters.delete(wake))
    })
  })

  /** Takes a free slot now, if there is one. */
  tryTake(): boolean {
    if (this.free <= 0) return false
    this.taken++
    return true
  }

  release(): void {
    this.taken--
    this.wake()
  }

  /** Sets the number of slots: takers keep theirs; waiters are woken if some are free. */
  resize(permits: number): void {
    this.permits = permits
    this.wake()
  }

  private wake(): void {
    if (this.free <= 0) return
    for (const wake of this.waiters) wake()
  }
}
