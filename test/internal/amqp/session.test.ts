import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Option, Scope, Stream, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import * as Confirms from "../../../src/internal/amqp/confirms.ts"
import * as Consumers from "../../../src/internal/amqp/consumers.ts"
import { Current } from "../../../src/internal/amqp/current.ts"
import * as Session from "../../../src/internal/amqp/session.ts"
import { Inbox } from "../../../src/internal/transport/inbox.ts"
import type { ConnectionStatus, Delivery } from "../../../src/Transport.ts"
import type { TransportError } from "../../../src/WorkerError.ts"
import { blockedLoop } from "../../support/blockedLoop.ts"
import { captureLogs } from "../../support/logs.ts"
import { eventually, FakeConnection } from "./fakes.ts"

/**
 * The session loop over fake connections, the parts around it made as `AmqpTransport.make` makes
 * them, intake stopped first when the scope closes. `connections` answer the attempts in turn: a
 * connection, or a failure.
 */
const sessions = (
  connections: ReadonlyArray<FakeConnection | Error>,
  url = "amqp://fake",
  heartbeatSeconds?: number,
) =>
  Effect.gen(function* () {
    const inbox = new Inbox<Delivery, TransportError>()
    const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
    const published: Array<ConnectionStatus> = []
    yield* SubscriptionRef.changes(status).pipe(
      Stream.runForEach((s) => Effect.sync(() => published.push(s))),
      Effect.forkScoped,
    )
    const current = new Current<Session.Session>()
    const consumers = yield* Consumers.make({
      url: "amqp://fake",
      inQueue: "in",
      capacity: 2,
      inbox,
    })
    const confirms = yield* Confirms.make({ outQueue: "out", confirmTimeout: Duration.seconds(10) })
    let attempts = 0
    const urls: Array<string> = []
    const connect = (url: string) => {
      urls.push(url)
      const next = connections[attempts++]
      return next instanceof Error || next === undefined
        ? Promise.reject(next ?? new Error("no more connections"))
        : Promise.resolve(next)
    }
    const loop = yield* Session.run({
      url,
      heartbeatSeconds,
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
    return {
      inbox,
      status: statusNow,
      current,
      confirms,
      consumers,
      loop,
      attempts: () => attempts,
      urls,
      /** Every status published, in order, the first included. */
      published,
    }
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

  it.effect("serves once its queues are declared, before its consumer starts: a delivery taken at once finds the session", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      connection.consumer.holding.add("consume")
      const { status, current } = yield* sessions([connection])
      yield* eventually(() => connection.log.includes("consumer.consume in"))
      // The consume not yet answered: the publishing channel is current, the status not live yet.
      expect(current.now?.publisher).toBe(connection.publisher)
      expect(status()).toBe("connecting")
      connection.consumer.release()
      yield* eventually(() => status() === "connected")
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

  it.effect("a publish the broker refuses closes its channel alone: a new confirm channel, the connection and the leases kept; a message past the size it names fails too_large, the others closed", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      const { status, current, inbox, confirms } = yield* sessions([connection])
      yield* eventually(() => status() === "connected")
      connection.consumer.deliver("ctag-1", { deliveryTag: 1 })
      const delivery = Option.getOrThrow(yield* inbox.take)
      const first = connection.publisher
      const on = current.now!
      const large = yield* Effect.forkChild(confirms.publish(on, new Uint8Array(20), "success"))
      const small = yield* Effect.forkChild(confirms.publish(on, new Uint8Array(5), "progress"))
      yield* eventually(() => first.published.length === 2)
      first.closeByBroker(
        new Error(
          'Channel closed by server: 406 (PRECONDITION-FAILED) with message "PRECONDITION_FAILED - message size 20 is larger than configured max size 10"',
        ),
      )
      const [largeExit, smallExit] = [yield* Fiber.await(large), yield* Fiber.await(small)]
      expect(largeExit).toMatchObject({ _tag: "Failure" })
      expect(Exit.isFailure(largeExit) && String(largeExit.cause)).toContain("too_large")
      expect(Exit.isFailure(smallExit) && String(smallExit.cause)).toContain("closed")
      yield* eventually(() => current.now !== undefined && current.now.publisher !== first)
      const next = connection.publisher
      expect(current.now!.publisher).toBe(next)
      expect(delivery.lease.isLost()).toBe(false)
      expect(status()).toBe("connected")
      expect(connection.log).not.toContain("connection.close")
      // Past the size the broker named, a publish fails at once, unsent; a smaller one goes out.
      const again = yield* Effect.exit(
        confirms.publish(current.now!, new Uint8Array(20), "success"),
      )
      expect(Exit.isFailure(again) && String(again.cause)).toContain("too_large")
      expect(next.published).toHaveLength(0)
      const ok = yield* Effect.forkChild(
        confirms.publish(current.now!, new Uint8Array(5), "success"),
      )
      yield* eventually(() => next.published.length === 1)
      next.published[0]!.confirm(null)
      expect(Exit.isSuccess(yield* Fiber.await(ok))).toBe(true)
    }))

  it.effect("a confirm channel the broker closes and that cannot be opened again gives the connection up", () =>
    Effect.gen(function* () {
      const first = new FakeConnection()
      const second = new FakeConnection()
      const { status, current, inbox } = yield* sessions([first, second])
      yield* eventually(() => status() === "connected")
      first.consumer.deliver("ctag-1", { deliveryTag: 1 })
      const delivery = Option.getOrThrow(yield* inbox.take)
      first.createConfirmChannel = () => Promise.reject(new Error("NOT_ALLOWED"))
      first.publisher.closeByBroker(
        new Error("Channel closed by server: 406 (PRECONDITION-FAILED)"),
      )
      yield* eventually(() => current.now?.publisher === second.publisher)
      expect(delivery.lease.isLost()).toBe(true)
    }))

  it.effect("a confirm channel the broker closes before the session serves (a refused declaration) is not replaced", () =>
    Effect.gen(function* () {
      const first = new FakeConnection()
      const second = new FakeConnection()
      first.publisher.holding.add("assertQueue")
      const { status, current } = yield* sessions([first, second])
      yield* eventually(() => first.log.includes("publisher.assertQueue out durable"))
      first.publisher.closeByBroker(
        new Error("Channel closed by server: 406 (PRECONDITION-FAILED)"),
      )
      // The declaration failed with its channel: a failed attempt, tried again after a backoff.
      yield* eventually(() => first.log.includes("connection.close"))
      yield* TestClock.adjust("3 seconds")
      yield* eventually(() => current.now?.publisher === second.publisher)
      expect(status()).toBe("connected")
      // One confirm channel opened on the first connection: its own, never a replacement.
      expect(first.log.filter((l) => l === "connection.createConfirmChannel")).toHaveLength(1)
    }))

  it.effect("a confirm channel closed with no error of its own gives the connection up", () =>
    Effect.gen(function* () {
      const first = new FakeConnection()
      const second = new FakeConnection()
      const { status, current, inbox } = yield* sessions([first, second])
      yield* eventually(() => status() === "connected")
      first.consumer.deliver("ctag-1", { deliveryTag: 1 })
      const delivery = Option.getOrThrow(yield* inbox.take)
      first.publisher.emit("close")
      yield* eventually(() => current.now?.publisher === second.publisher)
      expect(delivery.lease.isLost()).toBe(true)
    }))

  it.effect("a cluster's nodes: each attempt goes to the next, so a node that is down is left at once", () =>
    Effect.gen(function* () {
      const logs = captureLogs()
      const connection = new FakeConnection()
      const { status, urls } = yield* sessions(
        [new Error("connect ECONNREFUSED"), connection],
        "amqp://u:p@node-a/v, amqp://u:p@node-b/v",
        10,
      ).pipe(Effect.provide(logs.layer))
      yield* eventually(() => urls.length === 1)
      yield* TestClock.adjust("3 seconds")
      yield* eventually(() => status() === "connected")
      // In an order shuffled per process, each with the heartbeat asked.
      expect([...urls].sort()).toEqual([
        "amqp://u:p@node-a/v?heartbeat=10",
        "amqp://u:p@node-b/v?heartbeat=10",
      ])
      const node = urls[1]!.replace("u:p@", "u:***@").replace("?heartbeat=10", "")
      expect(logs.lines.map((l) => `${l.level} ${l.message}`)).toContain(
        `Info Connected to the broker at ${node}`,
      )
    }))

  it.effect("a lost connection is logged with its cause and its node, its return with how long it took", () =>
    Effect.gen(function* () {
      const logs = captureLogs()
      const first = new FakeConnection()
      const second = new FakeConnection()
      const { status, current } = yield* sessions([first, second], "amqp://u:secret@node-a/v")
        .pipe(Effect.provide(logs.layer))
      yield* eventually(() => status() === "connected")
      first.lose(new Error("Heartbeat timeout"))
      yield* eventually(() => current.now?.publisher === second.publisher)
      const messages = logs.lines.map((l) => `${l.level} ${l.message}`)
      expect(messages).toContain(
        "Warn The broker connection to amqp://u:***@node-a/v was lost (Heartbeat timeout): reconnecting",
      )
      expect(messages).toContain(
        "Info Connected to the broker again, at amqp://u:***@node-a/v, 0.0 s after the loss",
      )
      expect(messages.join("\n")).not.toContain("secret")
    }))

  it.effect("an overdue confirm gives the connection up (its socket destroyed), unless the broker blocks publishing", () =>
    Effect.gen(function* () {
      const logs = captureLogs()
      const first = new FakeConnection()
      const second = new FakeConnection()
      const { status, current } = yield* sessions([first, second]).pipe(
        Effect.provide(logs.layer),
      )
      yield* eventually(() => status() === "connected")
      // A resource alarm: overdue confirms are the alarm's, and the connection is kept.
      first.emit("blocked", "low on memory")
      yield* eventually(() => status() === "blocked")
      current.now!.overdue()
      expect(first.log).not.toContain("connection.stream.destroy")
      first.emit("unblocked")
      yield* eventually(() => status() === "connected")
      current.now!.overdue()
      expect(first.log).toContain("connection.stream.destroy")
      yield* eventually(() => current.now?.publisher === second.publisher)
      const messages = logs.lines.map((l) => `${l.level} ${l.message}`)
      expect(messages).toEqual(expect.arrayContaining([
        "Warn The broker at amqp://fake blocks publishing, a resource alarm (low on memory): publishes wait until it ends",
        "Info The broker at amqp://fake takes publishes again: its resource alarm ended",
        "Warn The broker connection to amqp://fake was lost (a publish's confirm was overdue, so the connection was given up): reconnecting",
      ]))
    }))

  it.effect("a broker not heard from for a whole heartbeat shows the connection stalled, until a byte comes", () =>
    Effect.gen(function* () {
      const logs = captureLogs()
      const connection = new FakeConnection()
      // Asked 10 s, agreed 2 s: the agreed one is the broker's pace.
      connection.connection.heartbeat = 2
      const { status, current } = yield* sessions([connection], "amqp://fake", 10).pipe(
        Effect.provide(logs.layer),
      )
      yield* eventually(() => status() === "connected")
      // Bytes a second apart: heard from, however long it runs.
      for (let second = 1; second <= 4; second++) {
        connection.connection.stream.bytesRead += 8
        yield* TestClock.adjust("1 second")
      }
      // Read a quarter of a heartbeat apart: the last byte seen at 3.5 s, overdue past 5.5 s.
      yield* TestClock.adjust("1500 millis")
      expect(status()).toBe("connected")
      yield* TestClock.adjust("1 second")
      expect(status()).toBe("stalled")
      expect(current.now?.publisher).toBe(connection.publisher)
      connection.connection.stream.bytesRead += 8
      yield* TestClock.adjust("500 millis")
      expect(status()).toBe("connected")
      // Lost while stalled: the loss is what shows. A resource alarm shows over a stall.
      yield* TestClock.adjust("2500 millis")
      expect(status()).toBe("stalled")
      connection.emit("blocked", "low on memory")
      yield* eventually(() => status() === "blocked")
      connection.emit("unblocked")
      yield* eventually(() => status() === "stalled")
      connection.lose(new Error("Heartbeat timeout"))
      yield* eventually(() => status() === "disconnected")
      expect(logs.lines.map((l) => `${l.level} ${l.message}`)).toEqual(expect.arrayContaining([
        "Warn No byte from the broker at amqp://fake for 2 s: a heartbeat is overdue",
        "Info The broker at amqp://fake is heard from again",
      ]))
    }))

  it.effect("a blocked event loop is not the broker's silence: still connected after the block, stalled a whole heartbeat of silence later", () =>
    Effect.gen(function* () {
      const loop = yield* blockedLoop
      const connection = new FakeConnection()
      connection.connection.heartbeat = 2
      const { status } = yield* loop.watched(sessions([connection], "amqp://fake", 10))
      yield* eventually(() => status() === "connected")
      yield* TestClock.adjust("1 second")
      // 45 s blocked: the heartbeats the broker sent meanwhile are still unread in the socket
      // when the first check after the block runs.
      yield* loop.block(45_000)
      yield* TestClock.adjust("1 second")
      expect(status()).toBe("connected")
      // Checked a quarter of a heartbeat apart: 2.5 s of the loop's own time without a byte.
      yield* TestClock.adjust("500 millis")
      expect(status()).toBe("stalled")
    }))

  it.effect("no heartbeat agreed, no stall: a silent broker is left to the confirms", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      connection.connection.heartbeat = 0
      const { status } = yield* sessions([connection], "amqp://fake", 10)
      yield* eventually(() => status() === "connected")
      yield* TestClock.adjust("10 minutes")
      expect(status()).toBe("connected")
    }))

  it.effect("a resource alarm as the connection opens: blocked from its first status on", () =>
    Effect.gen(function* () {
      const connection = new FakeConnection()
      // Before the queues are declared, the broker says it blocks publishing.
      connection.publisher.holding.add("assertQueue")
      const { status } = yield* sessions([connection])
      yield* eventually(() => connection.log.includes("publisher.assertQueue out durable"))
      connection.emit("blocked", "low on disk")
      connection.publisher.release()
      yield* eventually(() => status() !== "connecting")
      expect(status()).toBe("blocked")
    }))

  it("asks the heartbeat in the URL's query, unless the URL asks its own", () => {
    expect(Session.withHeartbeat("amqp://node/v", 10)).toBe("amqp://node/v?heartbeat=10")
    expect(Session.withHeartbeat("amqp://node/v?frameMax=8192", 5)).toBe(
      "amqp://node/v?frameMax=8192&heartbeat=5",
    )
    expect(Session.withHeartbeat("amqp://node/v?heartbeat=30", 10)).toBe(
      "amqp://node/v?heartbeat=30",
    )
    expect(Session.withHeartbeat("amqp://node/v", undefined)).toBe("amqp://node/v")
  })

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

  it.effect("a failed attempt publishes no status: `connecting` once, until the first connection", () =>
    Effect.gen(function* () {
      const refused = new Error("connect ECONNREFUSED")
      const { attempts, published, status } = yield* sessions(
        [refused, refused, refused, new FakeConnection()],
      )
      for (let attempt = 1; attempt <= 4; attempt++) {
        yield* eventually(() => attempts() >= attempt)
        yield* TestClock.adjust("3 seconds")
      }
      yield* eventually(() => status() === "connected")
      expect(attempts()).toBe(4)
      expect(published).toEqual(["connecting", "connected"])
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
