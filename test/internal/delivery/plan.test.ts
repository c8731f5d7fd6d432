/**
 * The plan's own rules, as plain values — no fiber, no broker, no clock: how long a requeue
 * waits. What a message opens to is in `open.test.ts`, what a handler's end comes to in
 * `conclude.test.ts`.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration } from "effect"
import {
  backoffMillis,
  deliveryIdOf,
  messageIdOf,
  requeue,
  returnedAs,
} from "../../../src/internal/delivery/plan.ts"

const settings = {
  retryBackoffBase: Duration.seconds(1),
  retryBackoffMax: Duration.seconds(60),
}

describe("backoffMillis", () => {
  it("equal jitter of base * 2^(attempt - 1), capped; an own delay exactly, capped; a bad one ignored", () => {
    expect(backoffMillis(settings, 1, undefined, 0)).toEqual({ millis: 500, ownIgnored: false })
    expect(backoffMillis(settings, 3, undefined, 0.5).millis).toBe(3000)
    expect(backoffMillis(settings, 10, undefined, 0).millis).toBe(30_000)
    expect(backoffMillis(settings, 1, 7, 0)).toEqual({ millis: 7000, ownIgnored: false })
    expect(backoffMillis(settings, 1, "5 minutes", 0).millis).toBe(60_000)
    expect(backoffMillis(settings, 1, "nonsense", 0)).toEqual({ millis: 500, ownIgnored: true })
    expect(backoffMillis(settings, 1, -1, 0).ownIgnored).toBe(true)
  })
})

describe("message ids", () => {
  it("a delivery's id is eight base-36 characters, from the whole of [0, 1)", () => {
    expect(deliveryIdOf(0)).toBe("00000000")
    expect(deliveryIdOf(0.5)).toBe("i0000000")
    expect(deliveryIdOf(1 - 2 ** -53)).toBe("zzzzzzzz")
  })

  it("task, attempt, the delivery's id, type, and a progress message's number", () => {
    const task = { taskId: "t-1", attempt: 2, deliveryId: "k3x9a0b2" }
    expect(messageIdOf(task, "started")).toBe("t-1:2:k3x9a0b2:started")
    expect(messageIdOf(task, "progress", 3)).toBe("t-1:2:k3x9a0b2:progress:3")
    // An envelope too broken to read its attempt against: the first.
    expect(messageIdOf({ taskId: "t-1", deliveryId: "k3x9a0b2" }, "failure"))
      .toBe("t-1:1:k3x9a0b2:failure")
  })
})

describe("how a message goes back to the queue", () => {
  it("a failed attempt is rejected (counted on every broker), an unprocessed one nacked", () => {
    const table = [
      ["retry", undefined, "reject-requeue"],
      ["publish_failed", "started", "reject-requeue"],
      ["engine_error", undefined, "reject-requeue"],
      ["engine_error", "missing_service", "nack-requeue"],
      ["shutdown_requeued", undefined, "nack-requeue"],
      ["cancelled", "lease_lost", "nack-requeue"],
    ] as const
    for (const [outcome, reason, action] of table) {
      expect(returnedAs(outcome, reason), `${outcome} ${reason}`).toBe(action)
      const plan = requeue(
        { taskId: "t", attempt: 1, deliveryLimit: 3, deliveryId: "d" },
        outcome,
        { reason },
      )
      expect(plan.decision.action).toBe(action)
    }
  })
})
