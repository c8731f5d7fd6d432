import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { Current } from "../../../src/internal/amqp/current.ts"
import { settle } from "../../support/logs.ts"

/** Lets forked fibers reach their wait. */

describe("Current", () => {
  it.effect("holds nothing at first; get waits for the value set, then answers at once", () =>
    Effect.gen(function* () {
      const current = new Current<string>()
      expect(current.now).toBeUndefined()
      const waiting = yield* Effect.forkChild(current.get)
      yield* settle()
      expect(waiting.pollUnsafe()).toBeUndefined()
      current.set("first")
      expect(yield* Fiber.join(waiting)).toBe("first")
      expect(current.now).toBe("first")
      expect(yield* current.get).toBe("first")
    }))

  it.effect("once cleared, get waits for the next value", () =>
    Effect.gen(function* () {
      const current = new Current<string>()
      current.set("first")
      current.clear()
      expect(current.now).toBeUndefined()
      const waiting = yield* Effect.forkChild(current.get)
      yield* settle()
      current.set("second")
      expect(yield* Fiber.join(waiting)).toBe("second")
    }))

  it.effect("an interrupted wait is forgotten", () =>
    Effect.gen(function* () {
      const current = new Current<string>()
      const waiting = yield* Effect.forkChild(current.get)
      yield* settle()
      const waiters = () => (current as unknown as { waiting: Set<unknown> }).waiting.size
      expect(waiters()).toBe(1)
      yield* Fiber.interrupt(waiting)
      // Forgotten by the interruption itself, before any session comes.
      expect(waiters()).toBe(0)
      current.set("first")
    }))
})
