/**
 * One broker connection's life, and the loop that makes the next: connect, open the confirm
 * channel and (unless intake has stopped) the consumer channel, declare both queues, consume up
 * to the capacity, then hold the session until the connection is lost. Closing goes in the order
 * that loses nothing, each step bounded: the consumers cancelled, the consumer channel closed
 * after a synchronous call, the confirms awaited, the connection closed.
 */
import type * as Amqp from "amqplib"
import { Deferred, Duration, Effect, Schedule, SubscriptionRef } from "effect"
import type { Scope } from "effect"
import type { ConnectionStatus } from "../../Transport.ts"
import type { TransportError } from "../../WorkerError.ts"
import { closeStep } from "./closing.ts"
import type { Confirms, PublishChannel } from "./confirms.ts"
import { type ConsumerChannel, type Consumers, consuming } from "./consumers.ts"
import type { Current } from "./current.ts"
import { connectError, declareError, invalidUrl } from "./errors.ts"

/** What of amqplib's channels a session uses, beside publishing and consuming. */
interface SessionChannel {
  on(event: string, listener: (...args: Array<any>) => void): unknown
  assertQueue(queue: string, options?: Amqp.Options.AssertQueue): Promise<unknown>
  checkQueue(queue: string): Promise<Amqp.Replies.AssertQueue>
}

/** The confirm channel, as a session uses it. */
export interface PublisherChannel extends SessionChannel, PublishChannel {
  waitForConfirms(): Promise<void>
}

/** The consumer channel, as a session uses it. */
export interface ConsumerChannelOfSession extends SessionChannel, ConsumerChannel {
  close(): Promise<void>
}

/** What of amqplib's connection (its `ChannelModel`) a session uses. */
export interface Connection {
  on(event: string, listener: (...args: Array<any>) => void): unknown
  close(): Promise<void>
  createConfirmChannel(): Promise<PublisherChannel>
  createChannel(): Promise<ConsumerChannelOfSession>
}

/** A live connection's confirm channel, with the ids of its messages the broker returned. */
export interface Session {
  readonly publisher: PublisherChannel
  readonly returned: Set<string>
}

export interface SessionOptions {
  readonly url: string
  readonly inQueue: string
  readonly outQueue: string
  /** Reconnection backoff: first delay and cap. Defaults 100 ms and 3 s. */
  readonly reconnectBase?: Duration.Input | undefined
  readonly reconnectMax?: Duration.Input | undefined
  /** Opens a connection: amqplib's, or a fake in tests. */
  readonly connect: (url: string) => Promise<Connection>
  /** Holds the session while it is live. */
  readonly current: Current<Session>
  readonly status: SubscriptionRef.SubscriptionRef<ConnectionStatus>
  readonly consumers: Consumers
  readonly confirms: Confirms
}

const declare = (on: SessionChannel, queue: string) =>
  Effect.tryPromise({
    try: () => on.assertQueue(queue, { durable: true }),
    catch: (e) => declareError(e, queue),
  })

/** Connects; closing the connection is the last closing step. */
const connectTo = (options: SessionOptions) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => options.connect(options.url),
      catch: (e) => connectError(e, options.url),
    }),
    (c) => closeStep(Effect.promise(() => c.close().catch(() => undefined))),
  )

/**
 * Every step from here is a round trip to the broker, and amqplib makes one channel's calls one
 * after another: the two channels are opened at once, and each declares its own queue.
 */
const openChannels = (connection: Connection, options: SessionOptions) =>
  Effect.all([
    Effect.tryPromise({
      try: () => connection.createConfirmChannel(),
      catch: (e) => connectError(e, options.url),
    }),
    options.consumers.stopped() ? Effect.succeed(undefined) : Effect.tryPromise({
      try: () => connection.createChannel(),
      catch: (e) => connectError(e, options.url),
    }),
  ], { concurrency: "unbounded" })

/**
 * Declares the queues (the output queue on the confirm channel, at once), then consumes up to the
 * capacity. A refused declaration closes its channel, and is a configuration error.
 */
const consumeOn = (
  channel: ConsumerChannelOfSession,
  declaringOut: Effect.Effect<unknown, TransportError>,
  ended: Deferred.Deferred<void>,
  options: SessionOptions,
): Effect.Effect<void, TransportError, Scope.Scope> =>
  Effect.gen(function* () {
    const { consumers, inQueue } = options
    const target = consuming(channel, ended)
    channel.on("error", () => {})
    channel.on("close", () => {
      target.leases.lose("channel_closed")
      Deferred.doneUnsafe(ended, Effect.void)
    })
    consumers.attach(target)
    // Runs after the cancel below. amqplib writes the connection's Close ahead of channel frames
    // still buffered, so acks sent last would be dropped with the connection: a synchronous call
    // on this channel answers only after the broker has read them, then the channel is closed
    // before the connection.
    yield* Effect.addFinalizer(() =>
      closeStep(Effect.promise(() =>
        channel.checkQueue(inQueue).then(() => channel.close()).catch(() => undefined)
      ))
    )
    yield* Effect.addFinalizer(() =>
      consumers.cancelAll.pipe(
        Effect.andThen(Effect.sync(() =>
          target.leases.lose("channel_closed")
        )),
      )
    )
    yield* Effect.all([declaringOut, declare(channel, inQueue)], {
      concurrency: "unbounded",
      discard: true,
    })
    yield* consumers.fill(target)
  })

/** One connection's life: returns when the connection is lost. */
const session = (options: SessionOptions): Effect.Effect<void, TransportError> =>
  Effect.gen(function* () {
    const connection = yield* connectTo(options)
    const ended = yield* Deferred.make<void>()
    connection.on("error", () => {})
    connection.on("close", () => Deferred.doneUnsafe(ended, Effect.void))
    const [publisher, channel] = yield* openChannels(connection, options)
    const returned = options.confirms.track(publisher)
    publisher.on("error", () => {})
    publisher.on("close", () => Deferred.doneUnsafe(ended, Effect.void))
    yield* Effect.addFinalizer(() =>
      closeStep(Effect.promise(() => publisher.waitForConfirms().catch(() => undefined)))
    )
    const declaringOut = declare(publisher, options.outQueue)
    if (channel === undefined) {
      yield* declare(publisher, options.inQueue)
      yield* declaringOut
    } else {
      yield* consumeOn(channel, declaringOut, ended, options)
    }
    options.current.set({ publisher, returned })
    yield* SubscriptionRef.set(options.status, "connected")
    yield* Deferred.await(ended)
    yield* Effect.logWarning("The broker connection was lost: reconnecting")
  }).pipe(
    Effect.ensuring(
      Effect.andThen(
        Effect.sync(() => {
          options.consumers.detach()
          options.current.clear()
        }),
        SubscriptionRef.update(options.status, (s) => (s === "closed" ? s : "disconnected")),
      ),
    ),
    Effect.scoped,
  )

/**
 * Sessions one after another for as long as it runs, reconnecting with capped, jittered
 * exponential backoff. Fails only with a configuration error (a broker URL that cannot work,
 * refused credentials or vhost, a conflicting queue), which retrying cannot help.
 */
export const run = (options: SessionOptions): Effect.Effect<never, TransportError> => {
  const invalid = invalidUrl(options.url)
  if (invalid !== undefined) return Effect.fail(invalid)
  const backoff = Schedule.min([
    Schedule.jittered(Schedule.exponential(options.reconnectBase ?? Duration.millis(100))),
    Schedule.spaced(options.reconnectMax ?? Duration.seconds(3)),
  ])
  return session(options).pipe(
    Effect.tapError((error) =>
      error.isConfiguration
        ? Effect.void
        : Effect.logWarning(`Broker connection attempt failed: ${error.message}`)
    ),
    Effect.retry({ schedule: backoff, while: (error) => !error.isConfiguration }),
    Effect.forever,
  )
}
