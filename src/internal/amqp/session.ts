/**
 * One broker connection's life, and the loop that makes the next: connect (to the next of the
 * cluster's nodes, with the heartbeat asked), open the confirm channel and (unless intake has
 * stopped) the consumer channel, declare both queues, consume up to the capacity, then hold the
 * session until the connection is lost. Closing goes in the order
 * that loses nothing, each step bounded: the consumers cancelled, the consumer channel closed
 * after a synchronous call, the confirms awaited, the connection closed.
 */
import type * as Amqp from "amqplib"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Random from "effect/Random"
import * as Schedule from "effect/Schedule"
import * as SubscriptionRef from "effect/SubscriptionRef"
import type * as Scope from "effect/Scope"
import { type ConnectionStatus, isLive } from "../../Transport.ts"
import type { TransportError } from "../../WorkerError.ts"
import { closeStep } from "./closing.ts"
import type { Confirms, PublishChannel } from "./confirms.ts"
import { type ConsumerChannel, type Consumers, type Consuming, consuming } from "./consumers.ts"
import type { Current } from "./current.ts"
import { destroySocket, hearing } from "./connect.ts"
import { connectError, declareError, invalidUrl, messageOf, redactUrl } from "./errors.ts"
import { lateness } from "../lateness.ts"
import { brokerUrls } from "./url.ts"

/** What of amqplib's channels a session uses, beside publishing and consuming. */
interface SessionChannel {
  on(event: string, listener: (...args: Array<any>) => void): unknown
  assertQueue(queue: string, options?: Amqp.Options.AssertQueue): Promise<unknown>
  checkQueue(queue: string): Promise<Amqp.Replies.AssertQueue>
}

/** The confirm channel, as a session uses it. */
export interface PublisherChannel extends SessionChannel, PublishChannel {
  waitForConfirms(): Promise<void>
  close(): Promise<void>
}

/** The consumer channel, as a session uses it. */
export interface ConsumerChannelOfSession extends SessionChannel, ConsumerChannel {
  close(): Promise<void>
}

/** What of amqplib's connection (its `ChannelModel`) a session uses. */
export interface Connection {
  /** amqplib's own connection: what the broker said of itself (its version) as it connected. */
  readonly connection?: { readonly serverProperties?: Readonly<Record<string, unknown>> }
  on(event: string, listener: (...args: Array<any>) => void): unknown
  close(): Promise<void>
  createConfirmChannel(): Promise<PublisherChannel>
  createChannel(): Promise<ConsumerChannelOfSession>
}

/** A live connection's confirm channel, with the ids of its messages the broker returned. */
export interface Session {
  readonly publisher: PublisherChannel
  readonly returned: Set<string>
  /** A publish's confirm is overdue: the connection is given up, unless the broker blocks it. */
  readonly overdue: () => void
  /** The node's URL, its password redacted. */
  readonly node: string
}

export interface SessionOptions {
  /** One URL, or the URLs of a cluster's nodes separated by commas (see `brokerUrls`). */
  readonly url: string
  /** The AMQP heartbeat asked of the broker, in seconds, unless the URL asks its own. */
  readonly heartbeatSeconds?: number | undefined
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

/** Why a connection or one of its channels closed: amqplib's error, if it gave one. */
const causeOf = (error: unknown): string =>
  error === undefined || error === null ? "closed" : messageOf(error)

const declare = (on: SessionChannel, queue: string) =>
  Effect.tryPromise({
    try: () => on.assertQueue(queue, { durable: true }),
    catch: (e) => declareError(e, queue),
  })

/**
 * `url` with the heartbeat asked in its query, unless it asks one itself: amqplib reads the
 * heartbeat of a URL from its query only.
 */
export const withHeartbeat = (url: string, seconds: number | undefined): string => {
  if (seconds === undefined || new URL(url).searchParams.has("heartbeat")) return url
  return `${url}${url.includes("?") ? "&" : "?"}heartbeat=${seconds}`
}

/** Connects to `url`; closing the connection is the last closing step. */
const connectTo = (options: SessionOptions, url: string) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => options.connect(withHeartbeat(url, options.heartbeatSeconds)),
      catch: (e) => connectError(e, url),
    }),
    (c) => closeStep(Effect.promise(() => c.close().catch(() => undefined))),
  )

/**
 * Every step from here is a round trip to the broker, and amqplib makes one channel's calls one
 * after another: the two channels are opened at once, and each declares its own queue.
 */
const openChannels = (connection: Connection, options: SessionOptions, url: string) =>
  Effect.all([
    Effect.tryPromise({
      try: () => connection.createConfirmChannel(),
      catch: (e) => connectError(e, url),
    }),
    options.consumers.stopped() ? Effect.succeed(undefined) : Effect.tryPromise({
      try: () => connection.createChannel(),
      catch: (e) => connectError(e, url),
    }),
  ], { concurrency: "unbounded" })

/**
 * Attaches the consumer channel and declares the queues (the output queue on the confirm channel,
 * at once); the consumers it fills are its target. A refused declaration closes its channel, and
 * is a configuration error.
 */
const consumeOn = (
  channel: ConsumerChannelOfSession,
  declaringOut: Effect.Effect<unknown, TransportError>,
  ended: Deferred.Deferred<string>,
  options: SessionOptions,
  brokerVersion: string | undefined,
): Effect.Effect<Consuming, TransportError, Scope.Scope> =>
  Effect.gen(function* () {
    const { consumers, inQueue } = options
    const target = consuming(channel, ended, brokerVersion)
    channel.on("error", () => {})
    channel.on("close", (error?: unknown) => {
      target.leases.lose("channel_closed")
      Deferred.doneUnsafe(ended, Effect.succeed(causeOf(error)))
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
    return target
  })

/** What the session lines say: whether there are nodes to choose from, when the last was lost. */
interface Losses {
  readonly severalNodes: boolean
  lostAt: number | undefined
}

/**
 * What keeps a live connection from serving, each its own state while it lasts: the broker's
 * resource alarm (`blocked`), then a broker not heard from (`stalled`). Readiness fails on either.
 */
interface Troubles {
  blocked: boolean
  silent: boolean
}

const liveStatus = (troubles: Troubles): ConnectionStatus =>
  troubles.blocked ? "blocked" : troubles.silent ? "stalled" : "connected"

/** Shows the live connection's troubles, unless it is no longer live (lost, or closed). */
const showTroubles = (status: SubscriptionRef.SubscriptionRef<ConnectionStatus>, t: Troubles) =>
  SubscriptionRef.update(status, (s) => (isLive(s) ? liveStatus(t) : s))

/**
 * The broker's resource alarm (memory, disk): it stops reading publishes and says so
 * (`connection.blocked`), its own state, logged as such rather than read as a refusing queue.
 */
const watchBlocking = (
  connection: Connection,
  node: string,
  troubles: Troubles,
  show: Effect.Effect<void>,
) =>
  Effect.gen(function* () {
    const run = Effect.runForkWith(yield* Effect.context<never>())
    connection.on("blocked", (reason: unknown) => {
      troubles.blocked = true
      run(Effect.andThen(
        show,
        Effect.logWarning(
          `The broker at ${node} blocks publishing, a resource alarm (${
            String(reason)
          }): publishes wait until it ends`,
        ),
      ))
    })
    connection.on("unblocked", () => {
      troubles.blocked = false
      run(Effect.andThen(
        show,
        Effect.logInfo(`The broker at ${node} takes publishes again: its resource alarm ended`),
      ))
    })
  })

/**
 * A broker with nothing else to send sends a heartbeat every half of one: no byte for a whole
 * heartbeat means one is overdue, and the connection is `stalled` from then until a byte comes or
 * amqplib gives the connection up, two to three heartbeats in. Read from the socket's byte count,
 * a quarter of a heartbeat apart: nothing on the path of each frame. Time the event loop was
 * blocked is not counted as silence.
 */
const watchSilence = (
  connection: Connection,
  node: string,
  troubles: Troubles,
  show: Effect.Effect<void>,
) => {
  const heard = hearing(connection)
  if (heard === undefined) {
    return Effect.logWarning(
      "amqplib's connection is not of the shape known (its socket, its heartbeat): a silent broker is seen only once amqplib gives it up",
    )
  }
  if (heard.heartbeatSeconds === 0) return Effect.void
  const limit = heard.heartbeatSeconds * 1000
  const lateBy = lateness(limit / 4)
  let bytes = heard.bytesRead()
  let heardAt: number | undefined
  const check = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    // A check late by a blocked event loop runs before the bytes that came meanwhile are read:
    // the block is not the broker's silence, so it does not count.
    const late = lateBy(now)
    if (heardAt !== undefined) heardAt += late
    const read = heard.bytesRead()
    if (heardAt === undefined || read !== bytes) {
      bytes = read
      heardAt = now
    }
    const silent = now - heardAt > limit
    if (silent === troubles.silent) return Effect.void
    troubles.silent = silent
    return Effect.andThen(
      show,
      silent
        ? Effect.logWarning(
          `No byte from the broker at ${node} for ${heard.heartbeatSeconds} s: a heartbeat is overdue`,
        )
        : Effect.logInfo(`The broker at ${node} is heard from again`),
    )
  })
  return Effect.asVoid(
    Effect.forkScoped(Effect.repeat(check, Schedule.spaced(Duration.millis(limit / 4)))),
  )
}

/** What a connection's confirm channel needs of its session. */
interface PublishingOptions {
  readonly options: SessionOptions
  readonly overdue: () => void
  readonly node: string
  /** Gives the connection up. */
  readonly lose: (error?: unknown) => void
  /**
   * Whether the session serves: connected, its queues declared, not yet lost, given up or
   * closing. A confirm channel closed at any other time is not replaced.
   */
  readonly serving: () => boolean
}

/** The longest a new confirm channel may take to open: past it, the connection is given up. */
const REOPEN_TIMEOUT = Duration.seconds(10)

/**
 * The connection's confirm channel, replaced when the broker closes it alone: a publish the
 * broker refuses (a message past its `max_message_size`, RabbitMQ 4's 16 MiB) closes only the
 * channel it came on, and the consumer channel's deliveries keep their leases. The publishes
 * awaiting a confirm on the closed channel fail `closed` (or `too_large`, `confirms.ts`) and are
 * tried again on the next. A close with no error of its own (the connection's) gives the
 * connection up, as does a channel that cannot be opened again.
 */
const publishingOn = (connection: Connection, first: PublisherChannel, on: PublishingOptions) =>
  Effect.gen(function* () {
    const { options, node } = on
    const run = yield* FiberSet.runtime(yield* FiberSet.make<void, never>())<never>()
    // A channel opened while the session stopped serving is closed, not taken.
    const adopt = (next: PublisherChannel, why: string) =>
      Effect.suspend(() => {
        if (!on.serving()) {
          return Effect.promise(() => next.close().catch(() => undefined))
        }
        current = watch(next)
        options.current.set(current)
        return Effect.logWarning(
          `The broker at ${node} closed the publishing channel (${why}): ` +
            "publishing goes on, on a new one",
        )
      })
    const reopen = (why: string) =>
      Effect.tryPromise(() => connection.createConfirmChannel()).pipe(
        Effect.timeout(REOPEN_TIMEOUT),
        Effect.matchEffect({
          onFailure: (error) => Effect.sync(() => on.lose(error)),
          onSuccess: (next) => {
            next.on("error", () => {})
            return adopt(next, why)
          },
        }),
      )
    const watch = (publisher: PublisherChannel): Session => {
      let refusal: unknown
      publisher.on("error", (error: unknown) => {
        refusal = error
        options.confirms.refusedWith(error)
      })
      publisher.on("close", () => {
        if (refusal === undefined || !on.serving()) return on.lose()
        options.current.clear()
        run(reopen(messageOf(refusal)))
      })
      const returned = options.confirms.track(publisher)
      return { publisher, returned, overdue: on.overdue, node }
    }
    let current = watch(first)
    yield* Effect.addFinalizer(() =>
      closeStep(Effect.promise(() => current.publisher.waitForConfirms().catch(() => undefined)))
    )
    return { session: () => current }
  })

/** One connection's life, to `url`: returns when the connection is lost. */
const session = (
  options: SessionOptions,
  url: string,
  losses: Losses,
): Effect.Effect<void, TransportError> => {
  // Serving from its queues' declaration until it ends, whatever ends it (a loss, a failure, an
  // interruption): only then is a confirm channel the broker closed replaced.
  const life = { serving: false }
  return Effect.gen(function* () {
    const connection = yield* connectTo(options, url)
    const ended = yield* Deferred.make<string>()
    // amqplib emits the connection's error (a heartbeat timeout, the broker's close) before it
    // closes the channels, whose close carries none: the connection's is the cause.
    let failed: unknown
    const lose = (error?: unknown) =>
      Deferred.doneUnsafe(ended, Effect.succeed(causeOf(failed ?? error)))
    connection.on("error", (error: unknown) => (failed ??= error))
    connection.on("close", lose)
    const node = redactUrl(url)
    const troubles: Troubles = { blocked: false, silent: false }
    const show = showTroubles(options.status, troubles)
    yield* watchBlocking(connection, node, troubles, show)
    // Published again on this channel, a message whose confirm is overdue could arrive twice: the
    // connection is presumed dead and given up (the broker requeues what it held), unless the
    // broker said it blocks publishing, which only its alarm's end cures.
    // Once per connection: the confirms overdue together each tell it.
    const overdue = () => {
      if (troubles.blocked || failed !== undefined) return
      failed = new Error("a publish's confirm was overdue, so the connection was given up")
      if (!destroySocket(connection, failed as Error)) lose()
    }
    const [first, channel] = yield* openChannels(connection, options, url)
    const publishing = yield* publishingOn(connection, first, {
      options,
      overdue,
      node,
      lose,
      serving: () => life.serving && failed === undefined && !Deferred.isDoneUnsafe(ended),
    })
    const declaringOut = declare(first, options.outQueue)
    let target: Consuming | undefined
    if (channel === undefined) {
      yield* declare(first, options.inQueue)
      yield* declaringOut
    } else {
      const version = connection.connection?.serverProperties?.version
      target = yield* consumeOn(
        channel,
        declaringOut,
        ended,
        options,
        typeof version === "string" ? version : undefined,
      )
    }
    // Serving before the first delivery can come: a task taken at once publishes `started` on
    // this session, where it would otherwise find none and be held a backoff.
    options.current.set(publishing.session())
    life.serving = true
    if (target !== undefined) yield* options.consumers.fill(target)
    yield* SubscriptionRef.update(
      options.status,
      (s) => (s === "closed" ? s : liveStatus(troubles)),
    )
    yield* watchSilence(connection, node, troubles, show)
    const now = yield* Clock.currentTimeMillis
    if (losses.lostAt === undefined) {
      // The startup line names the broker's URL: with several nodes, this one says which.
      const line = `Connected to the broker at ${node}`
      yield* losses.severalNodes ? Effect.logInfo(line) : Effect.logDebug(line)
    } else {
      const seconds = ((now - losses.lostAt) / 1000).toFixed(1)
      yield* Effect.logInfo(
        `Connected to the broker again, at ${node}, ${seconds} s after the loss`,
      )
    }
    const cause = yield* Deferred.await(ended)
    losses.lostAt = yield* Clock.currentTimeMillis
    yield* Effect.logWarning(`The broker connection to ${node} was lost (${cause}): reconnecting`)
  }).pipe(
    Effect.ensuring(
      Effect.andThen(
        Effect.sync(() => {
          life.serving = false
          options.consumers.detach()
          options.current.clear()
        }),
        // A failed attempt leaves the status as it was, unpublished: `connecting` until the first
        // connection. Published again, it read to its watchers as a new outage.
        SubscriptionRef.updateSome(
          options.status,
          (s) => (isLive(s) ? Option.some("disconnected") : Option.none()),
        ),
      ),
    ),
    Effect.scoped,
  )
}

/**
 * Sessions one after another for as long as it runs, reconnecting with capped, jittered
 * exponential backoff, each to the next of the URL's nodes (in an order shuffled once, so that a
 * cluster's workers spread over its nodes): a node that is down, or the one just lost, is left
 * at once. Fails only with a configuration error (a broker URL that cannot work, refused
 * credentials or vhost, a conflicting queue), which retrying cannot help.
 */
export const run = (options: SessionOptions): Effect.Effect<never, TransportError> => {
  const invalid = invalidUrl(options.url)
  if (invalid !== undefined) return Effect.fail(invalid)
  const backoff = Schedule.min([
    Schedule.jittered(Schedule.exponential(options.reconnectBase ?? Duration.millis(100))),
    Schedule.spaced(options.reconnectMax ?? Duration.seconds(3)),
  ])
  return Effect.flatMap(Random.shuffle(brokerUrls(options.url)), (urls) => {
    const losses: Losses = { severalNodes: urls.length > 1, lostAt: undefined }
    let attempt = 0
    return Effect.suspend(() => session(options, urls[attempt++ % urls.length]!, losses)).pipe(
      Effect.tapError((error) =>
        error.isConfiguration
          ? Effect.void
          : Effect.logWarning(`Broker connection attempt failed: ${error.message}`)
      ),
      Effect.retry({ schedule: backoff, while: (error) => !error.isConfiguration }),
      Effect.forever,
    )
  })
}
