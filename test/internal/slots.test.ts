import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { Slots } from "../../src/internal/slots.ts"

const settle = Effect.repeatN(Effect.yieldNow(), 20)

describe("Slots", () => {
  it.effect("takes free slots at once, then makes a take wait for a release", () =>
    Effect.gen(function* () {
      const slots = new Slots(2)
      yield* slots.take
      expect(slots.tryTake()).toBe(true)
      expect(slots.tryTake()).toBe(false)
      const waiting = yield* Effect.fork(slots.take)
      yield* settle
      expect(waiting.unsafePoll()).toBeNull()
      slots.release()
      yield* Fiber.join(waiting)
      expect(slots.free).toBe(0)
    }))

  it.effect("a shrink keeps the slots taken and starts no take until enough are released", () =>
    Effect.gen(function* () {
      const slots = new Slots(3)
      for (let i = 0; i < 3; i++) expect(slots.tryTake()).toBe(true)
      slots.resize(1)
      expect(slots.free).toBe(-2)
      const waiting = yield* Effect.fork(slots.take)
      slots.release()
      slots.release()
      yield* settle
      expect(waiting.unsafePoll()).toBeNull()
      slots.release()
      yield* Fiber.join(waiting)
      expect(slots.free).toBe(0)
    }))

  it.effect("a growth wakes the waiting takes", () =>
    Effect.gen(function* () {
      const slots = new Slots(0)
      const first = yield* Effect.fork(slots.take)
      const second = yield* Effect.fork(slots.take)
      yield* settle
      slots.resize(2)
      yield* Fiber.join(first)
      yield* Fiber.join(second)
      expect(slots.free).toBe(0)
    }))

  it.effect("a waiter interrupted as it is woken holds no slot: the other waiter takes it", () =>
    Effect.gen(function* () {
      const slots = new Slots(1)
      expect(slots.tryTake()).toBe(true)
      const gone = yield* Effect.fork(slots.take)
      const next = yield* Effect.fork(slots.take)
      yield* settle
      slots.release()
      gone.unsafeInterruptAsFork(gone.id())
      yield* Fiber.await(gone)
      yield* Fiber.join(next)
      expect(slots.free).toBe(0)
      slots.release()
      expect(slots.free).toBe(1)
    }))
})
