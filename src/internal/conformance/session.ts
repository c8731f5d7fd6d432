/**
 * The kit's side of the broker: amqplib, directly, and nothing of the engine's transport. It
 * reads the output queue from before its first publish, publishes the battery, waits until every
 * case has concluded and the queue has been quiet a while, then looks at the input queue.
 */
import type * as Amqp from "amqplib"
import { connect } from "amqplib"
import { Buffer } from "node:buffer"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { ConformanceError } from "../../WorkerError.ts"
import type { Case } from "./battery.ts"
import { read, type Reading, type Received } from "./reading.ts"
import type { Observed } from "./rules.ts"

export interface SessionOptions {
  readonly brokerUrl: string
  readonly inQueue: string
  readonly outQueue: string
  /** How long to wait for the last case to conclude. */
  readonly deadlineMs: number
  /** How long the output queue must stay quiet after the last conclusion: copies come late. */
  readonly quietMs: number
  /** The input queue's unacked deliveries, where the broker tells them (not over AMQP). */
  readonly unacked: (() => Promise<number>) | undefined
  readonly log: (line: string) => void
}

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

const failWith = (what: string) => (e: unknown) =>
  new ConformanceError({ message: `${what}: ${messageOf(e)}` })

/** The queue's counts, on a channel of its own: a missing queue closes the channel that asks. */
const countsOf = (connection: Amqp.ChannelModel, queue: string) =>
  Effect.tryPromise({
    try: async () => {
      const channel = await connection.createChannel()
      channel.on("error", () => {})
      const counts = await channel.checkQueue(queue)
      await channel.close()
      return counts
    },
    catch: failWith(
      `The queue ${queue} is not there (is the worker running, and its queues declared?)`,
    ),
  })

const connection = (url: string) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => connect(url, { timeout: 10_000 }),
      catch: failWith("Could not connect to the broker"),
    }),
    (c) => Effect.promise(() => c.close().catch(() => undefined)),
  )

/** Reads the output queue into `readings`, from now on. */
const readOutput = (c: Amqp.ChannelModel, queue: string, readings: Array<Reading>) =>
  Effect.tryPromise({
    try: async () => {
      const channel = await c.createChannel()
      await channel.consume(queue, (message) => {
        if (message === null) return
        const received: Received = {
          bytes: new Uint8Array(message.content),
          properties: message.properties,
          at: Date.now(),
        }
        readings.push(read(received))
        channel.ack(message)
      })
    },
    catch: failWith(`Could not read ${queue}`),
  })

const publishAll = (c: Amqp.ChannelModel, queue: string, cases: ReadonlyArray<Case>) =>
  Effect.tryPromise({
    try: async () => {
      const channel = await c.createConfirmChannel()
      for (const item of cases) {
        channel.sendToQueue(queue, Buffer.from(item.bytes), {
          persistent: true,
          contentType: "application/json",
        })
      }
      await channel.waitForConfirms()
      await channel.close()
    },
    catch: failWith(`Could not publish to ${queue}`),
  })

/** Whether every case that must conclude has a terminal message. */
const allConcluded = (cases: ReadonlyArray<Case>, readings: ReadonlyArray<Reading>) => {
  const concluded = new Set(
    readings.filter((r) => r.type === "success" || r.type === "failure").map((r) => r.taskId),
  )
  return cases.every((c) => c.expect.kind === "poison" || concluded.has(c.taskId))
}

/** Polls until `done` holds or `deadlineMs` has passed. */
const waitUntil = (done: (now: number) => boolean, deadlineMs: number) =>
  Effect.gen(function* () {
    const until = (yield* Clock.currentTimeMillis) + deadlineMs
    for (;;) {
      const now = yield* Clock.currentTimeMillis
      if (done(now) || now >= until) return
      yield* Effect.sleep(100)
    }
  })

/**
 * The unacked count once it has settled at 0, or as it stands after 12 s: the broker's figures
 * lag (a quorum queue's by its statistics interval, 5 s by default). An observer that cannot
 * answer leaves the count unobserved, saying why.
 */
const settledUnacked = (observer: () => Promise<number>) =>
  Effect.gen(function* () {
    const ask: Effect.Effect<number | { readonly unobserved: string }> = Effect.tryPromise(observer)
      .pipe(
        Effect.catch((e) =>
          Effect.succeed({ unobserved: `the unacked count could not be read: ${messageOf(e)}` })
        ),
      )
    let count = yield* ask
    for (let tries = 0; tries < 12 && typeof count === "number" && count > 0; tries++) {
      yield* Effect.sleep(1000)
      count = yield* ask
    }
    return count
  })

/** Runs `cases` against the service of `options`: what the kit observed. */
export const observe = (
  cases: ReadonlyArray<Case>,
  options: SessionOptions,
): Effect.Effect<Observed, ConformanceError> =>
  Effect.scoped(Effect.gen(function* () {
    const c = yield* connection(options.brokerUrl)
    c.on("error", () => {})
    const input = yield* countsOf(c, options.inQueue)
    const out = yield* countsOf(c, options.outQueue)
    const refusal = input.consumerCount === 0
      ? `${options.inQueue} has no consumer: is the worker running?`
      : out.consumerCount > 0
      ? `${options.outQueue} has ${out.consumerCount} consumer(s): the kit must read it alone ` +
        "(stop the platform's listener for the run)"
      : out.messageCount > 0
      ? `${options.outQueue} holds ${out.messageCount} message(s) already: drain it first, so ` +
        "that what the kit reads is the battery's"
      : undefined
    if (refusal !== undefined) return yield* new ConformanceError({ message: refusal })
    const readings: Array<Reading> = []
    yield* readOutput(c, options.outQueue, readings)
    yield* publishAll(c, options.inQueue, cases)
    options.log(
      `published ${cases.length} envelopes to ${options.inQueue}; reading ${options.outQueue}`,
    )
    yield* waitUntil(() => allConcluded(cases, readings), options.deadlineMs)
    // Then quiet for a while: a second terminal message, or a message for a poison case, comes late.
    yield* waitUntil(
      (now) => now - (readings.at(-1)?.received.at ?? 0) >= options.quietMs,
      options.deadlineMs,
    )
    const left = yield* countsOf(c, options.inQueue)
    const unacked = options.unacked === undefined
      ? {
        unobserved:
          "no management API or rabbitmqctl speaks for this broker (--management, --rabbitmqctl)",
      }
      : yield* settledUnacked(options.unacked)
    return { readings: [...readings], ready: left.messageCount, unacked }
  }))
