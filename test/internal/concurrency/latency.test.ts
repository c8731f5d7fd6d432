import { describe, expect, it } from "@effect/vitest"
import {
  EPOCH_ROUNDS,
  HOLD_ROUNDS,
  LatencyLimit,
  MIN_ROUND,
} from "../../../src/internal/concurrency/latency.ts"

/** Feeds a round of `millis` latencies at `target`; the target the round calls for. */
const round = (limit: LatencyLimit, target: number, millis: number, busy = true) => {
  const size = Math.max(MIN_ROUND, target)
  for (let i = 1; i < size; i++) expect(limit.sample(millis, target, busy)).toBeUndefined()
  return limit.sample(millis, target, busy)
}

/** A downstream with a knee: `base` ms up to `knee` at once, growing with the square beyond. */
const kneeAt = (knee: number, base = 20) => (running: number) =>
  running <= knee ? base : base * (running / knee) ** 2

describe("LatencyLimit", () => {
  it("a round is the target's tasks, or MIN_ROUND when the target is smaller", () => {
    const limit = new LatencyLimit(0.1)
    expect(round(limit, 3, 20)).toBe(5)
    expect(round(limit, 30, 20)).toBe(45)
  })

  it("raises the target by half until a queue first shows, then by one a round", () => {
    const limit = new LatencyLimit(0.1)
    expect([1, 2, 3, 5, 8].map((target) => round(limit, target, 20 + (target % 2)))).toEqual([
      2,
      3,
      5,
      8,
      12,
    ])
    // 1.5 × the best: a queue, cut in proportion but by a quarter at most (16 × 0.75).
    expect(round(limit, 16, 30)).toBe(12)
    expect(round(limit, 12, 20)).toBe(13)
    expect(round(limit, 13, 20)).toBe(14)
  })

  it("after a probe past the knee, holds the target for HOLD_ROUNDS rounds", () => {
    const limit = new LatencyLimit(0.1)
    expect(round(limit, 10, 20)).toBe(15)
    // The slow start's overshoot: cut, and not held.
    expect(round(limit, 15, 30)).toBe(11)
    expect(round(limit, 11, 20)).toBe(12)
    // The probe by one found a queue: cut, then held.
    expect(round(limit, 12, 30)).toBe(9)
    expect(round(limit, 9, 20)).toBe(9)
    // A queue that stays is cut again at once, the hold going on.
    expect(round(limit, 9, 30)).toBe(6)
    for (let i = 1; i < HOLD_ROUNDS; i++) expect(round(limit, 6, 20)).toBe(6)
    expect(round(limit, 6, 20)).toBe(7)
  })

  it("not busy, a round says nothing of more: the target holds", () => {
    const limit = new LatencyLimit(0.1)
    expect(round(limit, 4, 20, false)).toBe(4)
    expect(round(limit, 4, 20, false)).toBe(4)
  })

  it("a queue showing cuts the target in proportion to the excess, by a quarter at most", () => {
    const limit = new LatencyLimit(0.1)
    expect(round(limit, 10, 20)).toBe(15)
    // 1.145 × the best: 20 × 1.1 / 1.145 = 19.2.
    expect(round(limit, 20, 22.9)).toBe(19)
    // Ten times the best: a quarter off, not nine tenths: one slow round may be noise.
    expect(round(limit, 19, 200)).toBe(14)
  })

  it("settles at the knee of a downstream that slows with the square past it", () => {
    const limit = new LatencyLimit(0.1)
    const latency = kneeAt(16)
    let target = 2
    const seen: Array<number> = []
    for (let i = 0; i < 200; i++) {
      target = round(limit, target, latency(target))!
      if (i >= 100) seen.push(target)
    }
    // At the knee or one past it, never beyond the tolerance's reach (16 × √1.1 < 17), and one
    // past it only for the round of a probe after each hold.
    expect(Math.min(...seen)).toBe(16)
    expect(Math.max(...seen)).toBe(17)
    expect(seen.filter((t) => t === 17).length).toBeLessThanOrEqual(
      Math.ceil(seen.length / (HOLD_ROUNDS + 2)),
    )
  })

  it("a downstream slower for good becomes the new baseline within two epochs", () => {
    const limit = new LatencyLimit(0.1)
    for (let i = 0; i < 5; i++) round(limit, 8, 20)
    // Twice as slow from now on: first read as a queue.
    expect(round(limit, 8, 40)).toBe(6)
    let target = 6
    for (let i = 0; i < 2 * EPOCH_ROUNDS; i++) target = Math.max(1, round(limit, target, 40)!)
    // The new baseline is no queue: the target grows again, one a round.
    expect(round(limit, target, 40)).toBe(target + 1)
  })

  it("a refusal ends the slow start and the round: the refused are not in its latencies", () => {
    const limit = new LatencyLimit(0.1)
    expect(round(limit, 8, 20)).toBe(12)
    for (let i = 0; i < MIN_ROUND - 1; i++) limit.sample(20, 16, true)
    limit.congested()
    expect(round(limit, 12, 20)).toBe(13)
  })

  it("restart drops a round begun under another target", () => {
    const limit = new LatencyLimit(0.1)
    expect(round(limit, 8, 20)).toBe(12)
    for (let i = 0; i < MIN_ROUND - 1; i++) limit.sample(500, 12, true)
    limit.restart()
    // The slow latencies are gone: the next round is only the fast ones.
    expect(round(limit, 12, 20)).toBe(18)
  })
})
