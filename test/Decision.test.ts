import { describe, expect, it } from "@effect/vitest"
import * as Decision from "../src/Decision.ts"

describe("Decision", () => {
  const lost: Decision.Decision = {
    outcome: "cancelled",
    action: "nack-requeue",
    taskId: "t-1",
    reason: "lease_channel_closed",
    attempt: 1,
    deliveryLimit: 5,
    blockedSeconds: 44.96,
  }

  it("a lease lost after a block of the event loop: the line ends with blocked_s, to a tenth", () => {
    expect(Decision.format(lost)).toBe(
      "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_channel_closed " +
        "attempt=1/5 blocked_s=45",
    )
  })

  it("the annotations carry blocked_s with the others", () => {
    expect(Decision.annotate(lost)({ service: "count-words" })).toEqual({
      service: "count-words",
      outcome: "cancelled",
      action: "nack-requeue",
      task_id: "t-1",
      attempt: 1,
      delivery_limit: 5,
      reason: "lease_channel_closed",
      blocked_s: 45,
    })
  })
})
