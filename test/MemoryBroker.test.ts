import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Option, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import { type Delivery, Redeliveries, type Transport } from "../src/Transport.ts"
import { LeaseLost, PublishError } from "../src/WorkerError.ts"
import { textOf, utf8 } from "./support/builders.ts"

const IN = "count-words_queue_in"
const OUT = "count-words_queue_out"

const text = (d: { readonly body: Uint8Array }) => textOf(d.body)

const options = (
  o: Partial<MemoryBroker.TransportOptions> = {},
): MemoryBroker.TransportOptions => ({ inQueue: IN, outQueue: OUT, capacity: 2, ...o })

/** Publishes `m<from>` … `m<to>` to the input queue. */
const publishAll = (broker: MemoryBroker.MemoryBroker["Service"], from: number, to: number) =>
  Effect.forEach(
    Array.from({ length: to - from + 1 }, (_, i) => `m${from + i}`),
    (body) => broker.publish(IN, body),
    { discard: true },
  )

/** Reads a transport's deliveries one at a time with `take`. */
const reader = (transport: Transport["Service"]) =>
  Effect.sync(() => {
    const next: Effect.Effect<Option.Option<Delivery>> = Effect.orDie(transport.take)
    const take = Effect.flatMap(next, (d) =>
      Option.isSome(d) ? Effect.succeed(d.value) : Effect.die(new Error("the deliveries ended")))
    const takeN = (n: number) =>
      Effect.replicateEffect(take, n)
    return { next, take, takeN }
  })

/** As a quorum queue of RabbitMQ 4 reports it: the acquired count from the second hand-out on. */
const counted = (count: number, acquired = count) =>
  acquired === 0 ? Redeliveries.Counted({ count }) : Redeliveries.Counted({ count, acquired })

/** Takes every waiting message with basic.get: `[body, redeliveries]`. */
const drain = (broker: MemoryBroker.MemoryBroker["Service"], queue: string) =>
  Effect.gen(function* () {
    const out: Array<[string, Redeliveries]> = []
    for (;;) {
      const d = yield* broker.get(queue)
      if (Option.isNone(d)) return out
      out.push([text(d.value), d.value.redeliveries])
    }
  })

const depth = (broker: MemoryBroker.MemoryBroker["Service"], queue: string = IN) =>
  Effect.all({ ready: broker.ready(queue), unacked: broker.unacked(queue) })

describe("MemoryBroker", () => {
  it.effect("publish, ready, unacked, published and get work as on a queue", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const first = yield* broker.publish(IN, "m1", { type: "submission" })
      const second = yield* broker.publish(IN, utf8("m2"))
      expect(text(first)).toBe("m1")
      expect(first.type).toBe("submission")
      expect(second.type).toBeUndefined()
      expect(second.id).toBeGreaterThan(first.id)
      expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 0 })

      const d1 = Option.getOrThrow(yield* broker.get(IN))
      expect(text(d1)).toBe("m1")
      expect(d1.redeliveries).toEqual(counted(0))
      expect(Option.isNone(d1.lease.duration)).toBe(true)
      expect(Option.isNone(d1.lease.renew)).toBe(true)
      expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 1 })

      yield* d1.ack
      expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 0 })
      expect(yield* Effect.flip(d1.ack)).toEqual(new LeaseLost({ reason: "stale" }))

      const d2 = Option.getOrThrow(yield* broker.get(IN))
      expect(text(d2)).toBe("m2")
      expect(Option.isNone(yield* broker.get(IN))).toBe(true)
      expect((yield* broker.published(IN)).map(text)).toEqual(["m1", "m2"])
      expect(yield* broker.published(OUT)).toEqual([])
    }))

  it.effect("purge drops the waiting messages and the published log", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      yield* publishAll(broker, 1, 3)
      const held = Option.getOrThrow(yield* broker.get(IN))
      expect(yield* broker.purge(IN)).toBe(2)
      expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 1 })
      expect(yield* broker.published(IN)).toEqual([])
      yield* held.ack
      expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 0 })
    }))

  it.effect("published after an id: only the queue's later messages, whichever queue the id is of", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const o1 = yield* broker.publish(OUT, "o1")
      const marker = yield* broker.publish(IN, "m1")
      yield* broker.publish(OUT, "o2")
      yield* broker.publish(OUT, "o3")
      expect((yield* broker.published(OUT, { after: marker.id })).map(text)).toEqual(["o2", "o3"])
      expect((yield* broker.published(OUT, { after: o1.id })).map(text)).toEqual(["o2", "o3"])
      expect((yield* broker.published(OUT, { after: 0 })).map(text)).toEqual(["o1", "o2", "o3"])
      expect(yield* broker.published(IN, { after: marker.id })).toEqual([])
      yield* broker.purge(OUT)
      const o4 = yield* broker.publish(OUT, "o4")
      expect((yield* broker.published(OUT, { after: marker.id })).map(text)).toEqual(["o4"])
      expect(yield* broker.published(OUT, { after: o4.id })).toEqual([])
    }))

  it.effect("publish can preset x-delivery-count", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      yield* broker.publish(IN, "m1", { deliveryCount: 4 })
      yield* broker.publish(IN, "m2", { deliveryCount: 4 })
      const counted4 = Option.getOrThrow(yield* broker.get(IN))
      const flagged = Option.getOrThrow(yield* broker.get(IN, { classic: true }))
      expect(counted4.redeliveries).toEqual(counted(4))
      expect(flagged.redeliveries).toEqual(Redeliveries.Flagged({ redelivered: true }))
    }))

  describe("prefetch", () => {
    it.effect("bounds what a consumer holds; an ack lets the next one in", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(options({ capacity: 2 }))
        const { take, takeN } = yield* reader(transport)
        yield* publishAll(broker, 1, 5)
        expect(yield* depth(broker)).toEqual({ ready: 3, unacked: 2 })
        const [d1, d2] = yield* takeN(2)
        expect([d1, d2].map(text)).toEqual(["m1", "m2"])

        const third = yield* Effect.forkChild(take)
        yield* Effect.yieldNow
        expect(third.pollUnsafe()).toBeUndefined()

        yield* d1!.ack
        const d3 = yield* Fiber.join(third)
        expect(text(d3)).toBe("m3")
        expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 2 })
        yield* Effect.all([d2!.ack, d3.ack])
        expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 2 })
        expect((yield* takeN(2)).map(text)).toEqual(["m4", "m5"])
      }))

    it.effect("a message published to a full consumer waits in the queue", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(options({ capacity: 1 }))
        const { take } = yield* reader(transport)
        yield* publishAll(broker, 1, 1)
        const d1 = yield* take
        yield* publishAll(broker, 2, 2)
        expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 1 })
        yield* d1.ack
        expect(text(yield* take)).toBe("m2")
      }))
  })

  it.effect("requeue redelivers with the count incremented", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const transport = yield* broker.transport(options({ capacity: 1 }))
      const { take } = yield* reader(transport)
      yield* publishAll(broker, 1, 1)
      const first = yield* take
      expect(first.redeliveries).toEqual(counted(0))
      yield* first.requeue
      const second = yield* take
      expect(text(second)).toBe("m1")
      expect(second.redeliveries).toEqual(counted(1))
      yield* second.requeue
      const third = yield* take
      expect(third.redeliveries).toEqual(counted(2))
      expect(yield* Effect.flip(first.requeue)).toEqual(new LeaseLost({ reason: "stale" }))
      yield* third.ack
      expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 0 })
      expect(yield* broker.published(IN)).toHaveLength(1)
    }))

  it.effect("release redelivers without counting a failed delivery, as a nack on RabbitMQ 4", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const transport = yield* broker.transport(options({ capacity: 1 }))
      const { take } = yield* reader(transport)
      yield* publishAll(broker, 1, 1)
      yield* (yield* take).release
      const second = yield* take
      expect(second.redeliveries).toEqual(counted(0, 1))
      yield* second.requeue
      const third = yield* take
      expect(third.redeliveries).toEqual(counted(1, 2))
      yield* third.release
      expect((yield* take).redeliveries).toEqual(counted(1, 3))
    }))

  it.effect("a classic transport flags a redelivery instead of counting it", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const transport = yield* broker.transport(options({ capacity: 1, classic: true }))
      const { take } = yield* reader(transport)
      yield* publishAll(broker, 1, 1)
      const first = yield* take
      expect(first.redeliveries).toEqual(Redeliveries.Flagged({ redelivered: false }))
      yield* first.requeue
      const second = yield* take
      expect(second.redeliveries).toEqual(Redeliveries.Flagged({ redelivered: true }))
      yield* second.requeue
      expect((yield* take).redeliveries).toEqual(Redeliveries.Flagged({ redelivered: true }))
    }))

  describe("leases", () => {
    it.effect("expire after their duration and are redelivered with the count incremented", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(
          options({ capacity: 1, leaseDuration: "5 seconds" }),
        )
        const { take } = yield* reader(transport)
        yield* publishAll(broker, 1, 1)
        const first = yield* take
        expect(Option.map(first.lease.duration, (d) => d.toJSON())).toEqual(
          Option.some({ _id: "Duration", _tag: "Millis", millis: 5000 }),
        )
        const lost = yield* Effect.forkChild(first.lease.lost)

        yield* TestClock.adjust("4900 millis")
        expect(lost.pollUnsafe()).toBeUndefined()
        expect(first.lease.isLost()).toBe(false)
        expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 1 })

        yield* TestClock.adjust("100 millis")
        expect(yield* Fiber.join(lost)).toEqual(new LeaseLost({ reason: "expired" }))
        expect(first.lease.isLost()).toBe(true)

        const second = yield* take
        expect(text(second)).toBe("m1")
        expect(second.redeliveries).toEqual(counted(1))
        expect(second.lease.isLost()).toBe(false)
        expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 1 })

        // The second lease expires in its turn, 5 s after it was granted.
        yield* TestClock.adjust("5 seconds")
        expect(second.lease.isLost()).toBe(true)
        expect((yield* take).redeliveries).toEqual(counted(2))
      }))

    it.effect("a lost lease is fenced: a late ack, requeue or renew fails", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(
          options({ capacity: 1, leaseDuration: "1 second" }),
        )
        const { take } = yield* reader(transport)
        yield* publishAll(broker, 1, 1)
        const stale = yield* take
        yield* TestClock.adjust("1 second")
        const fresh = yield* take

        const ack = yield* Effect.flip(stale.ack)
        const requeue = yield* Effect.flip(stale.requeue)
        const renew = yield* Effect.flip(Option.getOrThrow(stale.lease.renew))
        expect([ack, requeue, renew].map((e) => e._tag)).toEqual([
          "LeaseLost",
          "LeaseLost",
          "LeaseLost",
        ])
        // None of them touched the new delivery of the message.
        expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 1 })
        expect(fresh.lease.isLost()).toBe(false)
        yield* fresh.ack
        expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 0 })
        expect(yield* Effect.flip(stale.ack)).toBeInstanceOf(LeaseLost)
      }))

    it.effect("renew pushes the deadline out by the duration", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(
          options({ capacity: 1, leaseDuration: "5 seconds" }),
        )
        const { take } = yield* reader(transport)
        yield* publishAll(broker, 1, 1)
        const d = yield* take
        yield* TestClock.adjust("3 seconds")
        yield* Option.getOrThrow(d.lease.renew)
        yield* TestClock.adjust("4900 millis")
        expect(d.lease.isLost()).toBe(false)
        yield* TestClock.adjust("100 millis")
        expect(d.lease.isLost()).toBe(true)
        expect(yield* d.lease.lost).toEqual(new LeaseLost({ reason: "expired" }))
      }))

    it.effect("a lease without a duration never expires", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(options({ capacity: 1 }))
        const { take } = yield* reader(transport)
        yield* publishAll(broker, 1, 1)
        const d = yield* take
        expect(Option.isNone(d.lease.duration)).toBe(true)
        expect(Option.isNone(d.lease.renew)).toBe(true)
        yield* TestClock.adjust("10 seconds")
        expect(d.lease.isLost()).toBe(false)
        yield* d.ack
      }))

    it.effect("leases from get expire and go back to the front of the queue, in order", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        yield* publishAll(broker, 1, 3)
        const leased = [
          Option.getOrThrow(yield* broker.get(IN, { leaseDuration: "2 seconds" })),
          Option.getOrThrow(yield* broker.get(IN, { leaseDuration: "2 seconds" })),
        ]
        expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 2 })
        yield* TestClock.adjust("2 seconds")
        for (const d of leased) {
          expect(yield* d.lease.lost).toEqual(new LeaseLost({ reason: "expired" }))
        }
        expect(yield* depth(broker)).toEqual({ ready: 3, unacked: 0 })
        expect(yield* drain(broker, IN)).toEqual([
          ["m1", counted(1)],
          ["m2", counted(1)],
          ["m3", counted(0)],
        ])
      }))
  })

  describe("setCapacity", () => {
    it.effect("grows and shrinks intake without touching held deliveries", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(options({ capacity: 1 }))
        const { take, takeN } = yield* reader(transport)
        yield* publishAll(broker, 1, 5)
        expect(yield* depth(broker)).toEqual({ ready: 4, unacked: 1 })

        yield* transport.setCapacity(3)
        expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 3 })
        const held = yield* takeN(3)
        expect(held.map(text)).toEqual(["m1", "m2", "m3"])

        yield* transport.setCapacity(1)
        expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 3 })
        yield* held[0]!.ack
        yield* held[1]!.ack
        expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 1 })
        yield* held[2]!.ack
        expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 1 })
        expect(text(yield* take)).toBe("m4")
      }))

    it.effect("a capacity of 0 pauses intake until it grows again", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport(options({ capacity: 1 }))
        const { take } = yield* reader(transport)
        yield* publishAll(broker, 1, 1)
        const d1 = yield* take
        yield* transport.setCapacity(0)
        yield* publishAll(broker, 2, 3)
        yield* d1.ack
        expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 0 })
        yield* transport.setCapacity(1)
        expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 1 })
        expect(text(yield* take)).toBe("m2")
      }))
  })

  it.effect("stopIntake ends the deliveries and returns untaken messages uncounted, in order", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const transport = yield* broker.transport(options({ capacity: 4 }))
      const { next, takeN } = yield* reader(transport)
      yield* publishAll(broker, 1, 2)
      const held = yield* takeN(2)
      // m3 and m4 are delivered to the consumer but not yet taken from the stream.
      yield* publishAll(broker, 3, 6)
      expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 4 })

      yield* transport.stopIntake
      expect(Option.isNone(yield* next)).toBe(true)
      expect(yield* depth(broker)).toEqual({ ready: 4, unacked: 2 })

      // Deliveries in hand may still be settled; nothing new is delivered.
      yield* Effect.forEach(held, (d) => d.ack)
      yield* publishAll(broker, 7, 7)
      expect(yield* depth(broker)).toEqual({ ready: 5, unacked: 0 })
      expect(yield* drain(broker, IN)).toEqual(
        ["m3", "m4", "m5", "m6", "m7"].map((body) => [body, counted(0)]),
      )
    }))

  it.effect("closing the transport's scope loses every held lease and requeues the messages", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const { status, taken } = yield* Effect.scoped(Effect.gen(function* () {
        const transport = yield* broker.transport(options({ capacity: 3 }))
        const { takeN } = yield* reader(transport)
        yield* publishAll(broker, 1, 2)
        const taken = yield* takeN(2)
        yield* publishAll(broker, 3, 4) // m3 delivered, not taken; m4 waits in the queue
        expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 3 })
        expect(yield* SubscriptionRef.get(transport.status)).toBe("connected")
        return { status: transport.status, taken }
      }))
      expect(yield* SubscriptionRef.get(status)).toBe("closed")
      for (const d of taken) {
        expect(d.lease.isLost()).toBe(true)
        expect(yield* d.lease.lost).toEqual(new LeaseLost({ reason: "channel_closed" }))
        expect(yield* Effect.flip(d.ack)).toBeInstanceOf(LeaseLost)
      }
      expect(yield* depth(broker)).toEqual({ ready: 4, unacked: 0 })
      expect(yield* drain(broker, IN)).toEqual([
        ["m1", counted(1)],
        ["m2", counted(1)],
        ["m3", counted(0)],
        ["m4", counted(0)],
      ])
    }).pipe(Effect.scoped))

  it.effect("failNextPublish fails exactly the next matching publish", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const transport = yield* broker.transport(options())

      yield* broker.failNextPublish({ type: "success" })
      yield* transport.publish(utf8("p1"), "progress")
      const error = yield* Effect.flip(transport.publish(utf8("s1"), "success"))
      expect(error).toEqual(new PublishError({ reason: "injected", messageType: "success" }))
      yield* transport.publish(utf8("s2"), "success")
      expect((yield* broker.published(OUT)).map((m) => [text(m), m.type])).toEqual([
        ["p1", "progress"],
        ["s2", "success"],
      ])

      // Scoped to a queue: a publish elsewhere goes through and leaves it armed.
      yield* broker.failNextPublish({ queue: IN })
      yield* transport.publish(utf8("f1"), "failure")
      expect((yield* Effect.flip(broker.publish(IN, "m1"))).reason).toBe("injected")
      yield* broker.publish(IN, "m2")

      // Unscoped: the next publish of any kind fails.
      yield* broker.failNextPublish()
      expect(yield* Effect.flip(transport.publish(utf8("x"), "started"))).toEqual(
        new PublishError({ reason: "injected", messageType: "started" }),
      )
      yield* transport.publish(utf8("st"), "started")
      expect((yield* broker.published(OUT)).map(text)).toEqual(["p1", "s2", "f1", "st"])
      expect((yield* broker.published(IN)).map(text)).toEqual(["m2"])
    }))

  it.effect("two transports on one queue share its messages round-robin within their prefetch", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const a = yield* reader(yield* broker.transport(options({ capacity: 2 })))
      const b = yield* reader(yield* broker.transport(options({ capacity: 2 })))
      yield* publishAll(broker, 1, 6)
      expect(yield* depth(broker)).toEqual({ ready: 2, unacked: 4 })
      const fromA = yield* a.takeN(2)
      const fromB = yield* b.takeN(2)
      expect(fromA.map(text)).toEqual(["m1", "m3"])
      expect(fromB.map(text)).toEqual(["m2", "m4"])

      // B settles one: B gets the next, A (full) nothing.
      yield* fromB[0]!.ack
      expect(yield* depth(broker)).toEqual({ ready: 1, unacked: 4 })
      expect(text(yield* b.take)).toBe("m5")
      yield* fromA[0]!.ack
      expect(text(yield* a.take)).toBe("m6")
      expect(yield* depth(broker)).toEqual({ ready: 0, unacked: 4 })
    }))
})
