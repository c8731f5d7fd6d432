/**
 * Opening a delivery (steps 1 to 3, and the input): what a message means before anything runs,
 * as plain values — no fiber, no broker, no clock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Schema } from "effect"
import { attemptOf, countWarning, open } from "../../../src/internal/delivery/open.ts"
import { Redeliveries } from "../../../src/Transport.ts"
import { utf8 } from "../../support/builders.ts"

const Input = Schema.Struct({ text: Schema.String })
const decodeInput = Schema.decodeUnknownResult(Input)
const settings = { maxMessageBytes: 1024, deliveryLimit: 5 }
const bytes = (value: unknown) => utf8(JSON.stringify(value))
const first = Redeliveries.Counted({ count: 0 })
const deliveryId = "d0000001"

describe("open", () => {
  it("poison is acked with its reason and no task", () => {
    const opening = open(utf8("not json"), first, settings, decodeInput, deliveryId)
    expect(opening).toEqual({
      _tag: "Settle",
      task: undefined,
      plan: {
        _tag: "Ack",
        decision: {
          outcome: "poison",
          action: "ack",
          reason: "not_json",
          taskId: undefined,
          attempt: undefined,
          deliveryLimit: undefined,
        },
      },
    })
  })

  it("an invalid envelope that names its task concludes INVALID_MESSAGE, as poison", () => {
    const opening = open(
      bytes({ task_id: "t-1", data: {} }),
      first,
      settings,
      decodeInput,
      deliveryId,
    )
    expect(opening._tag).toBe("Settle")
    if (opening._tag !== "Settle") return
    expect(opening.task).toEqual({ taskId: "t-1", deliveryId })
    expect(opening.plan).toMatchObject({
      _tag: "Conclude",
      type: "failure",
      messageId: "t-1:1:d0000001:failure",
      decision: {
        outcome: "poison",
        action: "conclude",
        code: "INVALID_MESSAGE",
        reason: "invalid_envelope",
      },
    })
  })

  it("a task past the delivery limit is abandoned without starting", () => {
    const envelope = bytes({ task_id: "t-2", data: { body: { text: "a" } } })
    const opening = open(
      envelope,
      Redeliveries.Counted({ count: 5 }),
      settings,
      decodeInput,
      deliveryId,
    )
    expect(opening).toMatchObject({
      _tag: "Settle",
      task: { taskId: "t-2", attempt: 6, deliveryLimit: 5 },
      plan: { decision: { code: "TASK_ABANDONED_AFTER_REDELIVERIES", outcome: "failure" } },
    })
  })

  it("a body the input schema rejects concludes INVALID_INPUT, naming the path, never the value", () => {
    const envelope = bytes({ task_id: "t-3", data: { body: { text: 42 } } })
    const opening = open(envelope, first, settings, decodeInput, deliveryId)
    expect(opening).toMatchObject({ plan: { decision: { code: "INVALID_INPUT" } } })
    if (opening._tag !== "Settle" || opening.plan._tag !== "Conclude") throw new Error("no")
    expect(opening.plan.text).toContain("text: expected string")
    expect(opening.plan.text).not.toContain("42")
  })

  it("a valid task starts with its attempt and decoded input", () => {
    const envelope = bytes({ task_id: "t-4", data: { body: { text: "a b" } } })
    expect(open(envelope, Redeliveries.Counted({ count: 2 }), settings, decodeInput, deliveryId))
      .toMatchObject({
        _tag: "Start",
        task: { taskId: "t-4", attempt: 3, deliveryLimit: 5, deliveryId },
        input: { text: "a b" },
      })
  })
})

describe("attempts", () => {
  it("a count n is attempt n + 1; a count that is not one is the first attempt, with a warning", () => {
    expect(attemptOf(Redeliveries.Counted({ count: 3 }), 5)).toEqual({
      attempt: 4,
      deliveryLimit: 5,
    })
    for (const count of [-1, 2.5, Number.NaN]) {
      const redeliveries = Redeliveries.Counted({ count })
      expect(attemptOf(redeliveries, 5).attempt).toBe(1)
      expect(countWarning(redeliveries)).toContain("is not a count")
    }
    expect(countWarning(Redeliveries.Counted({ count: 0 }))).toBeUndefined()
  })

  it("RabbitMQ 4's acquired count is the deliveries, beside the attempt from the failed ones", () => {
    // Three shutdowns' nacks, no failure: still the first attempt, its fourth delivery.
    expect(attemptOf(Redeliveries.Counted({ count: 0, acquired: 3 }), 5)).toEqual({
      attempt: 1,
      deliveryLimit: 5,
      deliveries: 4,
    })
    expect(attemptOf(Redeliveries.Counted({ count: 2, acquired: 4 }), 5)).toEqual({
      attempt: 3,
      deliveryLimit: 5,
      deliveries: 5,
    })
    expect(attemptOf(Redeliveries.Counted({ count: 1, acquired: -1 }), 5)).toEqual({
      attempt: 2,
      deliveryLimit: 5,
    })
  })

  it("a classic queue's flag: attempt 1 or 2, of at most 2", () => {
    expect(attemptOf(Redeliveries.Flagged({ redelivered: false }), 5)).toEqual({
      attempt: 1,
      deliveryLimit: 2,
    })
    expect(attemptOf(Redeliveries.Flagged({ redelivered: true }), 1)).toEqual({
      attempt: 2,
      deliveryLimit: 1,
    })
  })
})
