import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { Slots } from "../../../src/internal/concurrency/slots.ts"
import { settle } from "../../support/logs.ts"

describe("Slots", () => {
  it.effect("takes free slots at once, and a wait ends when one is released", () =>
    Effect.gen(function* () {
      const slots = new Slots(2)
      expect(slots.tryTake()).toBe(true)
      expect(slots.tryTake()).toBe(true)
      expect(slots.tryTake()).toBe(false)
      const waiting = yield* Effect.forkChild(slots.awaitFree())
      yield* settle()
      expect(waiting.pollUnsafe()).toBeUndefined()
      slots.release()
      yield* Fiber.join(waiting)
      expect(slots.tryTake()).toBe(true)
      expect(slots.free).toBe(0)
    }))

  it.effect("a release between a failed take and the wait is not missed", () =>
    Effect.gen(function* () {
      const slots = new Slots(1)
      expect(slots.tryTake()).toBe(true)
      expect(slots.tryTake()).toBe(false)
      slots.release()
      const waiting = yield* Effect.forkChild(slots.awaitFree())
      yield* settle()
      expect(waiting.pollUnsafe()).not.toBeUndefined()
    }))

  it.effect("a weighted wait ends only when its whole weight is free", () =>
    Effect.gen(function* () {
      const slots = new Slots(3)
      expect(slots.tryTake(2)).toBe(true)
      expect(slots.tryTake()).toBe(true)
      const waiting = yield* Effect.forkChild(slots.awaitFree(2))
      slots.release()
      yield* settle()
      expect(waiting.pollUnsafe()).toBeUndefined()
      slots.release(2)
      yield* Fiber.join(waiting)
      expect(slots.tryTake(3)).toBe(true)
    }))

  it.effect("a shrink keeps the slots taken and frees none until enough are released", () =>
    Effect.gen(function* () {
      const slots = new Slots(3)
      for (let i = 0; i < 3; i++) expect(slots.tryTake()).toBe(true)
      slots.resize(1)
      expect(slots.free).toBe(-2)
      const waiting = yield* Effect.forkChild(slots.awaitFree())
      slots.release()
      slots.release()
      yield* settle()
      expect(waiting.pollUnsafe()).toBeUndefined()
      slots.release()
      yield* Fiber.join(waiting)
      expect(slots.free).toBe(1)
    }))

  it.effect("a growth wakes the waits", () =>
    Effect.gen(function* () {
      const slots = new Slots(0)
      const first = yield* Effect.forkChild(slots.awaitFree())
      const second = yield* Effect.forkChild(slots.awaitFree())
      yield* settle()
      expect([first.pollUnsafe(), second.pollUnsafe()]).toEqual([undefined, undefined])
      slots.resize(2)
      yield* settle()
      // Both woken by the growth alone: nothing was released.
      expect([first.pollUnsafe(), second.pollUnsafe()].map((exit) => exit?._tag)).toEqual([
        "Success",
        "Success",
      ])
    }))

  it.effect("every fitting wait is woken: one interrupted as it wakes leaves the slot to another", () =>
    Effect.gen(function* () {
      const slots = new Slots(1)
      expect(slots.tryTake()).toBe(true)
      const gone = yield* Effect.forkChild(slots.awaitFree())
      const next = yield* Effect.forkChild(slots.awaitFree())
      yield* settle()
      slots.release()
      gone.interruptUnsafe(gone.id)
      yield* Fiber.await(gone)
      yield* Fiber.join(next)
      expect(slots.tryTake()).toBe(true)
    }))
})
