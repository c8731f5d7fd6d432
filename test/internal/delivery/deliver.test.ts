import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Logger, References, Schema } from "effect"
import { INTERNAL_MESSAGE } from "../../../src/internal/delivery/decide.ts"
import * as WorkerHarness from "../../../src/testing.ts"
import * as Worker from "../../../src/Worker.ts"
import { textOf } from "../../support/builders.ts"

const define = (
  handler: Worker.Handler<{ readonly text: string }, { readonly words: number }, never>,
) =>
  Worker.make({
    name: "count-words",
    input: Schema.Struct({ text: Schema.String }),
    output: Schema.Struct({ words: Schema.Number }),
    timeout: "10 seconds",
    handler,
  })

interface Line {
  readonly level: string
  readonly message: string
  readonly cause: Cause.Cause<unknown>
  readonly annotations: Record<string, unknown>
}

/** Every line with its Cause, as the app's Logger receives it; `refuseCauses` throws on one. */
const capture = (options: { readonly refuseCauses?: boolean } = {}) => {
  const lines: Array<Line> = []
  const layer = Logger.layer([
    Logger.make(({ cause, fiber, logLevel, message }) => {
      if (options.refuseCauses && cause.reasons.length > 0) throw new Error("cannot render it")
      lines.push({
        level: logLevel,
        message: (Array.isArray(message) ? message : [message]).map(String).join(" "),
        cause,
        annotations: fiber.getRef(References.CurrentLogAnnotations),
      })
    }),
  ])
  return { lines, layer }
}

const defectsOf = (cause: Cause.Cause<unknown>) =>
  cause.reasons.filter(Cause.isDieReason).map((reason) => reason.defect)
const failuresOf = (cause: Cause.Cause<unknown>) =>
  cause.reasons.filter(Cause.isFailReason).map((reason) => reason.error)

const SECRET = "connection to db://admin:hunter2@db failed"
describe("deliver: an unexpected handler failure", () => {
  it.effect("is logged as an ERROR line carrying the handler's whole Cause; the platform gets the fixed sentence", () => {
    const { lines, layer } = capture()
    return Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(define(() => Effect.die(new Error(SECRET))), {
        logLevel: "error",
      })
      const run = yield* harness.submit({ text: "x" }, { taskId: "t-die" })
      run.assertFailed({ code: "INTERNAL_ERROR" })
      expect(run.error!.message).toBe(INTERNAL_MESSAGE)
      for (const raw of run.raw) expect(textOf(raw)).not.toContain("hunter2")
      const errors = lines.filter((l) => l.level === "Error")
      expect(errors).toHaveLength(1)
      const [line] = errors
      expect(line!.message).toBe("The handler failed with an unexpected Error")
      expect(line!.annotations).toMatchObject({ task_id: "t-die", error: "Error" })
      const defects = defectsOf(line!.cause)
      expect(defects).toHaveLength(1)
      expect((defects[0] as Error).message).toBe(SECRET)
      expect(Cause.pretty(line!.cause)).toContain(SECRET)
      expect((defects[0] as Error).stack).toContain("deliver.test.ts")
    }).pipe(Effect.provide(layer))
  })

  it.effect("a failure with a plain value: its Cause is that failure", () => {
    const { lines, layer } = capture()
    return Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(define(() => Effect.fail(SECRET)), {
        logLevel: "error",
      })
      ;(yield* harness.submit({ text: "x" })).assertFailed({ code: "INTERNAL_ERROR" })
      const line = lines.find((l) => l.level === "Error")!
      expect(line.message).toBe("The handler failed with an unexpected string")
      expect(failuresOf(line.cause)).toEqual([SECRET])
    }).pipe(Effect.provide(layer))
  })

  it.effect("a Logger that cannot render the Cause gets the line without it, and the task still concludes", () => {
    const { lines, layer } = capture({ refuseCauses: true })
    return Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(
        define(async () => {
          await Promise.resolve()
          throw new Error(SECRET)
        }),
        { logLevel: "error" },
      )
      ;(yield* harness.submit({ text: "x" }, { taskId: "t-thrown" })).assertFailed({
        code: "INTERNAL_ERROR",
      })
      const errors = lines.filter((l) => l.level === "Error")
      expect(errors.map((l) => l.message)).toEqual(["The handler failed with an unexpected Error"])
      expect(errors[0]!.cause.reasons).toEqual([])
      expect(errors[0]!.annotations).toMatchObject({ task_id: "t-thrown", error: "Error" })
    }).pipe(Effect.provide(layer))
  })
})
