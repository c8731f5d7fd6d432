import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Option, Scope, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import * as Confirms from "../../../src/internal/amqp/confirms.ts"
import * as Consumers from "../../../src/internal/amqp/consumers.ts"
import { Current } from "../../../src/internal/amqp/current.ts"
import * as Session from "../../../src/internal/amqp/session.ts"
import { Inbox } from "../../../src/internal/transport/inbox.ts"
import type { ConnectionStatus, Delivery } from "../../../src/Transport.ts"
import type { TransportError } from "../../../src/WorkerError.ts"
import { eventually, FakeConnection } from "./fakes.ts"

/**
 * The session loop over fake connections, the parts around it made as `AmqpTransport.make` makes
 * them, intake stopped first when the scope closes. `connections` answer the attempts in turn: a
 * connection, or a failure.
 */
const sessions = (connections: ReadonlyArray<FakeConnection | Error>, url = "amqp://fake") =>
  Effect.gen(function* () {
    const inbox = new Inbox<Delivery, TransportError>()
    const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
    const current = new Current<Session.Session>()
    const consumers = yield* Consumers.make({
      url: "amqp://fake",
      inQueue: "in",
      capacity: 2,
      inbox,
    })
    const confirms = yield* Confirms.make({ outQueue: "out", confirmTimeout: Duration.seconds(10) })
    let attempts = 0
    const connect = () => {
      const next = connections[attempts++]
      return next instanceof Error || next === undefined
        ? Promise.reject(next ?? new Error("no more connections"))
        : Promise.resolve(next)
    }
    const loop = yield* Session.run({
      url,
      inQueue: "in",
      outQueue: "out",
      connect,
      current,
      status,
      consumers,
      confirms,
    }).pipe(Effect.forkScoped)
    yield* Effect.addFinalizer(() => consumers.stopIntake)
    const statusNow = () => Effect.runSync(SubscriptionRef.get(status))
    return { inbox, status: statusNow, current, consumers, loop, attempts: () => attempts }
  })

describe("Session", () => {
  it.effect("connects, opens both channels at once, declares both queues durable, consumes, then holds the session", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      const { status, current } = yield* sessions([connection])
      yield* eventually(() => status() === "connected")
      expect(connection.log).toEqual([
        "connection.createConfirmChannel",
        "connection.createChannel",
        "publisher.assertQueue out durable",
        "consumer.assertQueue in durable",
        "consumer.prefetch 2",
        "consumer.consume in",
      ])
      expect(current.now?.publisher).toBe(connection.publisher)
    }))

  it.effect("closes in the order that loses no ack: consumers cancelled, the consumer channel closed after a synchronous call, confirms awaited, then the connection", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      const scope = yield* Scope.make()
      const { status, current } = yield* sessions([connection]).pipe(Scope.provide(scope))
      yield* eventually(() => status() === "connected")
      connection.log.length = 0
      yield* Scope.close(scope, Exit.void)
      expect(connection.log).toEqual([
        "consumer.cancel ctag-1",
        "consumer.checkQueue in",
        "consumer.close",
        "publisher.waitForConfirms",
        "connection.close",
      ])
      expect(current.now).toBeUndefined()
      expect(status()).toBe("disconnected")
    }))

  it.effect("a lost connection loses its leases and its session, and the next connects at once", () =>
    Effect.gen(function* () {
      const first = new FakeConnection()
      const second = new FakeConnection()
      const { status, current, inbox } = yield* sessions([first, second])
      yield* eventually(() => status() === "connected")
      first.consumer.deliver("ctag-1", { deliveryTag: 1 })
      const delivery = Option.getOrThrow(yield* inbox.take)
      first.lose()
      yield* eventually(() => current.now?.publisher === second.publisher)
      expect(delivery.lease.isLost()).toBe(true)
      expect(status()).toBe("connected")
      expect(second.consumer.windows()).toEqual([2])
    }))

  it.effect("a failed attempt is retried after a backoff", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      const { status, attempts } = yield* sessions(
        [new Error("connect ECONNREFUSED"), connection],
      )
      yield* eventually(() => attempts() === 1)
      yield* TestClock.adjust("50 millis")
      expect(attempts()).toBe(1)
      yield* TestClock.adjust("3 seconds")
      yield* eventually(() => status() === "connected")
      expect(attempts()).toBe(2)
    }))

  it.effect("a configuration error is not retried: the loop fails with it", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      connection.consumer.failing.set(
        "assertQueue",
        Object.assign(new Error("inequivalent"), { code: 406 }),
      )
      const { loop, attempts } = yield* sessions([connection, new FakeConnection()])
      const error = yield* Effect.flip(Fiber.join(loop))
      expect(error.reason).toBe("precondition_failed")
      expect(attempts()).toBe(1)
    }))

  it.effect("a vhost the broker refuses at connect (530) is not retried: the loop fails with its reason", () =>
    Effect.gen(function* () {
      const refused = Object.assign(
        new Error("Expected ConnectionOpenOk; got <ConnectionClose channel:0>"),
        { replyCode: 530, replyText: "NOT_ALLOWED - vhost nope not found" },
      )
      const { loop, attempts } = yield* sessions([refused, new FakeConnection()])
      const error = yield* Effect.flip(Fiber.join(loop))
      expect(error.reason).toBe("not_allowed")
      expect(error.isConfiguration).toBe(true)
      expect(error.message).toContain("NOT_ALLOWED - vhost nope not found")
      expect(attempts()).toBe(1)
    }))

  it.effect("a broker URL that cannot work fails the loop before any connection", () =>
    Effect.gen(function* () {
      const { loop, attempts } = yield* sessions([new FakeConnection()], "amqp://fake:0/vhost")
      const error = yield* Effect.flip(Fiber.join(loop))
      expect(error.reason).toBe("invalid_url")
      expect(error.isConfiguration).toBe(true)
      expect(error.message).toBe("The broker URL has port 0: a port is from 1 to 65535")
      expect(attempts()).toBe(0)
    }))

  it.effect("with intake stopped, a connection opens no consumer channel and declares both queues on the confirm channel", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      const inbox = new Inbox<Delivery, TransportError>()
      const consumers = yield* Consumers.make({
        url: "amqp://fake",
        inQueue: "in",
        capacity: 2,
        inbox,
      })
      yield* consumers.stopIntake
      const current = new Current<Session.Session>()
      yield* Session.run({
        url: "amqp://fake",
        inQueue: "in",
        outQueue: "out",
        connect: () => Promise.resolve(connection),
        current,
        status: yield* SubscriptionRef.make<ConnectionStatus>("connecting"),
        consumers,
        confirms: yield* Confirms.make({ outQueue: "out", confirmTimeout: Duration.seconds(10) }),
      }).pipe(Effect.forkScoped)
      yield* eventually(() => current.now !== undefined)
      expect(connection.log).toEqual([
        "connection.createConfirmChannel",
        "publisher.assertQueue in durable",
        "publisher.assertQueue out durable",
      ])
    }))
})
