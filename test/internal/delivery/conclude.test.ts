/**
 * Concluding a delivery (step 6 decided): what a handler's exit means and what it comes to, as
 * plain values — no fiber, no broker, no clock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Context, Duration, Effect, Exit, Schema } from "effect"
import {
  afterHandler,
  classify,
  handlerEnd,
  INTERNAL_MESSAGE,
} from "../../../src/internal/delivery/conclude.ts"
import type { Task } from "../../../src/internal/delivery/plan.ts"
import { FatalError, LeaseLost, RetryableError } from "../../../src/WorkerError.ts"

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
      _tag: "Settle",
      plan: { _tag: "Conclude", type: "success", decision: { outcome: "success" } },
    })
    expect(success(justFits + "a")).toMatchObject({
      _tag: "Settle",
      plan: {
        _tag: "Conclude",
        type: "failure",
        decision: { outcome: "failure", code: "OUTPUT_TOO_LARGE", reason: "output_too_large" },
      },
    })
  })

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
        Exit.failCause(Cause.interrupt(undefined)),
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

  it("a service the worker was not given (Effect's own defect for it): requeued, no backoff, an error line", () => {
    class Database extends Context.Service<Database, { readonly save: () => void }>()(
      "app/Database",
    ) {}
    // The exit Effect itself gives a handler that asks for what its context lacks.
    const exit = Effect.runSyncExit(Effect.asVoid(Database) as Effect.Effect<void>)
    const verdict = classify(exit)
    expect(verdict).toEqual({ _tag: "MissingService", service: "app/Database" })
    expect(afterHandler(verdict, task, settings, encodeOutput)).toMatchObject({
      _tag: "Settle",
      plan: {
        _tag: "Requeue",
        decision: { outcome: "engine_error", action: "nack-requeue", reason: "missing_service" },
      },
      note: { level: "error", error: "MissingService" },
    })
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
          _tag: "Backoff",
          delay: undefined,
          plan: { _tag: "Requeue", decision: { outcome: "retry", reason: "transient" } },
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
        _tag: "Settle",
        plan: { decision: { outcome: "failure", code: "RETRY_EXHAUSTED", reason: "transient" } },
        note: { level: "error", error: "Error" },
      })
      if (next.plan._tag !== "Conclude") throw new Error("no conclusion")
      expect(JSON.parse(next.plan.text).data.error_message).toEqual({
        code: "RETRY_EXHAUSTED",
        message: "The task failed on each of its 5 attempts.",
      })
      expect(next.plan.text).not.toContain("hunter2")
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
        plan: { decision: { code: "INTERNAL_ERROR" } },
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
