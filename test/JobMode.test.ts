import { describe, expect, it } from "@effect/vitest"
import {
  ConfigProvider,
  Duration,
  Effect,
  Exit,
  Fiber,
  MutableRef,
  Option,
  Ref,
  Scope,
  SubscriptionRef,
} from "effect"
import { TestClock } from "effect/testing"
import * as Confirms from "../src/internal/amqp/confirms.ts"
import * as Consumers from "../src/internal/amqp/consumers.ts"
import { Current } from "../src/internal/amqp/current.ts"
import * as Session from "../src/internal/amqp/session.ts"
import { Inbox } from "../src/internal/transport/inbox.ts"
import * as JobMode from "../src/JobMode.ts"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as Settings from "../src/Settings.ts"
import type { ConnectionStatus, Delivery } from "../src/Transport.ts"
import { LeaseLost, type TransportError } from "../src/WorkerError.ts"
import { textOf } from "./support/builders.ts"
import { isDone } from "./support/logs.ts"

/**
 * The session loop (as `AmqpTransport.make` runs it, its default backoff capped at 3 s) against a
 * broker with nothing listening, watched by `failWhenUnreachable`: its fiber, and how many
 * attempts were made.
 */
const unreachableBroker = (timeout: Duration.Duration) =>
  Effect.gen(function* () {
    const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
    let attempts = 0
    yield* Session.run({
      url: "amqp://127.0.0.1:1",
      inQueue: "in",
      outQueue: "out",
      connect: () => {
        attempts += 1
        return Promise.reject(new Error("connect ECONNREFUSED 127.0.0.1:1"))
      },
      current: new Current<Session.Session>(),
      status,
      consumers: yield* Consumers.make({
        url: "amqp://127.0.0.1:1",
        inQueue: "in",
        capacity: 1,
        inbox: new Inbox<Delivery, TransportError>(),
      }),
      confirms: yield* Confirms.make({ outQueue: "out", confirmTimeout: Duration.seconds(10) }),
    }).pipe(Effect.forkScoped)
    const watch = yield* Effect.forkChild(JobMode.failWhenUnreachable(status, timeout))
    return { watch, attempts: () => attempts }
  })

/**
 * Advances the clock by `millis` in steps of 100 ms, a few real turns each, so that every failed
 * attempt (a rejected promise) schedules its backoff before the clock passes it.
 */
const advance = (millis: number) =>
  Effect.gen(function* () {
    for (let elapsed = 0; elapsed < millis; elapsed += 100) {
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 0)))
      yield* TestClock.adjust("100 millis")
    }
  })

/** `WORKER_JOB_CONNECT_TIMEOUT_S` as the settings default it. */
const defaultConnectTimeout = Settings.make({ name: "job", timeout: Duration.minutes(1) }).pipe(
  Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} })),
  Effect.map((settings) => settings.jobConnectTimeout),
  Effect.orDie,
)

describe("JobMode", () => {
  describe("limitIntake", () => {
    it.effect("stops intake once WORKER_JOB_MAX_TASKS deliveries have arrived", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport({ inQueue: "in", outQueue: "out", capacity: 5 })
        for (const body of ["one", "not json at all", "three", "four"]) {
          yield* broker.publish("in", body)
        }
        const job = JobMode.limitIntake(transport, 2)
        const first = yield* job.take
        const second = yield* job.take
        // Every delivery counts, a poison one as much as a task.
        expect(Option.map(first, (d) => textOf(d.body))).toEqual(Option.some("one"))
        expect(Option.map(second, (d) => textOf(d.body))).toEqual(
          Option.some("not json at all"),
        )
        // Intake has stopped with the second: nothing more arrives, the rest stay queued.
        expect(yield* job.take).toEqual(Option.none())
        expect(yield* broker.ready("in")).toBe(2)
        expect(yield* broker.unacked("in")).toBe(2)
        // Those in hand may still be settled.
        yield* Option.getOrThrow(first).ack
        yield* Option.getOrThrow(second).ack
        expect(yield* broker.unacked("in")).toBe(0)
        expect(yield* broker.ready("in")).toBe(2)
      }))

    it.effect("never raises the prefetch above 1, whatever the concurrency becomes", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport({ inQueue: "in", outQueue: "out", capacity: 1 })
        for (const body of ["one", "two", "three"]) yield* broker.publish("in", body)
        const job = JobMode.limitIntake(transport, 10)
        // As `setConcurrency(5)` or an adaptive increase would ask.
        yield* job.setCapacity(5)
        expect(yield* broker.unacked("in")).toBe(1)
        expect(yield* broker.ready("in")).toBe(2)
        // 0 still pauses intake.
        yield* job.setCapacity(0)
        yield* Option.getOrThrow(yield* job.take).ack
        expect(yield* broker.unacked("in")).toBe(0)
        yield* job.setCapacity(3)
        expect(yield* broker.unacked("in")).toBe(1)
      }))

    it.effect("passes the end of intake through without counting it", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport({ inQueue: "in", outQueue: "out", capacity: 1 })
        const job = JobMode.limitIntake(transport, 1)
        yield* transport.stopIntake
        expect(yield* job.take).toEqual(Option.none())
      }))
  })

  describe("countTakenBack and failIfTakenBack", () => {
    it.effect("count the deliveries whose lease is lost unsettled, and only those", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        // A consumer on a connection of its own, which the test loses.
        const connection = yield* Scope.make()
        const transport = yield* broker.transport({ inQueue: "in", outQueue: "out", capacity: 4 })
          .pipe(Scope.provide(connection))
        for (const body of ["acked", "requeued", "released", "held"]) {
          yield* broker.publish("in", body)
        }
        const takenBack = MutableRef.make(0)
        const job = JobMode.countTakenBack(transport, takenBack)
        const [acked, requeued, released, held] = yield* Effect.replicateEffect(
          Effect.map(job.take, Option.getOrThrow),
          4,
        )
        yield* acked!.ack
        yield* requeued!.requeue
        yield* released!.release
        yield* JobMode.failIfTakenBack(takenBack)
        // The connection lost: the broker takes back what the worker still held.
        yield* Scope.close(connection, Exit.void)
        expect(held!.lease.isLost()).toBe(true)
        expect(MutableRef.get(takenBack)).toBe(1)
        const error = yield* Effect.flip(JobMode.failIfTakenBack(takenBack))
        expect(error).toBeInstanceOf(JobMode.TasksTakenBack)
        expect(error.message).toBe(
          "The broker took back 1 task of this job before it settled it (a connection or lease " +
            "lost): its result was thrown away, and it runs again",
        )
        expect(new JobMode.TasksTakenBack({ count: 2 }).message).toContain(
          "2 tasks of this job before it settled them",
        )
        // Back in the queue, as the settled ones that were given back.
        expect(yield* broker.ready("in")).toBe(3)
      }))

    it.effect("count no settled delivery when a channel's leases are lost together, as on RabbitMQ", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make()
        const transport = yield* broker.transport({ inQueue: "in", outQueue: "out", capacity: 2 })
        yield* broker.publish("in", "acked")
        yield* broker.publish("in", "held")
        // RabbitMQ's deliveries of one channel share one loss, which fires for every delivery
        // taken on it, settled or not, when the channel closes.
        const listeners = new Set<(lost: LeaseLost) => void>()
        const shared: typeof transport = {
          ...transport,
          take: Effect.map(
            transport.take,
            Option.map((delivery) => ({
              ...delivery,
              lease: {
                ...delivery.lease,
                onLost: (listener: (lost: LeaseLost) => void) => {
                  listeners.add(listener)
                  return () => void listeners.delete(listener)
                },
              },
            })),
          ),
        }
        const takenBack = MutableRef.make(0)
        const job = JobMode.countTakenBack(shared, takenBack)
        const acked = Option.getOrThrow(yield* job.take)
        yield* Effect.map(job.take, Option.getOrThrow)
        yield* acked.ack
        const closed = new LeaseLost({ reason: "channel_closed" })
        for (const listener of [...listeners]) listener(closed)
        expect(MutableRef.get(takenBack)).toBe(1)
      }))

    it.effect("count a lease that expires", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make({ reapInterval: "100 millis" })
        const transport = yield* broker.transport({
          inQueue: "in",
          outQueue: "out",
          capacity: 1,
          leaseDuration: "1 second",
        })
        yield* broker.publish("in", "held too long")
        const takenBack = MutableRef.make(0)
        yield* JobMode.countTakenBack(transport, takenBack).take
        yield* TestClock.adjust("1100 millis")
        expect(MutableRef.get(takenBack)).toBe(1)
      }))
  })

  describe("awaitIdle", () => {
    it.effect("completes after the timeout with nothing in hand, while connected", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connected")
        const idle = yield* Effect.forkChild(
          JobMode.awaitIdle(Effect.succeed(0), status, Duration.seconds(10)),
        )
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(idle)).toBe(false)
        yield* TestClock.adjust("1 millis")
        yield* Fiber.join(idle)
      }))

    it.effect("counts from the end of the work, never less than the timeout", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connected")
        const inFlight = yield* Ref.make(1)
        const idle = yield* Effect.forkChild(
          JobMode.awaitIdle(Ref.get(inFlight), status, Duration.seconds(10)),
        )
        // The task ends between two polls (they are 250 ms apart).
        yield* TestClock.adjust("1100 millis")
        yield* Ref.set(inFlight, 0)
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(idle)).toBe(false)
        // At most one poll late.
        yield* TestClock.adjust("251 millis")
        expect(yield* isDone(idle)).toBe(true)
      }))

    it.effect("a task in hand is not idleness, however long it runs", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connected")
        const idle = yield* Effect.forkChild(
          JobMode.awaitIdle(Effect.succeed(1), status, Duration.seconds(10)),
        )
        yield* TestClock.adjust("30 seconds")
        expect(yield* isDone(idle)).toBe(false)
        yield* Fiber.interrupt(idle)
      }))

    it.effect("a broker out of reach is not idleness", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("disconnected")
        const idle = yield* Effect.forkChild(
          JobMode.awaitIdle(Effect.succeed(0), status, Duration.seconds(10)),
        )
        yield* TestClock.adjust("20 seconds")
        expect(yield* isDone(idle)).toBe(false)
        yield* SubscriptionRef.set(status, "connected")
        yield* TestClock.adjust("10250 millis")
        expect(yield* isDone(idle)).toBe(true)
      }))
  })

  describe("failWhenUnreachable", () => {
    it.effect("fails once the broker has been out of reach for the timeout", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
        const watch = yield* Effect.forkChild(
          JobMode.failWhenUnreachable(status, Duration.seconds(30)),
        )
        // Effect 4's TestClock waits one scheduler turn for sleeps: the watch's stream starts
        // and reaches its sleep a turn after the fork.
        yield* Effect.yieldNow
        yield* TestClock.adjust("29999 millis")
        expect(yield* isDone(watch)).toBe(false)
        yield* TestClock.adjust("1 millis")
        const error = yield* Effect.flip(Fiber.join(watch))
        expect(error).toBeInstanceOf(JobMode.BrokerUnreachable)
        expect(error.message).toBe("The broker stayed unreachable for 30s: giving up")
      }))

    it.effect("a connection resets the timeout; a loss starts it again", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
        const watch = yield* Effect.forkChild(
          JobMode.failWhenUnreachable(status, Duration.seconds(10)),
        )
        yield* Effect.yieldNow
        yield* TestClock.adjust("9 seconds")
        yield* SubscriptionRef.set(status, "connected")
        yield* TestClock.adjust("1 hour")
        expect(yield* isDone(watch)).toBe(false)
        yield* SubscriptionRef.set(status, "disconnected")
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(watch)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(Exit.isFailure(yield* Fiber.await(watch))).toBe(true)
      }))

    it.effect("a status published again while down (each failed attempt) does not restart it", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
        const watch = yield* Effect.forkChild(
          JobMode.failWhenUnreachable(status, Duration.seconds(10)),
        )
        yield* Effect.yieldNow
        for (const again of ["connecting", "disconnected", "connecting"] as const) {
          yield* TestClock.adjust("3 seconds")
          yield* SubscriptionRef.set(status, again)
        }
        yield* TestClock.adjust("999 millis")
        expect(yield* isDone(watch)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* isDone(watch)).toBe(true)
        expect(Exit.isFailure(yield* Fiber.await(watch))).toBe(true)
      }))

    // The case: reconnecting at most 3 s apart, a job waited for ever.
    for (
      const [name, timeout] of [
        ["the default", defaultConnectTimeout],
        ["7 s, above the reconnect cap", Effect.succeed(Duration.seconds(7))],
      ] as const
    ) {
      it.effect(`gives up on a broker never reached, reconnecting all along: ${name}`, () =>
        Effect.gen(function* () {
          const after = yield* timeout
          const millis = Duration.toMillis(after)
          const { watch, attempts } = yield* unreachableBroker(after)
          yield* advance(millis - 100)
          expect(yield* isDone(watch)).toBe(false)
          // Attempts at most 3 s apart: the loop kept publishing its status through the timeout.
          expect(attempts()).toBeGreaterThanOrEqual(Math.floor(millis / 3000))
          yield* advance(3000)
          expect(yield* isDone(watch)).toBe(true)
          const error = yield* Effect.flip(Fiber.join(watch))
          expect(error.message).toBe(
            `The broker stayed unreachable for ${Duration.format(after)}: giving up`,
          )
        }))
    }

    it.effect("never fails while connected", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connected")
        const watch = yield* Effect.forkChild(
          JobMode.failWhenUnreachable(status, Duration.seconds(10)),
        )
        yield* TestClock.adjust("1 day")
        expect(yield* isDone(watch)).toBe(false)
        yield* Fiber.interrupt(watch)
      }))
  })
})
