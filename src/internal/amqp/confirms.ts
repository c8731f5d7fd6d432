/**
 * Publishing on a connection's confirm channel: a publish completes on the broker's confirm, and
 * fails `nacked`, `returned` (mandatory and unroutable), `closed` (the channel went first) or
 * `timeout` (no confirm in time). This is the publish hot path, measured by `bench/amqp.ts`: the
 * comments below say which shapes it kept, and why.
 */
import { Buffer } from "node:buffer"
import type * as Amqp from "amqplib"
import type * as Scope from "effect/Scope"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { PublishError } from "../../WorkerError.ts"
import { lateness } from "../lateness.ts"

/** What of amqplib's confirm channel a publish uses. */
export type PublishChannel = Pick<Amqp.ConfirmChannel, "publish">

/** A confirm channel to publish on, and the ids of its messages the broker returned. */
export interface Publishing {
  readonly publisher: PublishChannel
  readonly returned: Set<string>
  /**
   * Told when a publish's confirm is overdue: the connection is presumed dead, and given up
   * rather than published on again (a second copy of a message while the first is unconfirmed).
   */
  readonly overdue?: (() => void) | undefined
}

export interface Confirms {
  /** Gathers the ids of the messages a new confirm channel gets back from the broker. */
  readonly track: (
    channel: { on(event: "return", listener: (message: Amqp.Message) => void): unknown },
  ) => Set<string>
  /**
   * Hears why the broker closed a confirm channel: a message past its `max_message_size` teaches
   * the largest it takes, and from then on a larger publish fails `too_large` without being sent.
   */
  readonly refusedWith: (error: unknown) => void
  /**
   * Publishes `body` to the output queue, with `headers` as the message's AMQP headers and
   * `messageId` as its id (else a number of this process's), completing once the broker has
   * confirmed it.
   */
  readonly publish: (
    on: Publishing,
    body: Uint8Array,
    type: string,
    headers?: Readonly<Record<string, string>> | undefined,
    messageId?: string | undefined,
  ) => Effect.Effect<void, PublishError>
  /**
   * {@link publish}'s message sent now; its confirm awaited with the Effect it succeeds with, as
   * many times as asked.
   */
  readonly send: (
    on: Publishing,
    body: Uint8Array,
    type: string,
    headers?: Readonly<Record<string, string>> | undefined,
    messageId?: string | undefined,
  ) => Effect.Effect<Effect.Effect<void, PublishError>>
}

/** A sent message's confirm, awaited any number of times, before or after it comes. */
class Confirm {
  private outcome: Effect.Effect<void, PublishError> | undefined
  private waiters: Array<(outcome: Effect.Effect<void, PublishError>) => void> | undefined

  readonly settle = (failure: PublishError | undefined): void => {
    const outcome = failure === undefined ? Effect.void : Effect.fail(failure)
    this.outcome = outcome
    const waiters = this.waiters
    this.waiters = undefined
    if (waiters !== undefined) { for (const resume of waiters) resume(outcome) }
  }

  readonly await: Effect.Effect<void, PublishError> = Effect.callback((resume) => {
    if (this.outcome !== undefined) return resume(this.outcome)
    ;(this.waiters ??= []).push(resume)
  })
}

// RabbitMQ's refusal of a message past `max_message_size` (a channel error, 406), as amqplib
// reports it: "Channel closed by server: 406 (PRECONDITION-FAILED) with message
// "PRECONDITION_FAILED - message size 20971520 is larger than configured max size 16777216"".
const MAX_SIZE_REFUSAL = /message size \d+ is larger than (?:configured )?max size (\d+)/

/** The largest message the broker takes, from its refusal of a larger one, if `error` is one. */
export const maxSizeOf = (error: unknown): number | undefined => {
  const match = error instanceof Error ? MAX_SIZE_REFUSAL.exec(error.message) : null
  return match === null ? undefined : Number(match[1])
}

interface AwaitingConfirm {
  readonly publishedAt: number
  /** Moved on by the time a blocked event loop held the sweeper (see the sweep). */
  deadline: number
  readonly on: Publishing
  readonly expire: () => void
}

/**
 * A sweep this late was held by a blocked event loop; a shorter lateness is the timer's own jitter,
 * which moves no deadline.
 */
const BLOCK_MILLIS = 1_000

/**
 * How far blocks may move a confirm's deadline in all: a loop blocked longer than two heartbeats
 * (60 s each) has lost the connection anyway, and one blocked most of the time must not keep a
 * publish waiting for ever.
 */
const MAX_BLOCKED_MILLIS = 120_000

/**
 * Publishing to `outQueue`, each publish failed with `timeout` past `confirmTimeout`; its sweeper
 * runs for as long as the scope.
 */
export const make = (options: {
  readonly outQueue: string
  readonly confirmTimeout: Duration.Duration
}): Effect.Effect<Confirms, never, Scope.Scope> =>
  Effect.gen(function* () {
    const outQueue = options.outQueue
    // Publishes waiting for their confirm, failed by one sweeper when past their deadline: a race
    // per publish (Effect.timeout) cost `bench/amqp.ts` much of the raw amqplib loop's throughput.
    // Keyed by the publish's number: a Map's set of a number key measured cheaper than of a
    // string made for each publish (the figures are in `bench/README.md`).
    const awaitingConfirm = new Map<number, AwaitingConfirm>()
    const confirmMillis = Duration.toMillis(options.confirmTimeout)
    const clock = yield* Clock.Clock
    const sweepMillis = Math.min(250, confirmMillis)
    const lateBy = lateness(sweepMillis)
    yield* Effect.sync(() => {
      const now = clock.currentTimeMillisUnsafe()
      // A sweep late by a blocked event loop runs before the confirms that came meanwhile are read
      // from the socket: the block is not the broker's delay, so every deadline moves by it.
      const late = lateBy(now)
      for (const [id, waiting] of awaitingConfirm) {
        if (late >= BLOCK_MILLIS) {
          // A publish made after the block began (synchronously, as it ended) waited less.
          waiting.deadline = Math.min(
            waiting.deadline + Math.min(late, now - waiting.publishedAt),
            waiting.publishedAt + confirmMillis + MAX_BLOCKED_MILLIS,
          )
        }
        if (waiting.deadline > now) continue
        awaitingConfirm.delete(id)
        waiting.on.overdue?.()
        waiting.expire()
      }
    }).pipe(
      Effect.repeat(Schedule.spaced(Duration.millis(sweepMillis))),
      Effect.forkScoped,
    )
    let sequence = 0
    // The largest message the broker takes, once it refused a larger one.
    let maxBytes = Infinity

    const refusedWith: Confirms["refusedWith"] = (error) => {
      const max = maxSizeOf(error)
      if (max !== undefined) maxBytes = max
    }

    const track: Confirms["track"] = (channel) => {
      const returned = new Set<string>()
      channel.on("return", (message) => {
        if (typeof message.properties.messageId === "string") {
          returned.add(message.properties.messageId)
        }
      })
      return returned
    }

    /**
     * Publishes `body` on `on`'s channel now, and calls `done` once with the broker's answer: no
     * failure on its confirm, else why not.
     */
    const start = (
      on: Publishing,
      body: Uint8Array,
      type: string,
      headers: Readonly<Record<string, string>> | undefined,
      stableId: string | undefined,
      done: (failure: PublishError | undefined) => void,
    ): void => {
      if (body.byteLength > maxBytes) {
        return done(new PublishError({ reason: "too_large", messageType: type }))
      }
      const { publisher, returned } = on
      const id = ++sequence
      // A return names the message by its id: the broker returns a message before it confirms
      // it, so a copy's return is read by that copy's confirm.
      const messageId = stableId ?? `${id}`
      const failWith = (reason: PublishError["reason"]) =>
        done(new PublishError({ reason, messageType: type }))
      const publishedAt = clock.currentTimeMillisUnsafe()
      awaitingConfirm.set(id, {
        publishedAt,
        deadline: publishedAt + confirmMillis,
        on,
        expire: () => failWith("timeout"),
      })
      try {
        publisher.publish(
          "",
          outQueue,
          Buffer.from(body.buffer, body.byteOffset, body.byteLength),
          {
            persistent: true,
            contentType: "application/json",
            type,
            mandatory: true,
            messageId,
            headers,
          },
          (error) => {
            if (!awaitingConfirm.delete(id)) {
              return
            }
            if (error) {
              // amqplib fails every confirm still awaited when the channel closes: the broker
              // did not refuse those, unless it closed the channel for a message's size
              // (`refusedWith` heard it first), which the message's own size tells.
              return failWith(
                error.message !== "channel closed"
                  ? "nacked"
                  : body.byteLength > maxBytes
                  ? "too_large"
                  : "closed",
              )
            }
            // Returns are rare: an empty set is not asked, as hashing the new id string for the
            // lookup is a call into the runtime on every confirm.
            if (returned.size !== 0 && returned.delete(messageId)) {
              return failWith("returned")
            }
            done(undefined)
          },
        )
      } catch {
        awaitingConfirm.delete(id)
        failWith("closed")
      }
    }

    // No canceler: an interrupted publish leaves its entry to its confirm or to the sweeper, whose
    // late resume the interrupted fiber ignores. A canceler would wrap every publish in an
    // interruption handler, the costliest steps of a publish.
    const publish: Confirms["publish"] = (on, body, type, headers, stableId) =>
      Effect.callback<void, PublishError>((resume) =>
        start(on, body, type, headers, stableId, (failure) =>
          resume(failure === undefined ? Effect.void : Effect.fail(failure)))
      )

    const send: Confirms["send"] = (on, body, type, headers, stableId) =>
      Effect.sync(() => {
        const confirm = new Confirm()
        start(on, body, type, headers, stableId, confirm.settle)
        return confirm.await
      })

    return { track, refusedWith, publish, send }
  })
