import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, type Duration, Effect, Fiber, Metric } from "effect"
import { TestClock } from "effect/testing"
import vectors from "../../shared/protocol/vectors.json" with { type: "json" }
import * as ProgressThrottle from "../src/ProgressThrottle.ts"
import type { Transport } from "../src/Transport.ts"
import { PublishError } from "../src/WorkerError.ts"
import * as WorkerMetrics from "../src/WorkerMetrics.ts"
import { textOf } from "./support/builders.ts"
import { settle, withLogs } from "./support/logs.ts"

interface Sent {
  /** TestClock time of the publish, in milliseconds. */
  readonly at: number
  readonly type: string
  readonly messageId: string | undefined
  readonly text: string
  readonly message: {
    readonly task_id: string
    readonly data: { readonly progress: number; readonly response?: unknown }
  }
}

/** A fake publish: records what the broker would have confirmed, or fails when told to. */
const makePublisher = () => {
  const sent: Array<Sent> = []
  let attempts = 0
  let failures = 0
  const publish: Transport["Service"]["publish"] = (body, type, options) =>
    Effect.gen(function* () {
      attempts++
      if (failures > 0) {
        failures--
        return yield* new PublishError({ reason: "nacked", messageType: type })
      }
      const at = yield* Clock.currentTimeMillis
      const text = textOf(body)
      sent.push({ at, type, messageId: options?.messageId, text, message: JSON.parse(text) })
    })
  return {
    sent,
    publish,
    attempts: () => attempts,
    failNext: () => void failures++,
    /** `[time, fraction]` of each message sent. */
    timeline: () => sent.map((s) => [s.at, s.message.data.progress]),
  }
}

type DropReason =
  | "invalid"
  | "regressed"
  | "superseded"
  | "concluded"
  | "publish_failed"
  | "too_large"

const dropped = (reason: DropReason) =>
  Metric.value(WorkerMetrics.progressDropped(reason)).pipe(Effect.map((state) => state.count))

/** The change of `worker_progress_dropped_total{reason}` since it was made. */
const droppedSince = (reason: DropReason) =>
  Effect.map(dropped(reason), (before) => Effect.map(dropped(reason), (after) => after - before))

const setup = (interval: Duration.Input = "1 second") => {
  const publisher = makePublisher()
  return { publisher, throttle: ProgressThrottle.make(interval, publisher.publish) }
}

describe("ProgressThrottle", () => {
  it.effect("sends the first update at once", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const progress = yield* throttle.open("t-1")
      yield* TestClock.adjust("250 millis")
      yield* progress.report(0.25)
      yield* settle()
      expect(publisher.sent).toEqual([{
        at: 250,
        type: "progress",
        messageId: expect.stringMatching(/^t-1:1:[0-9a-z]{8}:progress:1$/),
        text: `{"task_id":"t-1","data":{"message_type":"progress","progress":0.25}}`,
        message: { task_id: "t-1", data: { message_type: "progress", progress: 0.25 } },
      }])
    }))

  it.effect("with `after`: holds the latest update until it succeeds, then sends it; drops and counts every update once it failed", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const confirmed = yield* Deferred.make<void>()
      const waiting = yield* throttle.open("t-after", { after: Deferred.await(confirmed) })
      yield* waiting.report(0.25)
      yield* waiting.report(0.5)
      yield* TestClock.adjust("5 seconds")
      expect(publisher.sent).toEqual([])
      yield* Deferred.succeed(confirmed, undefined)
      yield* settle()
      expect(publisher.sent.map((m) => m.message.data.progress)).toEqual([0.5])

      const failed = yield* droppedSince("publish_failed")
      const refused = yield* Deferred.make<void, PublishError>()
      const dropping = yield* throttle.open("t-refused", { after: Deferred.await(refused) })
      yield* dropping.report(0.25)
      yield* Deferred.fail(refused, new PublishError({ reason: "nacked", messageType: "started" }))
      yield* settle()
      yield* dropping.report(0.5)
      yield* dropping.report(0.75)
      yield* dropping.close
      expect(publisher.sent.map((m) => m.message.task_id)).toEqual(["t-after"])
      expect(yield* failed).toBe(3)
    }))

  it.effect("holds updates within the interval and sends only the latest when it ends", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const superseded = yield* droppedSince("superseded")
      const progress = yield* throttle.open("t-1")
      yield* progress.report(0.1)
      yield* settle()
      yield* TestClock.adjust("200 millis")
      yield* progress.report(0.2)
      yield* TestClock.adjust("300 millis")
      yield* progress.report(0.3)
      yield* TestClock.adjust("499 millis")
      expect(publisher.timeline()).toEqual([[0, 0.1]])
      yield* TestClock.adjust("1 millis")
      expect(publisher.timeline()).toEqual([[0, 0.1], [1000, 0.3]])
      expect(yield* superseded).toBe(1)

      // The next interval starts at the last send: an update at 1.2 s goes out at 2 s.
      yield* TestClock.adjust("200 millis")
      yield* progress.report(0.4)
      yield* TestClock.adjust("799 millis")
      expect(publisher.timeline()).toEqual([[0, 0.1], [1000, 0.3]])
      yield* TestClock.adjust("1 millis")
      expect(publisher.timeline()).toEqual([[0, 0.1], [1000, 0.3], [2000, 0.4]])

      // Nothing is held: time passing sends nothing more.
      yield* TestClock.adjust("10 seconds")
      expect(publisher.sent).toHaveLength(3)
    }))

  it.effect("sends an update at once after a quiet interval", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup("2 seconds")
      const progress = yield* throttle.open("t-1")
      yield* progress.report(0.1)
      yield* settle()
      yield* TestClock.adjust("2500 millis")
      yield* progress.report(0.2)
      yield* settle()
      expect(publisher.timeline()).toEqual([[0, 0.1], [2500, 0.2]])
    }))

  it.effect("drops a lower fraction and accepts an equal one", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const regressed = yield* droppedSince("regressed")
      const progress = yield* throttle.open("t-1")
      yield* progress.report(0.5)
      yield* settle()
      yield* TestClock.adjust("100 millis")
      yield* progress.report(0.6)
      yield* TestClock.adjust("100 millis")
      yield* progress.report(0.4)
      expect(yield* regressed).toBe(1)
      yield* TestClock.adjust("100 millis")
      yield* progress.report(0.6, { stage: "ocr" })
      yield* TestClock.adjust("700 millis")
      expect(publisher.sent.map((s) => [s.at, s.message.data])).toEqual([
        [0, { message_type: "progress", progress: 0.5 }],
        [1000, { message_type: "progress", progress: 0.6, response: { stage: "ocr" } }],
      ])

      // Lower than what was sent: still dropped, never sent.
      yield* progress.report(0.55)
      yield* TestClock.adjust("5 seconds")
      expect(publisher.sent).toHaveLength(2)
      expect(yield* regressed).toBe(2)
    }))

  it.effect("drops a fraction that is not finite or not in [0, 1)", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const invalid = yield* droppedSince("invalid")
      const progress = yield* throttle.open("t-1")
      for (const fraction of [NaN, Infinity, -Infinity, -0.1, 1, 1.5]) {
        yield* progress.report(fraction)
      }
      yield* settle()
      yield* TestClock.adjust("5 seconds")
      expect(publisher.attempts()).toBe(0)
      expect(yield* invalid).toBe(6)

      // None of them counted as the highest: 0, the lower bound, still goes out.
      yield* progress.report(0)
      yield* settle()
      expect(publisher.timeline()).toEqual([[5000, 0]])
      expect(publisher.sent[0]!.text).toBe(
        `{"task_id":"t-1","data":{"message_type":"progress","progress":0}}`,
      )
    }))

  it.effect("drops an update whose payload is not a JSON object", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const invalid = yield* droppedSince("invalid")
      const progress = yield* throttle.open("t-1")
      const payloads: ReadonlyArray<unknown> = ["ocr", 42, null, [1, 2], { ratio: NaN }]
      for (const payload of payloads) {
        yield* progress.report(0.9, payload as Record<string, unknown>)
      }
      yield* settle()
      yield* TestClock.adjust("5 seconds")
      expect(publisher.attempts()).toBe(0)
      expect(yield* invalid).toBe(payloads.length)

      // A dropped update does not raise the fraction: 0.5 is not a regression.
      yield* progress.report(0.5, { stage: "ocr" })
      yield* settle()
      expect(publisher.sent.map((s) => s.message.data)).toEqual([
        { message_type: "progress", progress: 0.5, response: { stage: "ocr" } },
      ])
    }))

  it.effect("close drops the held update: nothing is sent after it", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const concluded = yield* droppedSince("concluded")
      const progress = yield* throttle.open("t-1")
      yield* progress.report(0.1)
      yield* settle()
      yield* TestClock.adjust("100 millis")
      yield* progress.report(0.2)
      yield* TestClock.adjust("100 millis")
      yield* progress.close
      expect(yield* concluded).toBe(1)
      yield* TestClock.adjust("10 seconds")
      expect(publisher.timeline()).toEqual([[0, 0.1]])

      // A report after the conclusion is dropped too.
      yield* progress.report(0.3)
      yield* settle()
      yield* TestClock.adjust("10 seconds")
      expect(publisher.timeline()).toEqual([[0, 0.1]])
      expect(yield* concluded).toBe(2)
    }))

  it.effect("close sends an update that was due at once, even if the sender has not run yet", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const progress = yield* throttle.open("t-1")
      // A handler that reports and returns at once: the conclusion comes before the sender runs.
      yield* progress.report(0.5)
      yield* progress.close
      expect(publisher.timeline()).toEqual([[0, 0.5]])
    }))

  it.effect("close waits out a publish under way", () =>
    Effect.gen(function* () {
      const sent: Array<number> = []
      const slowPublish: Transport["Service"]["publish"] = () =>
        Effect.sleep("100 millis").pipe(
          Effect.andThen(Clock.currentTimeMillis),
          Effect.map((at) => void sent.push(at)),
        )
      const throttle = ProgressThrottle.make("1 second", slowPublish)
      const progress = yield* throttle.open("t-1")
      yield* progress.report(0.1)
      yield* settle()
      yield* TestClock.adjust("50 millis")
      yield* progress.report(0.2)
      const closing = yield* Effect.forkChild(progress.close)
      yield* TestClock.adjust("49 millis")
      expect(closing.pollUnsafe() === undefined).toBe(true)
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(closing)
      expect(sent).toEqual([100])
      // The update held meanwhile was dropped by close.
      yield* TestClock.adjust("5 seconds")
      expect(sent).toEqual([100])
    }))

  it.effect("closing the channel's scope drops the held update", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      yield* Effect.scoped(Effect.gen(function* () {
        const progress = yield* throttle.open("t-1")
        yield* progress.report(0.1)
        yield* settle()
        yield* TestClock.adjust("100 millis")
        yield* progress.report(0.2)
      }))
      yield* TestClock.adjust("10 seconds")
      expect(publisher.timeline()).toEqual([[0, 0.1]])
    }))

  it.effect("a failed publish does not fail report, and later updates still go out", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const failed = yield* droppedSince("publish_failed")
      const progress = yield* throttle.open("t-1")
      publisher.failNext()
      const first = yield* Effect.exit(progress.report(0.1))
      yield* settle()
      expect(first._tag).toBe("Success")
      expect(publisher.attempts()).toBe(1)
      expect(publisher.sent).toEqual([])
      expect(yield* failed).toBe(1)

      yield* TestClock.adjust("100 millis")
      yield* progress.report(0.2)
      yield* TestClock.adjust("900 millis")
      expect(publisher.timeline()).toEqual([[1000, 0.2]])
      expect(yield* failed).toBe(1)
    }))

  it.effect("a message larger than the output takes is dropped with a warning and counted too_large, whether measured before it is published or refused by the broker; the task's later updates go out", () =>
    withLogs((logs) =>
      Effect.gen(function* () {
        const publisher = makePublisher()
        const refusing: Transport["Service"]["publish"] = (body, type, options) =>
          textOf(body).includes("refused")
            ? Effect.fail(new PublishError({ reason: "too_large", messageType: type }))
            : publisher.publish(body, type, options)
        // 200 bytes: a message of a 300-character payload is past it, one of a few bytes is not.
        const throttle = ProgressThrottle.make("1 second", refusing, 200)
        const tooLarge = yield* droppedSince("too_large")
        const failed = yield* droppedSince("publish_failed")
        const progress = yield* throttle.open("t-big")
        yield* progress.report(0.1, { text: "x".repeat(300) })
        yield* settle()
        // Measured before publishing: nothing sent.
        expect(publisher.attempts()).toBe(0)
        expect(yield* tooLarge).toBe(1)
        // Under the setting, refused by the broker for its size.
        yield* progress.report(0.2, { text: "refused" })
        yield* settle()
        expect(yield* tooLarge).toBe(2)
        expect(yield* failed).toBe(0)
        yield* TestClock.adjust("1 second")
        yield* progress.report(0.3)
        yield* TestClock.adjust("1 second")
        expect(publisher.timeline()).toEqual([[1000, 0.3]])
        expect(
          logs.lines.filter((l) =>
            l.level === "Warn" &&
            l.message === "A progress message larger than the output takes was dropped" &&
            l.annotations.task_id === "t-big"
          ),
        ).toHaveLength(2)
      })
    ))

  it.effect("numbers a channel's messages in their ids, under its delivery's id, else its own", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const given = yield* throttle.open("t-1", { attempt: 2, deliveryId: "k3x9a0b2" })
      yield* given.report(0.1)
      yield* TestClock.adjust("1 second")
      yield* given.report(0.2)
      yield* settle()
      const own = [yield* throttle.open("t-2"), yield* throttle.open("t-2")]
      for (const channel of own) yield* channel.report(0.1)
      yield* settle()
      const ids = publisher.sent.map((s) => s.messageId!)
      expect(ids.slice(0, 2)).toEqual(["t-1:2:k3x9a0b2:progress:1", "t-1:2:k3x9a0b2:progress:2"])
      // Two channels of one task, one delivery each: ids of their own.
      expect(ids[2]).toMatch(/^t-2:1:[0-9a-z]{8}:progress:1$/)
      expect(ids[3]).toMatch(/^t-2:1:[0-9a-z]{8}:progress:1$/)
      expect(ids[2]).not.toBe(ids[3])
    }))

  it.effect("each task has its own interval", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      const a = yield* throttle.open("a")
      const b = yield* throttle.open("b")
      yield* a.report(0.1)
      yield* settle()
      yield* b.report(0.2)
      yield* settle()
      yield* a.report(0.3)
      yield* settle()
      expect(publisher.sent.map((s) => [s.message.task_id, s.message.data.progress])).toEqual([
        ["a", 0.1],
        ["b", 0.2],
      ])
      yield* TestClock.adjust("1 second")
      expect(publisher.sent.map((s) => [s.message.task_id, s.message.data.progress])).toEqual([
        ["a", 0.1],
        ["b", 0.2],
        ["a", 0.3],
      ])
    }))

  describe("sends the spec's exact bytes", () => {
    for (const vector of vectors.encode) {
      const message = vector.message
      if (message.type !== "progress" || message.progress === undefined) continue
      const { progress: fraction, payload } = message
      it.effect(vector.name, () =>
        Effect.gen(function* () {
          const { publisher, throttle } = setup()
          const progress = yield* throttle.open(message.task_id)
          yield* progress.report(fraction, payload)
          yield* settle()
          expect(publisher.sent.map((s) => [s.type, s.text])).toEqual([
            ["progress", vector.bytes],
          ])
        }))
    }
  })

  it.effect("a task whose lease is lost publishes nothing more, even an update already due", () =>
    Effect.gen(function* () {
      const { publisher, throttle } = setup()
      let lost = false
      const progress = yield* throttle.open("t-fenced", { isLost: () => lost })
      yield* progress.report(0.1)
      yield* settle()
      yield* progress.report(0.2)
      yield* TestClock.adjust("1 second")
      yield* progress.report(0.3)
      lost = true
      yield* TestClock.adjust("1 second")
      yield* progress.close
      expect(publisher.timeline()).toEqual([[0, 0.1], [1000, 0.2]])
    }))
})
