/**
 * The RabbitMQ transport, on amqplib: a confirm channel for publishing, a consumer channel with
 * manual acks and prefetch, quorum `x-delivery-count` (or the classic redelivered flag), leases
 * that die with their channel, a lossless close, and reconnection with capped, jittered
 * exponential backoff.
 *
 * @since 0.1.0
 */
import { Buffer } from "node:buffer"
import type * as Amqp from "amqplib"
import { connect } from "amqplib"
import type { Scope } from "effect"
import {
  Deferred,
  Duration,
  Effect,
  Layer,
  Option,
  Redacted,
  Ref,
  Schedule,
  SubscriptionRef,
} from "effect"
import { Inbox } from "./internal/inbox.ts"
import { LeaseLoss } from "./internal/leaseLoss.ts"
import { Settings } from "./Settings.ts"
import {
  type ConnectionStatus,
  type Delivery,
  type Lease,
  Redeliveries,
  Transport,
} from "./Transport.ts"
import { LeaseLost, PublishError, TransportError } from "./WorkerError.ts"

/**
 * Options of the RabbitMQ transport.
 *
 * @since 0.1.0
 * @category models
 */
export interface AmqpTransportOptions {
  /** `amqp://` or `amqps://`, with the vhost and `heartbeat` query. Redacted: it holds the password. */
  readonly url: Redacted.Redacted<string>
  readonly inQueue: string
  readonly outQueue: string
  /** The prefetch: unsettled deliveries at most. */
  readonly capacity: number
  /** The longest a publish waits for the broker's confirm. Default 10 s. */
  readonly confirmTimeout?: Duration.DurationInput | undefined
  /**
   * Asks the broker for this consumer timeout with the `x-consumer-timeout` consumer argument.
   * RabbitMQ accepts it from 3.12 on; older brokers (such as Debian's 3.10) ignore it, and the
   * policy or `consumer_timeout` setting rules. Derive it from the task timeout:
   * `timeout + WORKER_RETRY_BACKOFF_MAX_S + 60 s`. Default: not asked.
   */
  readonly consumerTimeout?: Duration.DurationInput | undefined
  /** Reconnection backoff: first delay and cap. Defaults 100 ms and 3 s. */
  readonly reconnectBase?: Duration.DurationInput | undefined
  readonly reconnectMax?: Duration.DurationInput | undefined
}

/**
 * What a closing step may take at most: closing must end even when the broker does not answer.
 * Closing runs in finalizers, which are uninterruptible: each bounded wait is made an
 * interruptible region, or its time limit could never fire.
 *
 * @since 0.1.0
 * @category constants
 */
export const CLOSE_STEP_TIMEOUT = Duration.seconds(5)

/** Consumers kept on one channel by successive grows before they are merged into one. */
const MAX_CONSUMERS = 16

/** The URL without its password, for messages and logs. */
export const redactUrl = (url: string): string => {
  try {
    const parsed = new URL(url)
    if (parsed.password !== "") parsed.password = "***"
    return parsed.toString()
  } catch {
    return "(an unparsable URL)"
  }
}

const describe = (
  error: unknown,
): string => (error instanceof Error ? error.message : String(error))

const connectError = (error: unknown, url: string): TransportError => {
  const text = describe(error).replaceAll(url, redactUrl(url))
  return /ACCESS[-_]REFUSED|\b403\b/.test(text)
    ? new TransportError({
      reason: "access_refused",
      message: `The broker refused the credentials of ${redactUrl(url)}`,
    })
    : new TransportError({
      reason: "connect",
      message: `Cannot connect to ${redactUrl(url)}: ${text}`,
    })
}

/**
 * amqplib writes the frames its channels have buffered one `write` at a time, each a system call
 * with `noDelay`: corked around its flush, they leave in one `writev`. Reaches into amqplib's
 * connection (its multiplexer's flush and output stream); left as it is if their shape differs.
 */
const coalesceWrites = (model: Amqp.ChannelModel): void => {
  const muxer = (model as { connection?: { muxer?: unknown } }).connection?.muxer as
    | { _readIncoming?: () => void; out?: { cork?: () => void; uncork?: () => void } }
    | undefined
  const flush = muxer?._readIncoming
  const out = muxer?.out
  if (
    typeof flush !== "function" || typeof out?.cork !== "function" ||
    typeof out.uncork !== "function"
  ) {
    return
  }
  muxer!._readIncoming = () => {
    out.cork!()
    try {
      flush.call(muxer)
    } finally {
      out.uncork!()
    }
  }
}

const declareError = (error: unknown, queue: string): TransportError =>
  (error as { code?: unknown })?.code === 406
    ? new TransportError({
      reason: "precondition_failed",
      message:
        `The queue "${queue}" exists with other arguments than a durable queue declared without arguments: ${
          describe(error)
        }`,
    })
    : new TransportError({
      reason: "declare",
      message: `Declaring the queue "${queue}" failed: ${describe(error)}`,
    })

const FIRST_DELIVERY = Redeliveries.Counted({ count: 0 })
const REDELIVERED = Redeliveries.Flagged({ redelivered: true })

/**
 * What every delivery of one consumer channel shares: its lease is the channel's, and so is how
 * it is settled. Made once per channel, so that a delivery costs a few small objects.
 */
interface ChannelDeliveries {
  readonly lease: Lease
  readonly settle: (
    message: Amqp.ConsumeMessage,
    requeue: boolean,
  ) => Effect.Effect<void, LeaseLost>
}

const channelDeliveries = (channel: Amqp.Channel, leases: LeaseLoss): ChannelDeliveries => ({
  lease: {
    duration: Option.none(),
    renew: Option.none(),
    lost: Effect.async<LeaseLost>((resume) =>
      Effect.sync(leases.onLost((lost) => resume(Effect.succeed(lost))))
    ),
    onLost: (listener) => leases.onLost(listener),
    isLost: () => leases.lost !== undefined,
  },
  settle: (message, requeue) =>
    Effect.suspend(() => {
      if (leases.lost !== undefined) return Effect.fail(leases.lost)
      try {
        if (requeue) channel.nack(message, false, true)
        else channel.ack(message)
        return Effect.void
      } catch {
        return Effect.fail(new LeaseLost({ reason: "channel_closed" }))
      }
    }),
})

/** A delivery of a consumer channel: its lease and settlement are the channel's. */
const toDelivery = (message: Amqp.ConsumeMessage, shared: ChannelDeliveries): Delivery => {
  const count = message.properties.headers?.["x-delivery-count"]
  return {
    body: message.content,
    // RabbitMQ 3.10 adds `x-delivery-count` to a quorum queue's message only from its second
    // delivery on: a first delivery without it is attempt 1 on either kind of queue, and only a
    // redelivery without it tells a classic queue.
    redeliveries: typeof count === "number"
      ? Redeliveries.Counted({ count })
      : message.fields.redelivered
      ? REDELIVERED
      : FIRST_DELIVERY,
    lease: shared.lease,
    ack: shared.settle(message, false),
    requeue: shared.settle(message, true),
  }
}

/** The consumer channel of a connection, with what its deliveries' leases die with. */
interface Consuming {
  readonly channel: Amqp.Channel
  readonly leases: LeaseLoss
  readonly deliveries: ChannelDeliveries
  readonly ended: Deferred.Deferred<void>
}

interface Session {
  readonly publisher: Amqp.ConfirmChannel
  readonly returned: Set<string>
}

/**
 * A transport that connects (and reconnects) in the background for as long as the scope lives.
 * A configuration error (refused credentials, a conflicting queue) is not retried: `take`
 * fails with it.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  options: AmqpTransportOptions,
): Effect.Effect<Transport["Type"], never, Scope.Scope> =>
  Effect.gen(function* () {
    const url = Redacted.value(options.url)
    const confirmTimeout = Duration.decode(options.confirmTimeout ?? Duration.seconds(10))
    const inbox = new Inbox<Delivery, TransportError>()
    const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
    const current = yield* Ref.make<Option.Option<Session>>(Option.none())
    const sessionReady = yield* Ref.make(yield* Deferred.make<Session>())
    let intakeStopped = false
    let capacity = options.capacity
    // The consumers on the consumer channel, each with its own prefetch: their sum is the
    // capacity. A prefetch only applies to consumers made after it, and a cancelled consumer's
    // deliveries stop counting against any window, so a resize adds or cancels consumers.
    let consumers: Array<
      { readonly channel: Amqp.Channel; readonly tag: string; readonly prefetch: number }
    > = []
    let consuming: Consuming | undefined
    /** The session now, as `current` holds it: read without an Effect by every publish. */
    let live: Session | undefined
    const resizing = yield* Effect.makeSemaphore(1)
    let sequence = 0

    const tryPromise = <A>(f: () => Promise<A>, onError: (e: unknown) => TransportError) =>
      Effect.tryPromise({ try: f, catch: onError })

    const cancelOne = (c: (typeof consumers)[number]) =>
      // Waiting for cancel-ok means every ack sent before it has reached the broker.
      tryPromise(
        () => c.channel.cancel(c.tag),
        (e) => new TransportError({ reason: "closed", message: describe(e) }),
      ).pipe(
        Effect.interruptible,
        Effect.timeout(CLOSE_STEP_TIMEOUT),
        Effect.ignore,
      )

    const cancelConsumer = Effect.suspend(() => {
      const all = consumers
      consumers = []
      return Effect.forEach(all, cancelOne, { concurrency: "unbounded", discard: true })
    })

    /** Adds a consumer with `prefetch` on the session's consumer channel. */
    const consumeOn = (target: Consuming, prefetch: number) =>
      Effect.gen(function* () {
        const { channel, ended, leases, deliveries } = target
        // AMQP's prefetch count is 16 bits: a larger window is as good as unbounded here.
        yield* tryPromise(
          () => channel.prefetch(Math.min(prefetch, 65_535)),
          (e) => connectError(e, url),
        )
        const { consumerTag } = yield* tryPromise(
          () =>
            channel.consume(options.inQueue, (message) => {
              if (message === null) {
                // basic.cancel from the server (the queue was deleted, or the consumer timed out).
                leases.lose("consumer_cancelled")
                Deferred.unsafeDone(ended, Effect.void)
                return
              }
              inbox.offer(toDelivery(message, deliveries))
            }, {
              noAck: false,
              ...(options.consumerTimeout === undefined ? {} : {
                arguments: {
                  "x-consumer-timeout": Duration.toMillis(Duration.decode(options.consumerTimeout)),
                },
              }),
            }),
          (e) =>
            new TransportError({
              reason: "consume",
              message: `Consuming "${options.inQueue}" failed: ${describe(e)}`,
            }),
        )
        const made = { channel, tag: consumerTag, prefetch }
        // Intake stopped while the broker was making it: `stopIntake` could not cancel it.
        if (intakeStopped) yield* cancelOne(made)
        else consumers.push(made)
      })

    /**
     * Brings the consumers' windows to `capacity`: growing adds a consumer with the difference
     * (the deliveries in hand keep counting against their own consumers' windows); shrinking
     * cancels the newest consumers (cancel-ok awaited) until the windows fit, then tops up with
     * one consumer. Past {@link MAX_CONSUMERS}, they are replaced by one consumer of `capacity`.
     */
    const resize = (target: Consuming) =>
      Effect.gen(function* () {
        let window = consumers.reduce((sum, c) => sum + c.prefetch, 0)
        if (capacity > window && consumers.length >= MAX_CONSUMERS) {
          yield* cancelConsumer
          window = 0
        }
        while (window > capacity) {
          const newest = consumers.pop()!
          window -= newest.prefetch
          yield* cancelOne(newest)
        }
        if (capacity > window && !intakeStopped) yield* consumeOn(target, capacity - window)
      })

    /** One connection's life: returns when the connection is lost. */
    const session = Effect.gen(function* () {
      const connection = yield* Effect.acquireRelease(
        tryPromise(
          () => connect(url, { noDelay: true, timeout: 10_000 }),
          (e) => connectError(e, url),
        ),
        (c) =>
          Effect.promise(() => c.close().catch(() => undefined)).pipe(
            Effect.interruptible,
            Effect.timeout(CLOSE_STEP_TIMEOUT),
            Effect.ignore,
          ),
      )
      const ended = yield* Deferred.make<void>()
      connection.on("error", () => {})
      connection.on("close", () => Deferred.unsafeDone(ended, Effect.void))
      coalesceWrites(connection)
      // Every step from here is a round trip to the broker, and amqplib makes one channel's
      // calls one after another: the two channels are opened at once, and each declares its own
      // queue. A refused declaration closes its channel, and is a configuration error.
      const [publisher, channel] = yield* Effect.all([
        tryPromise(() => connection.createConfirmChannel(), (e) => connectError(e, url)),
        intakeStopped
          ? Effect.succeed(undefined)
          : tryPromise(() => connection.createChannel(), (e) => connectError(e, url)),
      ], { concurrency: "unbounded" })
      const returned = new Set<string>()
      publisher.on("error", () => {})
      publisher.on("close", () => Deferred.unsafeDone(ended, Effect.void))
      publisher.on("return", (message: Amqp.Message) => {
        if (typeof message.properties.messageId === "string") {
          returned.add(message.properties.messageId)
        }
      })
      yield* Effect.addFinalizer(() =>
        Effect.promise(() => publisher.waitForConfirms().catch(() => undefined)).pipe(
          Effect.interruptible,
          Effect.timeout(CLOSE_STEP_TIMEOUT),
          Effect.ignore,
        )
      )
      const declare = (on: Amqp.Channel, queue: string) =>
        tryPromise(() => on.assertQueue(queue, { durable: true }), (e) => declareError(e, queue))
      const declaringOut = declare(publisher, options.outQueue)
      if (channel === undefined) {
        yield* declare(publisher, options.inQueue)
        yield* declaringOut
      } else {
        const leases = new LeaseLoss()
        channel.on("error", () => {})
        channel.on("close", () => {
          leases.lose("channel_closed")
          Deferred.unsafeDone(ended, Effect.void)
        })
        consuming = { channel, leases, deliveries: channelDeliveries(channel, leases), ended }
        // Runs after the cancel below. amqplib writes the connection's Close ahead of channel
        // frames still buffered, so acks sent last would be dropped with the connection: a
        // synchronous call on this channel answers only after the broker has read them, then
        // the channel is closed before the connection.
        yield* Effect.addFinalizer(() =>
          Effect.promise(() =>
            channel.checkQueue(options.inQueue).then(() => channel.close()).catch(() => undefined)
          ).pipe(Effect.interruptible, Effect.timeout(CLOSE_STEP_TIMEOUT), Effect.ignore)
        )
        yield* Effect.addFinalizer(() =>
          cancelConsumer.pipe(Effect.zipRight(Effect.sync(() => leases.lose("channel_closed"))))
        )
        yield* Effect.all([declaringOut, declare(channel, options.inQueue)], {
          concurrency: "unbounded",
          discard: true,
        })
        yield* resizing.withPermits(1)(resize(consuming))
      }
      const ready: Session = { publisher, returned }
      yield* Ref.set(current, Option.some(ready))
      live = ready
      yield* Effect.flatMap(Ref.get(sessionReady), (d) => Deferred.succeed(d, ready))
      yield* SubscriptionRef.set(status, "connected")
      yield* Deferred.await(ended)
      yield* Effect.logWarning("The broker connection was lost: reconnecting")
    }).pipe(
      Effect.ensuring(
        Effect.all([
          Effect.sync(() => {
            consuming = undefined
            consumers = []
            live = undefined
          }),
          Ref.set(current, Option.none()),
          Deferred.make<Session>().pipe(Effect.flatMap((d) => Ref.set(sessionReady, d))),
          SubscriptionRef.update(status, (s) => (s === "closed" ? s : "disconnected")),
        ]),
      ),
      Effect.scoped,
    )

    const backoff = Schedule.exponential(options.reconnectBase ?? Duration.millis(100)).pipe(
      Schedule.jittered,
      Schedule.either(Schedule.spaced(options.reconnectMax ?? Duration.seconds(3))),
    )

    yield* session.pipe(
      Effect.tapError((error) =>
        error.isConfiguration
          ? Effect.void
          : Effect.logWarning(`Broker connection attempt failed: ${error.message}`)
      ),
      Effect.retry({ schedule: backoff, while: (error) => !error.isConfiguration }),
      Effect.forever,
      Effect.catchAll((error) =>
        Effect.logError(error.message).pipe(
          Effect.zipRight(Effect.sync(() => {
            intakeStopped = true
            inbox.close(error)
          })),
        )
      ),
      Effect.forkScoped,
    )
    yield* Effect.addFinalizer(() => SubscriptionRef.set(status, "closed"))

    // Publishes waiting for their confirm, failed by one sweeper when past their deadline: a race
    // per publish (Effect.timeout) measured at half the throughput of the raw amqplib loop.
    // Keyed by the publish's number: a Map's set of a number key measured cheaper than of a
    // string made for each publish.
    const awaitingConfirm = new Map<
      number,
      { readonly deadline: number; readonly expire: () => void }
    >()
    const confirmMillis = Duration.toMillis(confirmTimeout)
    const clock = yield* Effect.clock
    yield* Effect.sync(() => {
      const now = clock.unsafeCurrentTimeMillis()
      for (const [id, waiting] of awaitingConfirm) {
        if (waiting.deadline > now) continue
        awaitingConfirm.delete(id)
        waiting.expire()
      }
    }).pipe(
      Effect.repeat(Schedule.spaced(Duration.millis(Math.min(250, confirmMillis)))),
      Effect.forkScoped,
    )

    const sessionNow: Effect.Effect<Session, PublishError> = Effect.flatMap(
      Ref.get(current),
      (session) =>
        Option.isSome(session) ? Effect.succeed(session.value) : Ref.get(sessionReady).pipe(
          Effect.flatMap(Deferred.await),
          Effect.timeoutFail({
            duration: confirmTimeout,
            onTimeout: () => new PublishError({ reason: "closed", messageType: "unknown" }),
          }),
        ),
    )

    const publishOn = (
      { publisher, returned }: Session,
      body: Uint8Array,
      type: string,
    ): Effect.Effect<void, PublishError> =>
      Effect.async<void, PublishError>((resume) => {
        const id = ++sequence
        const messageId = `${id}`
        const failWith = (reason: PublishError["reason"]) =>
          resume(Effect.fail(new PublishError({ reason, messageType: type })))
        awaitingConfirm.set(id, {
          deadline: clock.unsafeCurrentTimeMillis() + confirmMillis,
          expire: () => failWith("timeout"),
        })
        try {
          publisher.publish(
            "",
            options.outQueue,
            Buffer.from(body.buffer, body.byteOffset, body.byteLength),
            {
              persistent: true,
              contentType: "application/json",
              type,
              mandatory: true,
              messageId,
            },
            (error) => {
              if (!awaitingConfirm.delete(id)) {
                return
              }
              if (error) {
                // amqplib fails every confirm still awaited when the channel closes: the
                // broker did not refuse those.
                return failWith(error.message === "channel closed" ? "closed" : "nacked")
              }
              // Returns are rare: an empty set is not asked, as hashing the new id string for
              // the lookup is a call into the runtime on every confirm.
              if (returned.size !== 0 && returned.delete(messageId)) {
                return failWith("returned")
              }
              resume(Effect.void)
            },
          )
        } catch {
          awaitingConfirm.delete(id)
          failWith("closed")
        }
        // No canceler: an interrupted publish leaves its entry to its confirm or to the sweeper,
        // whose late resume the interrupted fiber ignores. A canceler would wrap every publish
        // in an interruption handler, the costliest steps of a publish.
      })

    // Connected, a publish is one step; between connections it waits for the next session.
    const publish: Transport["Type"]["publish"] = (body, type) =>
      Effect.suspend(() =>
        live !== undefined
          ? publishOn(live, body, type)
          : Effect.flatMap(sessionNow, (session) => publishOn(session, body, type))
      )

    const stopIntake = Effect.suspend(() => {
      // Idempotent: a drain stops intake, then the scope's finalizer does again, and a second
      // `takeAll` on the shut-down inbox would interrupt that finalizer.
      if (intakeStopped) {
        return Effect.void
      }
      intakeStopped = true
      return cancelConsumer.pipe(
        // Delivered but never taken: give them back now rather than when the channel closes.
        Effect.zipRight(Effect.suspend(() =>
          Effect.forEach(inbox.takeAll(), (d) => Effect.ignore(d.requeue), { discard: true })
        )),
        Effect.zipRight(Effect.sync(() =>
          inbox.close()
        )),
      )
    })
    yield* Effect.addFinalizer(() => stopIntake)

    return Transport.of({
      take: inbox.take,
      publish,
      setCapacity: (n) =>
        resizing.withPermits(1)(Effect.suspend(() => {
          capacity = n
          const target = consuming
          // Without a channel, or with intake stopped, the next connection applies it.
          if (target === undefined || intakeStopped) return Effect.void
          return Effect.ignore(resize(target))
        })),
      stopIntake,
      status,
      readyCount: Effect.flatMap(
        Effect.mapError(
          sessionNow,
          () => new TransportError({ reason: "closed", message: "Not connected to the broker" }),
        ),
        ({ publisher }) =>
          tryPromise(() => publisher.checkQueue(options.inQueue), (e) =>
            new TransportError({
              reason: "declare",
              message: `Checking "${options.inQueue}" failed: ${describe(e)}`,
            })).pipe(Effect.map((ok) => ok.messageCount)),
      ),
    })
  })

/**
 * The RabbitMQ transport configured by the worker's settings (`BROKER_URL`, the queues, the
 * concurrency as prefetch).
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<Transport, TransportError, Settings> = Layer.scoped(
  Transport,
  Effect.gen(function* () {
    const settings = yield* Settings
    if (Option.isNone(settings.brokerUrl)) {
      return yield* new TransportError({
        reason: "not_configured",
        message: "BROKER_URL is not set",
      })
    }
    return yield* make({
      url: settings.brokerUrl.value,
      inQueue: settings.inQueue,
      outQueue: settings.outQueue,
      capacity: settings.concurrency,
    })
  }),
)
