import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { makeTaskContext } from "../src/testing.ts"

describe("TaskContext", () => {
  it.effect("progress is an Effect for Effect handlers", () =>
    Effect.gen(function* () {
      const { ctx, recorder } = makeTaskContext({ taskId: "t-1" })
      yield* ctx.progress(0.25)
      yield* ctx.progress(0.5, { stage: "ocr" })
      expect(recorder.updates).toEqual([
        { fraction: 0.25, payload: undefined },
        { fraction: 0.5, payload: { stage: "ocr" } },
      ])
    }))

  it("progress is awaitable for async handlers", async () => {
    const { ctx, recorder } = makeTaskContext()
    await ctx.progress(0.1)
    expect(recorder.fractions()).toEqual([0.1])
  })

  it("progress does nothing until it is run or awaited", () => {
    const { ctx, recorder } = makeTaskContext()
    void ctx.progress(0.1).pipe(Effect.asVoid)
    expect(recorder.updates).toEqual([])
  })

  it("signal fires when aborted, even if read afterwards", () => {
    const { abort, ctx } = makeTaskContext()
    abort("stop")
    expect(ctx.signal.aborted).toBe(true)
    expect(ctx.signal.reason).toBe("stop")
  })

  it("signal read before the abort fires then", () => {
    const { abort, ctx } = makeTaskContext({
      attempt: 3,
      deliveryLimit: 5,
      clientId: "c",
      inputRefs: ["r"],
    })
    const signal = ctx.signal
    expect(signal.aborted).toBe(false)
    abort()
    expect(signal.aborted).toBe(true)
    expect([ctx.attempt, ctx.deliveryLimit, ctx.clientId, ctx.inputRefs]).toEqual([3, 5, "c", [
      "r",
    ]])
  })

  it("signal and logger are made once, and the first abort's reason is kept", () => {
    const { abort, ctx } = makeTaskContext()
    expect(ctx.signal).toBe(ctx.signal)
    expect(ctx.logger).toBe(ctx.logger)
    abort("time limit")
    abort("shutdown")
    expect(ctx.signal.reason).toBe("time limit")
  })
})
