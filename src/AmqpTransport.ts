/**
 * The RabbitMQ transport, on amqplib: a confirm channel for publishing, a consumer channel with
 * manual acks and prefetch, quorum `x-delivery-count` (or the classic redelivered flag), leases
 * that die with their channel, a lossless close, and reconnection with capped, jittered
 * exponential backoff.
 *
 * Made of parts under `internal/amqp/`: the session (one connection's life and the reconnect
 * loop), the consumers (prefetch windows and intake), the confirms (publishing), held together
 * here.
 *
 * @since 0.1.0
 */
import type * as Scope from "effect/Scope"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import * as SubscriptionRef from "effect/SubscriptionRef"
import * as Closing from "./internal/amqp/closing.ts"
import * as Confirms from "./internal/amqp/confirms.ts"
import { connect } from "./internal/amqp/connect.ts"
import * as Consumers from "./internal/amqp/consumers.ts"
import { Current } from "./internal/amqp/current.ts"
import { messageOf } from "./internal/amqp/errors.ts"
import * as Session from "./internal/amqp/session.ts"
import { Inbox } from "./internal/transport/inbox.ts"
import { Settings } from "./Settings.ts"
import { type ConnectionStatus, type Delivery, Transport } from "./Transport.ts"
import { PublishError, TransportError } from "./WorkerError.ts"

/**
 * Options of the RabbitMQ transport.
 *
 * @since 0.1.0
 * @category models
 */
export interface AmqpTransportOptions {
  /**
   * `amqp://` or `amqps://`, with the vhost (percent-encoded) and an optional `heartbeat`
   * query; or the URLs of one cluster's nodes separated by commas, tried in an order shuffled
   * per process, the next one after each failure. Checked before connecting. Redacted: it holds
   * the password.
   */
  readonly url: Redacted.Redacted<string>
  /**
   * The AMQP heartbeat asked of the broker, unless the URL asks one: a connection silent for
   * two of them is given up (amqplib), whatever the system's TCP timeouts. Whole seconds; 0 asks
   * none. Default 60 s (RabbitMQ's own; 10 s before 0.3.0, when an event loop blocked for 20 s
   * lost the connection).
   */
  readonly heartbeat?: Duration.Input | undefined
  readonly inQueue: string
  readonly outQueue: string
  /** The prefetch: unsettled deliveries at most. */
  readonly capacity: number
  /** The longest a publish waits for the broker's confirm. Default 10 s. */
  readonly confirmTimeout?: Duration.Input | undefined
  /**
   * Asks the broker for this consumer timeout (the lease) with the `x-consumer-timeout` consumer
   * argument, which RabbitMQ 3.12 and later honour over the queue's `consumer-timeout` policy and
   * the node's `consumer_timeout`; older brokers (such as Debian's 3.10) accept and ignore it.
   * `layer` asks `WORKER_CONSUMER_TIMEOUT_S`. Default: not asked.
   */
  readonly consumerTimeout?: Duration.Input | undefined
  /** Reconnection backoff: first delay and cap. Defaults 100 ms and 3 s. */
  readonly reconnectBase?: Duration.Input | undefined
  readonly reconnectMax?: Duration.Input | undefined
}

/**
 * What a closing step may take at most: closing must end even when the broker does not answer.
 * Closing runs in finalizers, which are uninterruptible: each bounded wait is made an
 * interruptible region, so that its time limit cuts it short.
 *
 * @since 0.1.0
 * @category constants
 */
export const CLOSE_STEP_TIMEOUT: Duration.Duration = Closing.CLOSE_STEP_TIMEOUT

/**
 * A transport that connects (and reconnects) in the background for as long as the scope lives.
 * A configuration error (a URL that cannot work, refused credentials or vhost, a conflicting
 * queue) is not retried: it is logged, once, and `take` fails with it.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  options: AmqpTransportOptions,
): Effect.Effect<Transport["Service"], never, Scope.Scope> =>
  Effect.gen(function* () {
    const url = Redacted.value(options.url)
    const confirmTimeout = Duration.fromInputUnsafe(options.confirmTimeout ?? Duration.seconds(10))
    const inbox = new Inbox<Delivery, TransportError>()
    const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
    const current = new Current<Session.Session>()
    const consumers = yield* Consumers.make({ ...options, url, inbox })
    const confirms = yield* Confirms.make({ outQueue: options.outQueue, confirmTimeout })
    const heartbeatSeconds = Math.ceil(
      Duration.toSeconds(Duration.fromInputUnsafe(options.heartbeat ?? Duration.seconds(60))),
    )
    yield* Session.run({
      ...options,
      url,
      heartbeatSeconds,
      connect,
      current,
      status,
      consumers,
      confirms,
    }).pipe(
      Effect.catch((error) =>
        Effect.logError(error.message).pipe(
          Effect.andThen(Effect.sync(() => consumers.fail(error))),
        )
      ),
      Effect.forkScoped,
    )
    // Closing runs these in reverse: intake stops while the session lives, the status is `closed`
    // before the session's end could call it `disconnected`, the session closes, and the confirms'
    // sweeper, made first, stops last (a publish awaiting its confirm through the close still
    // fails in time).
    yield* Effect.addFinalizer(() => SubscriptionRef.set(status, "closed"))
    yield* Effect.addFinalizer(() => consumers.stopIntake)

    // Between sessions, a publish waits for the next one, within the confirm timeout.
    const nextSession = current.get.pipe(
      Effect.timeoutOrElse({
        duration: confirmTimeout,
        orElse: () => Effect.fail(new PublishError({ reason: "closed", messageType: "unknown" })),
      }),
    )
    const sessionNow = Effect.suspend(() => {
      const session = current.now
      return session !== undefined ? Effect.succeed(session) : nextSession
    })
    const publishOn = confirms.publish
    // Connected, a publish is one step.
    const publishConfirmed: Transport["Service"]["publish"] = (body, type, options) =>
      Effect.suspend(() => {
        const session = current.now
        const headers = options?.headers
        const messageId = options?.messageId
        return session !== undefined
          ? publishOn(session, body, type, headers, messageId)
          : Effect.flatMap(nextSession, (next) => publishOn(next, body, type, headers, messageId))
      })

    // Connected, a message is sent at once; between sessions, it is refused as lost with its
    // connection, which the engine holds through as any refusal (its waits watch the lease and a
    // shutdown, where a wait for the next session here would not).
    const send: NonNullable<Transport["Service"]["publish"]["send"]> = (body, type, options) =>
      Effect.suspend(() => {
        const session = current.now
        return session !== undefined
          ? confirms.send(session, body, type, options?.headers, options?.messageId)
          : Effect.succeed(
            Effect.fail(new PublishError({ reason: "closed", messageType: type })),
          )
      })
    const publish = Object.assign(publishConfirmed, { send })

    return Transport.of({
      take: inbox.take,
      publish,
      setCapacity: consumers.setCapacity,
      stopIntake: consumers.stopIntake,
      status,
      node: Effect.sync(() => current.last?.node),
      readyCount: Effect.flatMap(
        Effect.mapError(
          sessionNow,
          () => new TransportError({ reason: "closed", message: "Not connected to the broker" }),
        ),
        ({ publisher }) =>
          Effect.tryPromise({
            try: () => publisher.checkQueue(options.inQueue),
            catch: (e) =>
              new TransportError({
                reason: "declare",
                message: `Checking "${options.inQueue}" failed: ${messageOf(e)}`,
              }),
          }).pipe(Effect.map((ok) => ok.messageCount)),
      ),
    })
  })

/**
 * The RabbitMQ transport configured by the worker's settings (`BROKER_URL`, `WORKER_HEARTBEAT_S`,
 * `WORKER_CONSUMER_TIMEOUT_S` asked as `x-consumer-timeout`, the queues, the concurrency as
 * prefetch).
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<Transport, TransportError, Settings> = Layer.effect(
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
      heartbeat: Duration.seconds(settings.heartbeat),
      // The lease the settings were checked against (the task's worst case fits in it): asked of
      // the broker, so that a shorter policy or node default does not take tasks back.
      consumerTimeout: settings.consumerTimeout,
      inQueue: settings.inQueue,
      outQueue: settings.outQueue,
      capacity: settings.concurrency,
    })
  }),
)
