import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Duration, Effect, Fiber, Option } from "effect"
import { TestClock } from "effect/testing"
import * as LeaseRenewal from "../src/LeaseRenewal.ts"
import type { Lease } from "../src/Transport.ts"
import { LeaseLost } from "../src/WorkerError.ts"

/**
 * A lease of `duration` that records when it is renewed and can be made to refuse a renewal;
 * `lost` fires when the test completes the Deferred.
 */
const makeLease = (options: {
  readonly duration?: Duration.Input | undefined
  readonly renewable?: boolean | undefined
} = {}) =>
  Effect.gen(function* () {
    const lost = yield* Deferred.make<LeaseLost>()
    const renewedAt: Array<number> = []
    let refusal: LeaseLost | undefined
    const renew = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      renewedAt.push(now)
      if (refusal !== undefined) return yield* refusal
    })
    const lease: Lease = {
      duration: options.duration === undefined
        ? Option.none()
        : Option.some(Duration.fromInputUnsafe(options.duration)),
      renew: options.renewable === false ? Option.none() : Option.some(renew),
      lost: Deferred.await(lost),
      onLost: (listener) => {
        const watcher = Effect.runFork(Effect.map(Deferred.await(lost), listener))
        return () => watcher.interruptUnsafe(watcher.id)
      },
      isLost: () => Deferred.isDoneUnsafe(lost),
    }
    return {
      lease,
      lost,
      renewedAt,
      refuseNext: (error: LeaseLost) => void (refusal = error),
    }
  })

/** Keeps the lease with renewal timers of its own, on the test's clock. */
const keep = (lease: Lease) =>
  Effect.scoped(Effect.flatMap(LeaseRenewal.make, (renewal) => renewal.keep(lease)))

describe("LeaseRenewal", () => {
  it("renews at two thirds of the duration", () => {
    expect(Duration.toMillis(LeaseRenewal.renewalInterval(Duration.seconds(30)))).toBe(20_000)
    expect(Duration.toMillis(LeaseRenewal.renewalInterval(Duration.minutes(30)))).toBe(1_200_000)
  })

  it.effect("renews when a third of the duration remains: at 20 s, 40 s, 60 s", () =>
    Effect.gen(function* () {
      const { lease, renewedAt } = yield* makeLease({ duration: "30 seconds" })
      const fiber = yield* Effect.forkChild(keep(lease))
      yield* TestClock.adjust("19900 millis")
      expect(renewedAt).toEqual([])
      yield* TestClock.adjust("100 millis")
      expect(renewedAt).toEqual([20_000])
      yield* TestClock.adjust("19900 millis")
      expect(renewedAt).toEqual([20_000])
      yield* TestClock.adjust("100 millis")
      expect(renewedAt).toEqual([20_000, 40_000])
      yield* TestClock.adjust("20 seconds")
      expect(renewedAt).toEqual([20_000, 40_000, 60_000])
      expect(fiber.pollUnsafe() === undefined).toBe(true)
      yield* Fiber.interrupt(fiber)
    }))

  it.effect("is provided by the layer", () =>
    Effect.gen(function* () {
      const { lease, renewedAt } = yield* makeLease({ duration: "3 seconds" })
      const renewal = yield* LeaseRenewal.LeaseRenewal
      const fiber = yield* Effect.forkChild(renewal.keep(lease))
      yield* TestClock.adjust("4 seconds")
      expect(renewedAt).toEqual([2_000, 4_000])
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(LeaseRenewal.layer)))

  describe("a lease that cannot be renewed just waits for lost", () => {
    const cases = [
      { name: "no renew, no duration", duration: undefined, renewable: false },
      { name: "renew without a duration", duration: undefined, renewable: true },
      { name: "a duration without renew", duration: "30 seconds", renewable: false },
    ] as const
    for (const { duration, name, renewable } of cases) {
      it.effect(name, () =>
        Effect.gen(function* () {
          const { lease, lost, renewedAt } = yield* makeLease({ duration, renewable })
          const fiber = yield* Effect.forkChild(keep(lease))
          yield* TestClock.adjust("1 hour")
          expect(fiber.pollUnsafe() === undefined).toBe(true)
          expect(renewedAt).toEqual([])
          const why = new LeaseLost({ reason: "channel_closed" })
          yield* Deferred.succeed(lost, why)
          expect(yield* Fiber.join(fiber)).toBe(why)
        }))
    }
  })

  it.effect("completes with the LeaseLost when the lease is lost, and stops renewing", () =>
    Effect.gen(function* () {
      const { lease, lost, renewedAt } = yield* makeLease({ duration: "30 seconds" })
      const fiber = yield* Effect.forkChild(keep(lease))
      yield* TestClock.adjust("25 seconds")
      expect(fiber.pollUnsafe() === undefined).toBe(true)
      const why = new LeaseLost({ reason: "expired" })
      yield* Deferred.succeed(lost, why)
      expect(yield* Fiber.join(fiber)).toBe(why)
      yield* TestClock.adjust("2 minutes")
      expect(renewedAt).toEqual([20_000])
    }))

  it.effect("completes with the LeaseLost of a refused renewal", () =>
    Effect.gen(function* () {
      const { lease, refuseNext, renewedAt } = yield* makeLease({ duration: "30 seconds" })
      const fiber = yield* Effect.forkChild(keep(lease))
      yield* TestClock.adjust("20 seconds")
      const refusal = new LeaseLost({ reason: "stale" })
      refuseNext(refusal)
      yield* TestClock.adjust("19 seconds")
      expect(fiber.pollUnsafe() === undefined).toBe(true)
      yield* TestClock.adjust("1 second")
      expect(renewedAt).toEqual([20_000, 40_000])
      expect(yield* Fiber.join(fiber)).toBe(refusal)
      yield* TestClock.adjust("2 minutes")
      expect(renewedAt).toEqual([20_000, 40_000])
    }))

  it.effect("stops renewing once interrupted", () =>
    Effect.gen(function* () {
      const { lease, renewedAt } = yield* makeLease({ duration: "30 seconds" })
      const fiber = yield* Effect.forkChild(keep(lease))
      yield* TestClock.adjust("20 seconds")
      expect(renewedAt).toEqual([20_000])
      yield* Fiber.interrupt(fiber)
      yield* TestClock.adjust("2 minutes")
      expect(renewedAt).toEqual([20_000])
    }))
})
