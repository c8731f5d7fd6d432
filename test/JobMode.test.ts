import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Option, Ref, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import * as JobMode from "../src/JobMode.ts"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import type { ConnectionStatus } from "../src/Transport.ts"

const isDone = <A, E>(fiber: Fiber.Fiber<A, E>) =>
  Effect.sync(() => fiber.pollUnsafe() !== undefined)

const decoder = new TextDecoder()

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
        expect(Option.map(first, (d) => decoder.decode(d.body))).toEqual(Option.some("one"))
        expect(Option.map(second, (d) => decoder.decode(d.body))).toEqual(
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
