/**
 * The latency-based adaptive limit (`Concurrency.adaptive({ by: "latency" })`), after TCP Vegas
 * and Netflix's concurrency-limits: the handler's latency is read in rounds of at least
 * {@link MIN_ROUND} tasks (and at least the target: one round is about one task's time for
 * every slot); a round whose average latency holds within `tolerance` of the best round recently
 * seen (the latency with no queue in front of the downstream) raises the target, if the worker
 * was using most of it: by half until a queue first shows (as TCP's slow start), then by one; a
 * round past it shows a queue, and the target falls in proportion to the excess, by a quarter at
 * most (one slow round may be noise; a queue that stays is cut again a round later). A raise by
 * one that a cut follows was a probe past the knee: the target then holds for
 * {@link HOLD_ROUNDS} rounds before it probes again, as each probe past a sharp knee is a round
 * of queueing (probing every other round kept the latency 7% above the knee's:
 * `bench/adaptive.ts`); any other cut (noise, a downstream slowing) adds no hold, so the target
 * climbs back at once. No error is needed: the limit settles at the knee, where more tasks at
 * once only wait longer. Pure, and tested with sequences of latencies.
 */

/** The fewest latencies a round averages: fewer would read one slow task as a queue. */
export const MIN_ROUND = 8

/**
 * Rounds per epoch of the baseline: the best round of this epoch and the last one, so that a
 * downstream that got slower for good is the new baseline within two epochs.
 */
export const EPOCH_ROUNDS = 50

/** The least one round leaves of the target: one slow round may be noise. */
const MAX_CUT = 0.75

/** The rounds a target holds, after a probe past the knee, before it is raised again. */
export const HOLD_ROUNDS = 8

export class LatencyLimit {
  private count = 0
  private sum = 0
  private busy = 0
  private rounds = 0
  private epochBest = Number.POSITIVE_INFINITY
  private lastEpochBest = Number.POSITIVE_INFINITY
  /** Until a queue first shows, the target grows by half a round. */
  private slowStart = true
  /** Whether the last round raised the target by one: a probe for more. */
  private probed = false
  /** Rounds left before the target may be raised again, after a probe past the knee. */
  private holding = 0

  private readonly tolerance: number

  constructor(tolerance: number) {
    this.tolerance = tolerance
  }

  /**
   * Records one task's latency (ms) under `target`; at the end of a round, the target the round
   * calls for (which may be `target`), else `undefined`. `busy`: whether the worker was using
   * most of its target as the task ended; a round mostly not busy says nothing of more.
   */
  sample(millis: number, target: number, busy: boolean): number | undefined {
    this.count += 1
    this.sum += millis
    if (busy) this.busy += 1
    if (this.count < Math.max(MIN_ROUND, target)) return undefined
    const average = this.sum / this.count
    const wasBusy = 2 * this.busy >= this.count
    this.restart()
    this.epochBest = Math.min(this.epochBest, average)
    this.rounds += 1
    const baseline = Math.min(this.epochBest, this.lastEpochBest)
    if (this.rounds % EPOCH_ROUNDS === 0) {
      this.lastEpochBest = this.epochBest
      this.epochBest = Number.POSITIVE_INFINITY
    }
    const ratio = average / baseline
    const probed = this.probed
    this.probed = false
    if (ratio <= 1 + this.tolerance) {
      if (this.holding > 0) {
        this.holding -= 1
        return target
      }
      if (!wasBusy) return target
      if (this.slowStart) return Math.ceil(1.5 * target)
      this.probed = true
      return target + 1
    }
    this.slowStart = false
    // A cut while the target holds leaves the rest of the hold as it was.
    if (probed) this.holding = HOLD_ROUNDS
    return Math.floor(target * Math.max(MAX_CUT, (1 + this.tolerance) / ratio))
  }

  /**
   * The downstream refused a task (`RetryableError({ congestion: true })`, which decreases the
   * target on its own): a queue has shown, and the latencies of this round, the refused left out,
   * would understate it.
   */
  congested(): void {
    this.slowStart = false
    this.restart()
  }

  /** Starts a new round: the latencies so far measured another target. */
  restart(): void {
    this.count = 0
    this.sum = 0
    this.busy = 0
  }
}
