import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option } from "effect"
import { Inbox } from "../../src/internal/inbox.ts"

const settle = Effect.repeatN(Effect.yieldNow(), 20)

/** A take forked and left to reach its wait. */
const waitingTake = <A, E>(inbox: Inbox<A, E>) => Effect.tap(Effect.fork(inbox.take), () => settle)

describe("Inbox", () => {
  it.effect("gives kept items in order, then makes a take wait for the next offer", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      inbox.offer("a")
      inbox.offer("b")
      expect(yield* inbox.take).toEqual(Option.some("a"))
      expect(yield* inbox.take).toEqual(Option.some("b"))
      const waiting = yield* waitingTake(inbox)
      expect(waiting.unsafePoll()).toBeNull()
      expect(inbox.offer("c")).toBe(true)
      expect(yield* Fiber.join(waiting)).toEqual(Option.some("c"))
    }))

  it.effect("hands an offer to the taker waiting longest", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      const first = yield* waitingTake(inbox)
      const second = yield* waitingTake(inbox)
      inbox.offer("a")
      inbox.offer("b")
      expect(yield* Fiber.join(first)).toEqual(Option.some("a"))
      expect(yield* Fiber.join(second)).toEqual(Option.some("b"))
    }))

  it.effect("an interrupted taker takes nothing: the next offer goes to the next take", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      const gone = yield* waitingTake(inbox)
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
      const waiting = yield* waitingTake(inbox)
      expect(waiting.unsafePoll()).toBeNull()
      yield* Fiber.interrupt(waiting)
    }))

  it.effect("closed, waiting and later takes end with None, and offers are refused", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, never>()
      const waiting = yield* waitingTake(inbox)
      inbox.close()
      expect(yield* Fiber.join(waiting)).toEqual(Option.none())
      expect(inbox.offer("a")).toBe(false)
      expect(yield* inbox.take).toEqual(Option.none())
      expect(inbox.isClosed).toBe(true)
    }))

  it.effect("closed with an error, waiting and later takes fail with it", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<string, string>()
      const waiting = yield* waitingTake(inbox)
      inbox.offer("kept")
      inbox.close("refused")
      expect(yield* Fiber.join(waiting)).toEqual(Option.some("kept"))
      const later = yield* Effect.exit(inbox.take)
      expect(later).toEqual(Exit.fail("refused"))
    }))
})
