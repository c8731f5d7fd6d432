/**
 * The leases the broker ended at its consumer timeout, counted by the worker: plain values, no
 * fiber, no clock.
 */
import { describe, expect, it } from "@effect/vitest"
import type * as Decision from "../../../src/Decision.ts"
import { LeaseExpiries } from "../../../src/internal/delivery/expiries.ts"

const LEASE = 100_000

const decision = (
  outcome: Decision.Outcome,
  action: Decision.Action,
  attempt: number,
  reason?: string,
): Decision.Decision => ({
  outcome,
  action,
  taskId: "t",
  attempt,
  deliveryLimit: 5,
  ...(reason === undefined ? {} : { reason }),
})

const lost = (attempt: number) =>
  decision("cancelled", "nack-requeue", attempt, "lease_consumer_cancelled")

describe("LeaseExpiries", () => {
  it("a lost lease held as long as the lease is its expiry: lease_expired, and the next delivery is the next attempt", () => {
    const expiries = new LeaseExpiries()
    expect(expiries.settled(lost(1), LEASE - 1_000, LEASE).reason).toBe("lease_expired")
    // RabbitMQ 4 returned it uncounted: the broker still says attempt 1.
    expect(expiries.attemptOf("t", 1)).toBe(2)
    // A broker that counted it (3.x) says 2 itself: not counted twice.
    expect(expiries.attemptOf("t", 2)).toBe(2)
    expect(expiries.attemptOf("other", 1)).toBe(1)
  })

  it("a lease lost well before the lease ends is no expiry: nothing remembered", () => {
    const expiries = new LeaseExpiries()
    expect(expiries.settled(lost(1), LEASE - 5_000, LEASE).reason).toBe("lease_consumer_cancelled")
    expect(expiries.attemptOf("t", 1)).toBe(1)
  })

  it("once remembered, a rejection is the next attempt, a nack the same one, an ack forgets", () => {
    const expiries = new LeaseExpiries()
    expiries.settled(lost(1), LEASE, LEASE)
    expiries.settled(decision("retry", "reject-requeue", 2), 10, LEASE)
    // The broker counted the rejection only: 2, where the worker knows 3.
    expect(expiries.attemptOf("t", 2)).toBe(3)
    expiries.settled(decision("shutdown_requeued", "nack-requeue", 3), 10, LEASE)
    expect(expiries.attemptOf("t", 2)).toBe(3)
    expiries.settled(decision("success", "conclude", 3), 10, LEASE)
    expect(expiries.attemptOf("t", 2)).toBe(2)
  })

  it("remembers at most 10 000 tasks, forgetting the oldest", () => {
    const expiries = new LeaseExpiries()
    for (let i = 0; i <= 10_000; i++) {
      expiries.settled({ ...lost(1), taskId: `t-${i}` }, LEASE, LEASE)
    }
    expect(expiries.attemptOf("t-0", 1)).toBe(1)
    expect(expiries.attemptOf("t-1", 1)).toBe(2)
    expect(expiries.attemptOf("t-10000", 1)).toBe(2)
  })
})
