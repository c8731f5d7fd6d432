/**
 * What a delivery comes to, decided (`decide.ts`), as plain values — no fiber, no broker, no
 * clock: what a message opens to, the plan's own rules (ids, returns, backoff), and what a
 * handler's end comes to.
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Context, Duration, Effect, Exit, Schema } from "effect"
import {
  afterHandler,
  attemptOf,
  backoffMillis,
  classify,
  countWarning,
  deliveryIdOf,
  handlerEnd,
  INTERNAL_MESSAGE,
  messageIdOf,
  open,
  requeue,
  returnedAs,
  type Task,
  waitsBackoff,
} from "../../../src/internal/delivery/decide.ts"
import { Redeliveries } from "../../../src/Transport.ts"
import { FatalError, LeaseLost, RetryableError } from "../../../src/WorkerError.ts"
import { utf8 } from "../../support/builders.ts"

const Input = Schema.Struct({ text: Schema.String })
const decodeInput = Schema.decodeUnknownResult(Input)
const openSettings = { maxMessageBytes: 1024, deliveryLimit: 5 }
const bytes = (value: unknown) => utf8(JSON.stringify(value))
const first = Redeliveries.Counted({ count: 0 })
const deliveryId = "d0000001"

describe("open", () => {
  it("poison is acked with its reason and no task", () => {
    const opening = open(utf8("not json"), first, openSettings, decodeInput, deliveryId)
    expect(opening).toEqual({
      _tag: "Ack",
      task: undefined,
      decision: {
        outcome: "poison",
        action: "ack",
        reason: "not_json",
        taskId: undefined,
        attempt: undefined,
        deliveryLimit: undefined,
      },
    })
  })

  it("an invalid envelope that names its task concludes INVALID_MESSAGE, as poison", () => {
    const opening = open(
      bytes({ task_id: "t-1", data: {} }),
      first,
      openSettings,
      decodeInput,
      deliveryId,
    )
    expect(opening.task).toEqual({ taskId: "t-1", deliveryId })
    expect(opening).toMatchObject({
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
      openSettings,
      decodeInput,
      deliveryId,
    )
    expect(opening).toMatchObject({
      _tag: "Conclude",
      task: { taskId: "t-2", attempt: 6, deliveryLimit: 5 },
      decision: { code: "TASK_ABANDONED_AFTER_REDELIVERIES", outcome: "failure" },
    })
  })

  it("a body the input schema rejects concludes INVALID_INPUT, naming the path, never the value", () => {
    const envelope = bytes({ task_id: "t-3", data: { body: { text: 42 } } })
    const opening = open(envelope, first, openSettings, decodeInput, deliveryId)
    expect(opening).toMatchObject({ decision: { code: "INVALID_INPUT" } })
    if (opening._tag !== "Conclude") throw new Error("no")
    expect(opening.text).toContain("text: expected string")
    expect(opening.text).not.toContain("42")
  })

  it("a valid task starts with its attempt and decoded input", () => {
    const envelope = bytes({ task_id: "t-4", data: { body: { text: "a b" } } })
    expect(
      open(envelope, Redeliveries.Counted({ count: 2 }), openSettings, decodeInput, deliveryId),
    )
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

const backoffSettings = {
  retryBackoffBase: Duration.seconds(1),
  retryBackoffMax: Duration.seconds(60),
}

describe("backoffMillis", () => {
  it("equal jitter of base * 2^(attempt - 1), capped; an own delay exactly, capped; a bad one ignored", () => {
    expect(backoffMillis(backoffSettings, 1, undefined, 0)).toEqual({
      millis: 500,
      ownIgnored: false,
    })
    expect(backoffMillis(backoffSettings, 3, undefined, 0.5).millis).toBe(3000)
    expect(backoffMillis(backoffSettings, 10, undefined, 0).millis).toBe(30_000)
    expect(backoffMillis(backoffSettings, 1, 7, 0)).toEqual({ millis: 7000, ownIgnored: false })
    expect(backoffMillis(backoffSettings, 1, "5 minutes", 0).millis).toBe(60_000)
    expect(backoffMillis(backoffSettings, 1, "nonsense", 0)).toEqual({
      millis: 500,
      ownIgnored: true,
    })
    expect(backoffMillis(backoffSettings, 1, -1, 0).ownIgnored).toBe(true)
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

const encodeOutput = Schema.encodeUnknownResult(Schema.Struct({ words: Schema.Number }))
const settings = { taskTimeout: Duration.seconds(30), maxOutputBytes: 16 * 1024 * 1024 }
const task: Task = { taskId: "t", attempt: 1, deliveryLimit: 5, deliveryId: "d" }

describe("classify and afterHandler", () => {
  it("a result whose success message is past maxOutputBytes fails OUTPUT_TOO_LARGE at once; one at the limit succeeds", () => {
    const encodeText = Schema.encodeUnknownResult(Schema.Struct({ text: Schema.String }))
    // {"task_id":"t","data":{"message_type":"success","response":{"text":"…"}}}: 72 bytes around the text.
    const around = 72
    const limit = 16 * 1024
    const success = (chars: string) =>
      afterHandler({ _tag: "Success", output: { text: chars } }, task, {
        ...settings,
        maxOutputBytes: limit,
      }, encodeText)
    // Two bytes a character in UTF-8: measured as bytes, not characters.
    const justFits = "é".repeat((limit - around) / 2)
    expect(success(justFits)).toMatchObject({
      _tag: "Conclude",
      type: "success",
      decision: { outcome: "success" },
    })
    expect(success(justFits + "a")).toMatchObject({
      _tag: "Conclude",
      type: "failure",
      decision: { outcome: "failure", code: "OUTPUT_TOO_LARGE", reason: "output_too_large" },
    })
  })

  it("a FatalError with a valid code concludes with it; an invalid one is INTERNAL_ERROR and a warning", () => {
    const ok = afterHandler(
      classify(Exit.fail(new FatalError({ code: "EMPTY", message: "Nothing." }))),
      task,
      settings,
      encodeOutput,
    )
    expect(ok).toMatchObject({ decision: { code: "EMPTY" } })
    const bad = afterHandler(
      classify(Exit.fail(new FatalError({ code: "oops", message: "x" }))),
      task,
      settings,
      encodeOutput,
    )
    expect(bad).toMatchObject({
      decision: { code: "INTERNAL_ERROR" },
      note: { level: "warning" },
    })
  })

  it("a RetryableError backs off before the last attempt and concludes at it", () => {
    const retry = classify(Exit.fail(new RetryableError({ code: "LATER", delay: "2 seconds" })))
    expect(afterHandler(retry, task, settings, encodeOutput)).toMatchObject({
      delay: "2 seconds",
      _tag: "Requeue",
      decision: { outcome: "retry", code: "LATER" },
    })
    const last = { ...task, attempt: 5 }
    expect(afterHandler(retry, last, settings, encodeOutput)).toMatchObject({
      decision: { outcome: "failure", code: "LATER" },
    })
    const anonymous = classify(Exit.fail(new RetryableError({})))
    expect(afterHandler(anonymous, last, settings, encodeOutput)).toMatchObject({
      decision: { code: "RETRY_EXHAUSTED" },
    })
  })

  it("anything else is INTERNAL_ERROR with the fixed sentence, and an error line naming its kind", () => {
    for (
      const exit of [
        Exit.fail(new Error("secret")),
        Exit.die("secret"),
        Exit.failCause(Cause.interrupt(undefined)),
      ]
    ) {
      const next = afterHandler(classify(exit), task, settings, encodeOutput)
      expect(next).toMatchObject({
        decision: { code: "INTERNAL_ERROR" },
        note: { level: "error" },
      })
      if (next._tag !== "Conclude") throw new Error("no")
      expect(next.text).toContain(INTERNAL_MESSAGE)
      expect(next.text).not.toContain("secret")
    }
  })

  it("a success is the encoded output; an output that is not JSON data is INVALID_OUTPUT", () => {
    expect(afterHandler(classify(Exit.succeed({ words: 2 })), task, settings, encodeOutput))
      .toMatchObject({
        _tag: "Conclude",
        text: `{"task_id":"t","data":{"message_type":"success","response":{"words":2}}}`,
        decision: { outcome: "success", action: "conclude" },
      })
    const infinite = afterHandler(
      classify(Exit.succeed({ words: Infinity })),
      task,
      settings,
      encodeOutput,
    )
    expect(infinite).toMatchObject({ decision: { code: "INVALID_OUTPUT" } })
  })

  it("a time out, a lost lease, a shutdown", () => {
    expect(afterHandler({ _tag: "Timeout" }, task, settings, encodeOutput)).toMatchObject({
      decision: { code: "TASK_TIMEOUT" },
    })
    const lost = new LeaseLost({ reason: "expired" })
    expect(afterHandler({ _tag: "Lost", lost }, task, settings, encodeOutput)).toMatchObject({
      _tag: "Fenced",
      decision: { outcome: "cancelled", reason: "lease_expired" },
    })
    expect(afterHandler({ _tag: "Shutdown" }, task, settings, encodeOutput)).toMatchObject({
      _tag: "Requeue",
      decision: { outcome: "shutdown_requeued" },
    })
  })

  it("a service the worker was not given (Effect's own defect for it): requeued, no backoff, an error line", () => {
    class Database extends Context.Service<Database, { readonly save: () => void }>()(
      "app/Database",
    ) {}
    // The exit Effect itself gives a handler that asks for what its context lacks.
    const exit = Effect.runSyncExit(Effect.asVoid(Database) as Effect.Effect<void>)
    const verdict = classify(exit)
    expect(verdict).toEqual({ _tag: "MissingService", service: "app/Database" })
    const plan = afterHandler(verdict, task, settings, encodeOutput)
    expect(plan).toMatchObject({
      _tag: "Requeue",
      decision: { outcome: "engine_error", action: "nack-requeue", reason: "missing_service" },
      note: { level: "error", error: "MissingService" },
    })
    expect(waitsBackoff(plan.decision)).toBe(false)
    // A retry, and the requeues that did not come from the handler, wait; a shutdown's does not.
    expect(
      [
        afterHandler(classify(Exit.fail(new RetryableError({}))), task, settings, encodeOutput),
        requeue(task, "publish_failed"),
        requeue(task, "engine_error"),
        requeue(task, "shutdown_requeued"),
      ].map((p) => waitsBackoff(p.decision)),
    ).toEqual([true, true, true, false])
    expect(handlerEnd(verdict)).toBe("other")
    // Any other defect is the handler's own, and so is the same words thrown by a plain
    // function as it was called.
    expect(classify(Exit.die(new Error("Service not found, but not Effect's")))._tag).toBe(
      "Internal",
    )
    expect(classify(Exit.die(new Error("Service not found: payments")), true)._tag).toBe(
      "Internal",
    )
  })

  describe("an ordinary error and the definition's retryOn rules", () => {
    const reset = Object.assign(new Error("read ECONNRESET from db://admin:hunter2@db"), {
      code: "ECONNRESET",
    })
    const isReset = (e: unknown) => (e as { code?: unknown }).code === "ECONNRESET"

    it("failed, thrown or died with alike, a transient error backs off before the last attempt", () => {
      for (const [exit, threw] of [[Exit.fail(reset), false], [Exit.die(reset), true]] as const) {
        const verdict = classify(exit, threw, [isReset])
        expect(verdict).toMatchObject({ _tag: "Transient", name: "Error", delay: undefined })
        expect(afterHandler(verdict, task, settings, encodeOutput)).toMatchObject({
          delay: undefined,
          _tag: "Requeue",
          decision: { outcome: "retry", reason: "transient" },
          note: { level: "warning", error: "Error" },
        })
      }
      // The error's text is in the note's Cause, for the worker's log.
      const next = afterHandler(
        classify(Exit.fail(reset), false, [isReset]),
        task,
        settings,
        encodeOutput,
      )
      expect(Cause.squash(next.note!.cause!)).toBe(reset)
    })

    it("at the last attempt it concludes RETRY_EXHAUSTED with a fixed sentence, and an error line", () => {
      const last = { ...task, attempt: 5 }
      const next = afterHandler(
        classify(Exit.fail(reset), false, [isReset]),
        last,
        settings,
        encodeOutput,
      )
      expect(next).toMatchObject({
        decision: { outcome: "failure", code: "RETRY_EXHAUSTED", reason: "transient" },
        note: { level: "error", error: "Error" },
      })
      if (next._tag !== "Conclude") throw new Error("no conclusion")
      expect(JSON.parse(next.text).data.error_message).toEqual({
        code: "RETRY_EXHAUSTED",
        message: "The task failed on each of its 5 attempts.",
      })
      expect(next.text).not.toContain("hunter2")
    })

    it("the first answer but false decides: true is the usual backoff, a duration its delay", () => {
      const no = () => false
      expect(classify(Exit.fail(reset), false, [no, () => "7 seconds", () => true]))
        .toMatchObject({ _tag: "Transient", delay: "7 seconds" })
      expect(classify(Exit.fail(reset), false, [no, () => true, () => 7]))
        .toMatchObject({ _tag: "Transient", delay: undefined })
      // A rule written in JavaScript that answers nothing says no.
      const nothing = (() => undefined) as unknown as () => boolean
      expect(classify(Exit.fail(reset), false, [no, nothing])._tag).toBe("Internal")
      expect(classify(Exit.fail(reset))._tag).toBe("Internal")
    })

    it("the SDK's own errors, interruptions and a missing service are never put to the rules", () => {
      const asked: Array<unknown> = []
      const always = (e: unknown) => {
        asked.push(e)
        return true
      }
      expect(
        classify(Exit.fail(new FatalError({ code: "NO", message: "No." })), false, [always])._tag,
      )
        .toBe("Fatal")
      expect(classify(Exit.fail(new RetryableError({ code: "LATER" })), false, [always]))
        .toMatchObject({ _tag: "Retry", code: "LATER" })
      expect(classify(Exit.failCause(Cause.interrupt(undefined)), false, [always])._tag)
        .toBe("Internal")
      expect(classify(Exit.die(new Error("Service not found: payments")), false, [always])._tag)
        .toBe("MissingService")
      expect(asked).toEqual([])
    })

    it("a rule that throws: INTERNAL_ERROR, its failure in the error line", () => {
      const broken = () => {
        throw new RangeError("the rule's bug")
      }
      const verdict = classify(Exit.fail(reset), false, [broken, () => true])
      expect(verdict._tag).toBe("Internal")
      expect(afterHandler(verdict, task, settings, encodeOutput)).toMatchObject({
        decision: { code: "INTERNAL_ERROR" },
        note: {
          level: "error",
          message:
            "The handler failed with an unexpected Error; a retryOn rule failed on it: RangeError: the rule's bug",
        },
      })
    })

    it("a transient error ends as other for adaptive concurrency", () => {
      expect(handlerEnd(classify(Exit.fail(reset), false, [isReset]))).toBe("other")
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
