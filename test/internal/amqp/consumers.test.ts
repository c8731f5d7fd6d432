import { describe, expect, it } from "@effect/vitest"
import { Deferred, type Duration, Effect, Exit, Fiber, Option } from "effect"
import * as Consumers from "../../../src/internal/amqp/consumers.ts"
import { Inbox } from "../../../src/internal/transport/inbox.ts"
import type { Delivery } from "../../../src/Transport.ts"
import { LeaseLost, TransportError } from "../../../src/WorkerError.ts"
import { withLogs } from "../../support/logs.ts"
import { eventually, FakeChannel } from "./fakes.ts"

/** Consumers at `capacity` on a fake channel, filled as a new connection fills them. */
const consuming = (
  capacity: number,
  options: { readonly consumerTimeout?: Duration.Input } = {},
) =>
  Effect.gen(function* () {
    const inbox = new Inbox<Delivery, TransportError>()
    const consumers = yield* Consumers.make({
      url: "amqp://guest:s3cret@127.0.0.1:5672/",
      inQueue: "in",
      capacity,
      inbox,
      ...options,
    })
    const channel = new FakeChannel("consumer")
    const ended = yield* Deferred.make<string>()
    const target = Consumers.consuming(channel, ended)
    consumers.attach(target)
    yield* consumers.fill(target)
    return { inbox, consumers, channel, target, ended }
  })

describe("Consumers", () => {
  it.effect("consume at the capacity with manual acks, asking for the consumer timeout", () =>
    Effect.gen(function* () {
      const { channel } = yield* consuming(4, { consumerTimeout: "31 minutes" })
      expect(channel.log).toEqual(["consumer.prefetch 4", "consumer.consume in"])
      expect(channel.windows()).toEqual([4])
      expect(channel.consumers.get("ctag-1")!.options).toEqual({
        noAck: false,
        arguments: { "x-consumer-timeout": 31 * 60_000 },
      })
    }))

  it.effect("a queue that refuses the consumer timeout (a classic queue on RabbitMQ 4): the attempt fails, the next consumes without it", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<Delivery, TransportError>()
      const consumers = yield* Consumers.make({
        url: "amqp://127.0.0.1/",
        inQueue: "in",
        capacity: 2,
        inbox,
        consumerTimeout: "31 minutes",
      })
      const refusing = new FakeChannel("refusing")
      refusing.failing.set(
        "consume",
        new Error(
          "Operation failed: BasicConsume; 406 (PRECONDITION-FAILED) with message \"PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue 'in' in vhost '/' of queue type rabbit_classic_queue\"",
        ),
      )
      const first = Consumers.consuming(refusing, yield* Deferred.make<string>())
      consumers.attach(first)
      const failed = yield* Effect.exit(consumers.fill(first))
      expect(Exit.isFailure(failed)).toBe(true)
      consumers.detach()
      const next = new FakeChannel("next")
      const target = Consumers.consuming(next, yield* Deferred.make<string>())
      consumers.attach(target)
      yield* consumers.fill(target)
      expect(next.consumers.get("ctag-1")!.options).toEqual({ noAck: false })
    }))

  it.effect("a broker older than 3.12 ignores the consumer timeout: one warning naming the command that makes its lease as long, consumed without the argument", () =>
    withLogs((logs) =>
      Effect.gen(function* () {
        const consumers = yield* Consumers.make({
          url: "amqp://127.0.0.1/",
          inQueue: "in",
          capacity: 2,
          inbox: new Inbox<Delivery, TransportError>(),
          consumerTimeout: "31 minutes",
        })
        for (const label of ["first", "again"]) {
          const channel = new FakeChannel(label)
          const target = Consumers.consuming(channel, yield* Deferred.make<string>(), "3.10.8")
          consumers.attach(target)
          yield* consumers.fill(target)
          expect(channel.consumers.get("ctag-1")!.options).toEqual({ noAck: false })
          consumers.detach()
        }
        const warnings = logs.lines.filter((l) => l.level === "Warn").map((l) => l.message)
        expect(warnings).toHaveLength(1)
        expect(warnings[0]).toContain("RabbitMQ 3.10.8 takes no x-consumer-timeout")
        expect(warnings[0]).toContain("WORKER_CONSUMER_TIMEOUT_S (1860 s)")
        expect(warnings[0]).toContain(
          "rabbitmqctl eval 'application:set_env(rabbit, consumer_timeout, 1860000).'",
        )
      })
    ))

  it("tells the brokers that honour x-consumer-timeout (3.12 and later) by their version", () => {
    expect(["3.10.8", "3.11.28", "3.12.0", "3.13.7", "4.3.6", "unknown", undefined].map(
      Consumers.takesConsumerTimeout,
    )).toEqual([false, false, true, true, true, true, true])
  })

  it.effect("a window past AMQP's 16 bits is asked as the largest prefetch", () =>
    Effect.gen(function* () {
      const { channel } = yield* consuming(100_000)
      expect(channel.log[0]).toBe("consumer.prefetch 65535")
    }))

  it.effect("growing adds a consumer with the difference; shrinking cancels the newest until the windows fit, then tops up", () =>
    Effect.gen(function* () {
      const { channel, consumers } = yield* consuming(4)
      yield* consumers.setCapacity(6)
      expect(channel.windows()).toEqual([4, 2])
      channel.log.length = 0
      yield* consumers.setCapacity(3)
      expect(channel.log).toEqual([
        "consumer.cancel ctag-2",
        "consumer.cancel ctag-1",
        "consumer.prefetch 3",
        "consumer.consume in",
      ])
      expect(channel.windows()).toEqual([3])
      yield* consumers.setCapacity(2)
      expect(channel.windows()).toEqual([2])
    }))

  it.effect("a shrink ends only once the broker has answered the cancel", () =>
    Effect.gen(function* () {
      const { channel, consumers } = yield* consuming(4)
      channel.holding.add("cancel")
      const shrinking = yield* Effect.forkChild(consumers.setCapacity(2))
      yield* eventually(() => channel.log.includes("consumer.cancel ctag-1"))
      expect(shrinking.pollUnsafe()).toBeUndefined()
      channel.release()
      yield* Fiber.join(shrinking)
      expect(channel.windows()).toEqual([2])
    }))

  it.effect("past MAX_CONSUMERS grows, the consumers are merged into one of the capacity", () =>
    Effect.gen(function* () {
      const { channel, consumers } = yield* consuming(1)
      for (let n = 2; n <= Consumers.MAX_CONSUMERS; n++) yield* consumers.setCapacity(n)
      expect(channel.windows()).toEqual(Array.from({ length: Consumers.MAX_CONSUMERS }, () => 1))
      yield* consumers.setCapacity(Consumers.MAX_CONSUMERS + 1)
      expect(channel.windows()).toEqual([Consumers.MAX_CONSUMERS + 1])
    }))

  it.effect("a consumer the broker makes after intake stopped is cancelled", () =>
    Effect.gen(function* () {
      const { channel, consumers, inbox } = yield* consuming(4)
      channel.holding.add("consume")
      const growing = yield* Effect.forkChild(consumers.setCapacity(6))
      yield* eventually(() => channel.windows().length === 2)
      yield* consumers.stopIntake
      expect(channel.windows()).toEqual([2])
      channel.release()
      yield* Fiber.join(growing)
      expect(channel.windows()).toEqual([])
      expect(channel.log.slice(-1)).toEqual(["consumer.cancel ctag-2"])
      expect(yield* inbox.take).toEqual(Option.none())
    }))

  it.effect("deliveries reach take with their channel's lease; the broker's cancel loses it and ends the session", () =>
    Effect.gen(function* () {
      const { channel, inbox, ended } = yield* consuming(2)
      channel.deliver("ctag-1", { deliveryTag: 1 })
      const delivery = Option.getOrThrow(yield* inbox.take)
      expect(new TextDecoder().decode(delivery.body)).toBe(`{"n":1}`)
      yield* delivery.ack
      expect(channel.log.slice(-1)).toEqual(["consumer.ack 1"])
      channel.deliver("ctag-1", { deliveryTag: 2 })
      const second = Option.getOrThrow(yield* inbox.take)
      expect(second.lease).toBe(delivery.lease)
      channel.consumers.get("ctag-1")!.onMessage(null)
      expect(second.lease.isLost()).toBe(true)
      expect(yield* Deferred.isDone(ended)).toBe(true)
      expect(yield* Effect.flip(second.requeue)).toEqual(
        new LeaseLost({ reason: "consumer_cancelled" }),
      )
    }))

  it.effect("stopping intake cancels the consumers, gives back what was not taken, and ends take, once", () =>
    Effect.gen(function* () {
      const { channel, consumers, inbox } = yield* consuming(2)
      channel.deliver("ctag-1", { deliveryTag: 1 })
      channel.deliver("ctag-1", { deliveryTag: 2 })
      yield* inbox.take
      channel.log.length = 0
      yield* consumers.stopIntake
      yield* consumers.stopIntake
      expect(channel.log).toEqual(["consumer.cancel ctag-1", "consumer.nack 2 requeue"])
      expect(consumers.stopped()).toBe(true)
      expect(yield* inbox.take).toEqual(Option.none())
      yield* consumers.setCapacity(5)
      expect(channel.windows()).toEqual([])
    }))

  it.effect("a configuration error ends intake: take fails with it", () =>
    Effect.gen(function* () {
      const { consumers, inbox } = yield* consuming(2)
      const error = new TransportError({ reason: "access_refused", message: "refused" })
      consumers.fail(error)
      expect(consumers.stopped()).toBe(true)
      expect(yield* Effect.exit(inbox.take)).toEqual(Exit.fail(error))
    }))

  it.effect("between connections, a new capacity waits for the next channel", () =>
    Effect.gen(function* () {
      const { consumers } = yield* consuming(2)
      consumers.detach()
      yield* consumers.setCapacity(7)
      const next = new FakeChannel("next")
      const target = Consumers.consuming(next, yield* Deferred.make<string>())
      consumers.attach(target)
      yield* consumers.fill(target)
      expect(next.windows()).toEqual([7])
    }))

  it.effect("a refused prefetch fails as a connection error without the password", () =>
    Effect.gen(function* () {
      const inbox = new Inbox<Delivery, TransportError>()
      const consumers = yield* Consumers.make({
        url: "amqp://guest:s3cret@127.0.0.1:5672/",
        inQueue: "in",
        capacity: 2,
        inbox,
      })
      const channel = new FakeChannel("consumer")
      channel.failing.set("prefetch", new Error("Channel closed"))
      const target = Consumers.consuming(channel, yield* Deferred.make<string>())
      const error = yield* Effect.flip(consumers.fill(target))
      expect(error.reason).toBe("connect")
      expect(error.message).toBe(
        "Cannot connect to amqp://guest:***@127.0.0.1:5672/: Channel closed",
      )
    }))
})
