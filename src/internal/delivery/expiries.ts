/**
 * Leases the broker ended at its consumer timeout, remembered so that the attempt counts where the
 * broker does not count it: RabbitMQ 4 returns a delivery past its consumer timeout without
 * counting it in `x-delivery-count` (3.x counts it), so a task that outlasts the lease would run
 * again as the same attempt for ever. The next delivery of a task whose lease expired here is at
 * least the attempt after the one that expired. Kept by this worker only: another worker that
 * takes the task sees the broker's count.
 */
import type * as Decision from "../../Decision.ts"

/** Tasks remembered at most: the oldest is forgotten first. */
const MAX_REMEMBERED = 10_000

/** How much earlier than the consumer timeout a loss may come and still be its expiry. */
const EXPIRY_SLACK_MILLIS = 2_000

export class LeaseExpiries {
  /** The least attempt of a task's next delivery, for the tasks whose lease expired here. */
  private readonly nextAttempt = new Map<string, number>()

  /** The attempt of a delivery of `taskId` that the broker counts as `attempt`. */
  attemptOf(taskId: string, attempt: number): number {
    if (this.nextAttempt.size === 0) return attempt
    const least = this.nextAttempt.get(taskId)
    return least === undefined ? attempt : Math.max(attempt, least)
  }

  /**
   * The decision of a delivery held `heldMillis` of a `leaseMillis` lease: a lost lease held about
   * as long as the lease is its expiry (`lease_expired`), and the task's next delivery the attempt
   * after it. Once a task is remembered, its later returns keep its count (a rejection is the next
   * attempt, a nack the same one) until it is acked.
   */
  settled(decision: Decision.Decision, heldMillis: number, leaseMillis: number): Decision.Decision {
    const { taskId, attempt } = decision
    if (taskId === undefined || attempt === undefined) return decision
    const expired = decision.outcome === "cancelled" &&
      decision.reason?.startsWith("lease_") === true &&
      heldMillis >= leaseMillis - EXPIRY_SLACK_MILLIS
    if (expired) {
      this.remember(taskId, attempt + 1)
      return { ...decision, reason: "lease_expired" }
    }
    if (this.nextAttempt.size === 0 || !this.nextAttempt.has(taskId)) return decision
    if (decision.action === "reject-requeue") this.remember(taskId, attempt + 1)
    else if (decision.action === "nack-requeue") this.remember(taskId, attempt)
    else this.nextAttempt.delete(taskId)
    return decision
  }

  private remember(taskId: string, next: number): void {
    this.nextAttempt.delete(taskId)
    this.nextAttempt.set(taskId, next)
    if (this.nextAttempt.size > MAX_REMEMBERED) {
      this.nextAttempt.delete(this.nextAttempt.keys().next().value!)
    }
  }
}
