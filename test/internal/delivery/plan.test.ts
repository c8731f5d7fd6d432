/**
 * The planner: what a delivery and a handler's result mean, as plain values — no fiber, no
 * broker, no clock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Duration, Exit, FiberId, Schema } from "effect"
import {
  afterHandler,
  attemptOf,
  backoffMillis,
  classify,
  countWarning,
  handlerEnd,
  INTERNAL_MESSAGE,
  open,
  type Task,
} from "../../../src/internal/delivery/plan.ts"
import { Redeliveries } from "../../../src/Transport.ts"
import { FatalError, LeaseLost, RetryableError } from "../../../src/WorkerError.ts"

const Input = Schema.Struct({ text: Schema.String })
const decodeInput = Schema.decodeUnknownEither(Input)
const encodeOutput = Schema.encodeUnknownEither(Schema.Struct({ words: Schema.Number }))
const settings = {
  maxMessageBytes: 1024,
  deliveryLimit: 5,
  taskTimeout: Duration.seconds(30),
  retryBackoffBase: Duration.seconds(1),
  retryBackoffMax: Duration.seconds(60),
}
const encoder = new TextEncoder()
const bytes = (value: unknown) => encoder.encode(JSON.stringify(value))
const first = Redeliveries.Counted({ count: 0 })
const task: Task = { taskId: "t", attempt: 1, deliveryLimit: 5 }

describe("plan", () => {
  describe("open", () => {
    it("poison is acked with its reason and no task", () => {
      const opening = open(encoder.encode("not json"), first, settings, decodeInput)
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
      const opening = open(bytes({ task_id: "t-1", data: {} }), first, settings, decodeInput)
      expect(opening._tag).toBe("Settle")
      if (opening._tag !== "Settle") return
      expect(opening.task).toEqual({ taskId: "t-1" })
      expect(opening.plan).toMatchObject({
        _tag: "Conclude",
        type: "failure",
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
      const opening = open(envelope, Redeliveries.Counted({ count: 5 }), settings, decodeInput)
      expect(opening).toMatchObject({
        _tag: "Settle",
        task: { taskId: "t-2", attempt: 6, deliveryLimit: 5 },
        plan: { decision: { code: "TASK_ABANDONED_AFTER_REDELIVERIES", outcome: "failure" } },
      })
    })

    it("a body the input schema rejects concludes INVALID_INPUT, naming the path, never the value", () => {
      const envelope = bytes({ task_id: "t-3", data: { body: { text: 42 } } })
      const opening = open(envelope, first, settings, decodeInput)
      expect(opening).toMatchObject({ plan: { decision: { code: "INVALID_INPUT" } } })
      if (opening._tag !== "Settle" || opening.plan._tag !== "Conclude") throw new Error("no")
      expect(opening.plan.text).toContain("text: expected string")
      expect(opening.plan.text).not.toContain("42")
    })

    it("a valid task starts with its attempt and decoded input", () => {
      const envelope = bytes({ task_id: "t-4", data: { body: { text: "a b" } } })
      expect(open(envelope, Redeliveries.Counted({ count: 2 }), settings, decodeInput))
        .toMatchObject({
          _tag: "Start",
          task: { taskId: "t-4", attempt: 3, deliveryLimit: 5 },
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

  describe("classify and afterHandler", () => {
    it("a FatalError with a valid code concludes with it; an invalid one is INTERNAL_ERROR and a warning", () => {
      const ok = afterHandler(
        classify(Exit.fail(new FatalError({ code: "EMPTY", message: "Nothing." }))),
        task,
        settings,
        encodeOutput,
      )
      expect(ok).toMatchObject({ _tag: "Settle", plan: { decision: { code: "EMPTY" } } })
      const bad = afterHandler(
        classify(Exit.fail(new FatalError({ code: "oops", message: "x" }))),
        task,
        settings,
        encodeOutput,
      )
      expect(bad).toMatchObject({
        _tag: "Settle",
        plan: { decision: { code: "INTERNAL_ERROR" } },
        note: { level: "warning" },
      })
    })

    it("a RetryableError backs off before the last attempt and concludes at it", () => {
      const retry = classify(Exit.fail(new RetryableError({ code: "LATER", delay: "2 seconds" })))
      expect(afterHandler(retry, task, settings, encodeOutput)).toMatchObject({
        _tag: "Backoff",
        delay: "2 seconds",
        plan: { _tag: "Requeue", decision: { outcome: "retry", code: "LATER" } },
      })
      const last = { ...task, attempt: 5 }
      expect(afterHandler(retry, last, settings, encodeOutput)).toMatchObject({
        _tag: "Settle",
        plan: { decision: { outcome: "failure", code: "LATER" } },
      })
      const anonymous = classify(Exit.fail(new RetryableError({})))
      expect(afterHandler(anonymous, last, settings, encodeOutput)).toMatchObject({
        plan: { decision: { code: "RETRY_EXHAUSTED" } },
      })
    })

    it("anything else is INTERNAL_ERROR with the fixed sentence, and an error line naming its kind", () => {
      for (
        const exit of [
          Exit.fail(new Error("secret")),
          Exit.die("secret"),
          Exit.failCause(Cause.interrupt(FiberId.none)),
        ]
      ) {
        const next = afterHandler(classify(exit), task, settings, encodeOutput)
        expect(next).toMatchObject({
          _tag: "Settle",
          plan: { decision: { code: "INTERNAL_ERROR" } },
          note: { level: "error" },
        })
        if (next._tag !== "Settle" || next.plan._tag !== "Conclude") throw new Error("no")
        expect(next.plan.text).toContain(INTERNAL_MESSAGE)
        expect(next.plan.text).not.toContain("secret")
      }
    })

    it("a success is the encoded output; an output that is not JSON data is INVALID_OUTPUT", () => {
      expect(afterHandler(classify(Exit.succeed({ words: 2 })), task, settings, encodeOutput))
        .toMatchObject({
          plan: {
            _tag: "Conclude",
            text: `{"task_id":"t","data":{"message_type":"success","response":{"words":2}}}`,
            decision: { outcome: "success", action: "conclude" },
          },
        })
      const infinite = afterHandler(
        classify(Exit.succeed({ words: Infinity })),
        task,
        settings,
        encodeOutput,
      )
      expect(infinite).toMatchObject({ plan: { decision: { code: "INVALID_OUTPUT" } } })
    })

    it("a time out, a lost lease, a shutdown", () => {
      expect(afterHandler({ _tag: "Timeout" }, task, settings, encodeOutput)).toMatchObject({
        plan: { decision: { code: "TASK_TIMEOUT" } },
      })
      const lost = new LeaseLost({ reason: "expired" })
      expect(afterHandler({ _tag: "Lost", lost }, task, settings, encodeOutput)).toMatchObject({
        plan: { _tag: "Fenced", decision: { outcome: "cancelled", reason: "lease_expired" } },
      })
      expect(afterHandler({ _tag: "Shutdown" }, task, settings, encodeOutput)).toMatchObject({
        plan: { _tag: "Requeue", decision: { outcome: "shutdown_requeued" } },
      })
    })

    it("how a handler ended, for adaptive concurrency", () => {
      expect(handlerEnd({ _tag: "Success", output: 1 })).toBe("success")
      expect(handlerEnd(classify(Exit.fail(new RetryableError({ congestion: true }))))).toBe(
        "congestion",
      )
      expect(handlerEnd({ _tag: "Timeout" })).toBe("timeout")
      expect(handlerEnd({ _tag: "Shutdown" })).toBe("other")
    })
  })

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
})
