import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { CLOSE_STEP_TIMEOUT, closeStep } from "../../../src/internal/amqp/closing.ts"

/** A broker that never answers. */
const unanswered = Effect.promise(() => new Promise<void>(() => {}))

describe("closeStep", () => {
  it.effect("a step the broker never answers ends at CLOSE_STEP_TIMEOUT, even in a finalizer's uninterruptible region", () =>
    Effect.gen(function* () {
      const closing = yield* Effect.forkChild(Effect.uninterruptible(closeStep(unanswered)))
      yield* TestClock.adjust(Duration.subtract(CLOSE_STEP_TIMEOUT, Duration.millis(1)))
      expect(closing.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(closing)
    }))

  it.effect("a step's failure is ignored", () =>
    Effect.gen(function* () {
      const exit = yield* Effect.exit(closeStep(Effect.fail(new Error("channel closed"))))
      expect(Exit.isSuccess(exit)).toBe(true)
    }))
})
