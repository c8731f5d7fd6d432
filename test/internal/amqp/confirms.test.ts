import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import * as Confirms from "../../../src/internal/amqp/confirms.ts"
import { PublishError } from "../../../src/WorkerError.ts"
import { blockedLoop } from "../../support/blockedLoop.ts"
import { eventually, FakeChannel } from "./fakes.ts"

const body = new TextEncoder().encode(`{"task_id":"t-1"}`)

/** Publishing on a fake confirm channel, its returns tracked, with the confirms `made`. */
const publishingWith = (made: typeof tenSeconds) =>
  Effect.gen(function* () {
    const confirms = yield* made
    const channel = new FakeChannel("publisher")
    const overdue: Array<number> = []
    const on = {
      publisher: channel,
      returned: confirms.track(channel),
      overdue: () => void overdue.push(overdue.length),
    }
    /** A publish forked and left waiting for its confirm. */
    const publish = Effect.gen(function* () {
      const before = channel.published.length
      const fiber = yield* Effect.forkChild(confirms.publish(on, body, "success"))
      yield* eventually(() => channel.published.length > before)
      return { fiber, sent: channel.published[before]! }
    })
    return { channel, publish, confirms, on, overdue }
  })

const tenSeconds = Confirms.make({ outQueue: "out", confirmTimeout: Duration.seconds(10) })
const publishing = publishingWith(tenSeconds)

describe("Confirms", () => {
  it.effect("a publish the broker confirms succeeds: persistent JSON to the output queue, mandatory, with its type", () =>
    Effect.gen(function* () {
      const { publish } = yield* publishing
      const { fiber, sent } = yield* publish
      expect(sent.exchange).toBe("")
      expect(sent.routingKey).toBe("out")
      expect(new TextDecoder().decode(sent.content)).toBe(`{"task_id":"t-1"}`)
      expect(sent.options).toEqual({
        persistent: true,
        contentType: "application/json",
        type: "success",
        mandatory: true,
        messageId: "1",
      })
      expect(fiber.pollUnsafe()).toBeUndefined()
      sent.confirm(null)
      yield* Fiber.join(fiber)
    }))

  it.effect("a message sent ahead is on the channel at once; its confirm, awaited before or after it comes, by any number of waiters", () =>
    Effect.gen(function* () {
      const { channel, confirms, on } = yield* publishing
      const early = yield* confirms.send(on, body, "started", undefined, "t-1:1:d:started")
      expect(channel.published).toHaveLength(1)
      expect(channel.published[0]!.options?.messageId).toBe("t-1:1:d:started")
      const waiting = yield* Effect.forkChild(early)
      yield* eventually(() => true)
      expect(waiting.pollUnsafe()).toBeUndefined()
      channel.published[0]!.confirm(null)
      yield* Fiber.join(waiting)
      yield* early
      const refused = yield* confirms.send(on, body, "started")
      channel.published[1]!.confirm(new Error("message nacked"))
      const error = yield* Effect.flip(refused)
      expect(error).toEqual(new PublishError({ reason: "nacked", messageType: "started" }))
      expect(yield* Effect.flip(refused)).toEqual(error)
    }))

  it.effect("a publish the broker nacks fails as nacked", () =>
    Effect.gen(function* () {
      const { publish } = yield* publishing
      const { fiber, sent } = yield* publish
      sent.confirm(new Error("message nacked"))
      expect(yield* Effect.flip(Fiber.join(fiber))).toEqual(
        new PublishError({ reason: "nacked", messageType: "success" }),
      )
    }))

  it.effect("a confirm failed by the channel's close fails as closed", () =>
    Effect.gen(function* () {
      const { publish } = yield* publishing
      const { fiber, sent } = yield* publish
      sent.confirm(new Error("channel closed"))
      expect((yield* Effect.flip(Fiber.join(fiber))).reason).toBe("closed")
    }))

  it.effect("a publish on a channel that throws fails as closed", () =>
    Effect.gen(function* () {
      const { channel, confirms, on } = yield* publishing
      channel.publishThrows = new Error("Channel closed")
      const error = yield* Effect.flip(confirms.publish(on, body, "started"))
      expect(error).toEqual(new PublishError({ reason: "closed", messageType: "started" }))
    }))

  it.effect("a publish the broker returns fails as returned, and the next is confirmed", () =>
    Effect.gen(function* () {
      const { channel, publish } = yield* publishing
      const first = yield* publish
      channel.emit("return", { properties: { messageId: first.sent.options!.messageId } })
      first.sent.confirm(null)
      expect((yield* Effect.flip(Fiber.join(first.fiber))).reason).toBe("returned")
      const second = yield* publish
      second.sent.confirm(null)
      yield* Fiber.join(second.fiber)
    }))

  it.effect("a publish never confirmed fails as timeout once the confirm timeout has passed, and its late confirm is ignored", () =>
    Effect.gen(function* () {
      const { publish, overdue } = yield* publishing
      const { fiber, sent } = yield* publish
      yield* TestClock.adjust("9750 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      expect(overdue).toEqual([])
      yield* TestClock.adjust("250 millis")
      expect((yield* Effect.flip(Fiber.join(fiber))).reason).toBe("timeout")
      // Its session was told first: the connection is given up, not published on again.
      expect(overdue).toEqual([0])
      sent.confirm(null)
    }))

  it.effect("time the event loop was blocked does not count against a confirm: its deadline moves by the block", () =>
    Effect.gen(function* () {
      const loop = yield* blockedLoop
      const { publish, overdue } = yield* publishingWith(loop.watched(tenSeconds))
      const { fiber, sent } = yield* publish
      yield* TestClock.adjust("5 seconds")
      // 45 s without a sweep: the confirm sent meanwhile is still unread in the socket when the
      // first sweep after the block runs.
      yield* loop.block(45_000)
      yield* TestClock.adjust("250 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      expect(overdue).toEqual([])
      sent.confirm(null)
      yield* Fiber.join(fiber)
    }))

  it.effect("after a block, a confirm that never comes still fails once the rest of its timeout has passed", () =>
    Effect.gen(function* () {
      const loop = yield* blockedLoop
      const { publish, overdue } = yield* publishingWith(loop.watched(tenSeconds))
      const { fiber } = yield* publish
      yield* TestClock.adjust("5 seconds")
      yield* loop.block(45_000)
      yield* TestClock.adjust("4750 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("250 millis")
      expect((yield* Effect.flip(Fiber.join(fiber))).reason).toBe("timeout")
      expect(overdue).toEqual([0])
    }))
})
