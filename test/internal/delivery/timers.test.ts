import { describe, expect, it } from "@effect/vitest"
import { type Duration, Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Timers from "../../../src/internal/delivery/timers.ts"
import { settle } from "../../support/logs.ts"

/** Moves the clock, then lets the timers' fiber run. */
const advance = (duration: Duration.Input) => Effect.andThen(TestClock.adjust(duration), settle())

describe("Timers", () => {
  it.effect("runs an action when its delay has passed, not before", () =>
    Effect.gen(function* () {
      const timers = yield* Timers.make
      const fired: Array<string> = []
      timers.after(1000, Effect.sync(() => fired.push("a")))
      yield* settle()
      yield* advance("999 millis")
      expect(fired).toEqual([])
      yield* advance("1 millis")
      expect(fired).toEqual(["a"])
    }))

  it.effect("a cancelled timer never runs", () =>
    Effect.gen(function* () {
      const timers = yield* Timers.make
      const fired: Array<string> = []
      const timer = timers.after(1000, Effect.sync(() => fired.push("a")))
      timers.after(1000, Effect.sync(() => fired.push("b")))
      timer.cancel()
      yield* advance("2 seconds")
      expect(fired).toEqual(["b"])
    }))

  it.effect("timers of different delays fire in due order, a shorter one registered later first", () =>
    Effect.gen(function* () {
      const timers = yield* Timers.make
      const fired: Array<string> = []
      timers.after(30_000, Effect.sync(() => fired.push("30s")))
      yield* settle()
      timers.after(5_000, Effect.sync(() => fired.push("5s")))
      yield* TestClock.adjust("1 second")
      timers.after(1_000, Effect.sync(() => fired.push("1s+1s")))
      yield* settle()
      yield* advance("1 second")
      expect(fired).toEqual(["1s+1s"])
      yield* advance("3 seconds")
      expect(fired).toEqual(["1s+1s", "5s"])
      yield* advance("25 seconds")
      expect(fired).toEqual(["1s+1s", "5s", "30s"])
    }))

  it.effect("goes idle when empty and wakes for the next timer", () =>
    Effect.gen(function* () {
      const timers = yield* Timers.make
      const fired: Array<number> = []
      timers.after(10, Effect.sync(() => fired.push(1)))
      yield* advance("1 minute")
      timers.after(10, Effect.sync(() => fired.push(2)))
      yield* settle()
      yield* advance("10 millis")
      expect(fired).toEqual([1, 2])
    }))

  it.effect("a timer cancelled before the fiber ran makes the next one neither late nor early", () =>
    Effect.gen(function* () {
      const timers = yield* Timers.make
      const fired: Array<string> = []
      // A short task: its time limit is cancelled before the timers' fiber runs.
      timers.after(1000, Effect.sync(() => fired.push("cancelled"))).cancel()
      timers.after(1500, Effect.sync(() => fired.push("later")))
      timers.after(500, Effect.sync(() => fired.push("sooner")))
      yield* settle()
      yield* advance("499 millis")
      expect(fired).toEqual([])
      yield* advance("1 millis")
      expect(fired).toEqual(["sooner"])
      yield* advance("999 millis")
      expect(fired).toEqual(["sooner"])
      yield* advance("1 millis")
      expect(fired).toEqual(["sooner", "later"])
    }))

  it.effect("lanes emptied and dropped or kept, for many delays, still fire in due order", () =>
    Effect.gen(function* () {
      const timers = yield* Timers.make
      const fired: Array<number> = []
      for (let delay = 1_000; delay <= 20_000; delay += 1_000) {
        timers.after(delay, Effect.sync(() => fired.push(-delay))).cancel()
      }
      for (const delay of [20_000, 3_000, 11_000, 1_000]) {
        timers.after(delay, Effect.sync(() => fired.push(delay)))
      }
      yield* settle()
      yield* advance("10 seconds")
      expect(fired).toEqual([1_000, 3_000])
      yield* advance("10 seconds")
      expect(fired).toEqual([1_000, 3_000, 11_000, 20_000])
    }))

  it.effect("calls a function action on its own fiber; one that throws stops no other timer", () =>
    Effect.gen(function* () {
      const timers = yield* Timers.make
      const fired: Array<string> = []
      timers.after(100, () => {
        throw new Error("a broken callback")
      })
      timers.after(100, () => void fired.push("same due"))
      timers.after(200, () => void fired.push("later"))
      timers.after(300, Effect.sync(() => fired.push("an effect")))
      yield* settle()
      yield* advance("100 millis")
      expect(fired).toEqual(["same due"])
      yield* advance("200 millis")
      expect(fired).toEqual(["same due", "later", "an effect"])
    }))
})
