import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option } from "effect"
import { Inbox } from "../../../src/internal/transport/inbox.ts"
import { settle } from "../../support/logs.ts"

/** A take forked and left to reach its wait. */
const waitingTake = <A, E>(take: Effect.Effect<A, E>) =>
  Effect.tap(Effect.forkChild(take), () => settle())

describe("Inbox", () => {
  it.effect("gives kept items in order, then makes a take wait for the next offer", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      inbox.offer("a")
      inbox.offer("b")
      expect(yield* inbox.take).toEqual(Option.some("a"))
      expect(yield* inbox.take).toEqual(Option.some("b"))
      const waiting = yield* waitingTake(inbox.take)
      expect(waiting.pollUnsafe()).toBeUndefined()
      expect(inbox.offer("c")).toBe(true)
      expect(yield* Fiber.join(waiting)).toEqual(Option.some("c"))
    }))

  it.effect("hands an offer to the taker waiting longest", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      const first = yield* waitingTake(inbox.take)
      const second = yield* waitingTake(inbox.take)
      inbox.offer("a")
      inbox.offer("b")
      expect(yield* Fiber.join(first)).toEqual(Option.some("a"))
      expect(yield* Fiber.join(second)).toEqual(Option.some("b"))
    }))

  it.effect("an interrupted taker takes nothing: the next offer goes to the next take", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      const gone = yield* waitingTake(inbox.take)
      yield* Fiber.interrupt(gone)
      inbox.offer("a")
      expect(yield* inbox.take).toEqual(Option.some("a"))
    }))

  it.effect("takeAll removes what was not taken", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      inbox.offer("a")
      inbox.offer("b")
      expect(yield* inbox.take).toEqual(Option.some("a"))
      inbox.offer("c")
      expect(inbox.takeAll()).toEqual(["b", "c"])
      const waiting = yield* waitingTake(inbox.take)
      expect(waiting.pollUnsafe()).toBeUndefined()
      yield* Fiber.interrupt(waiting)
    }))

  it.effect("closed, waiting and later takes end with None, and offers are refused", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      const waiting = yield* waitingTake(inbox.take)
      inbox.close()
      expect(yield* Fiber.join(waiting)).toEqual(Option.none())
      expect(inbox.offer("a")).toBe(false)
      expect(yield* inbox.take).toEqual(Option.none())
      expect(inbox.isClosed).toBe(true)
    }))

  it.effect("closed with an error, waiting and later takes fail with it", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, string>()
      const waiting = yield* waitingTake(inbox.take)
      inbox.offer("kept")
      inbox.close("refused")
      expect(yield* Fiber.join(waiting)).toEqual(Option.some("kept"))
      const later = yield* Effect.exit(inbox.take)
      expect(later).toEqual(Exit.fail("refused"))
    }))

  it.effect("takeMap makes each item as it is taken, kept or waited for, and ends as take does", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<number, string>()
      const doubled = inbox.takeMap((n) => n * 2)
      inbox.offer(1)
      expect(yield* doubled).toEqual(Option.some(2))
      const waiting = yield* waitingTake(doubled)
      inbox.offer(2)
      expect(yield* Fiber.join(waiting)).toEqual(Option.some(4))
      const last = yield* waitingTake(doubled)
      inbox.close("gone")
      expect(yield* Effect.exit(Fiber.join(last))).toEqual(Exit.fail("gone"))
      expect(yield* Effect.exit(doubled)).toEqual(Exit.fail("gone"))
    }))
})
