/**
 * The contract between the delivery engine and a broker. The engine sees only this: the
 * MemoryBroker and RabbitMQ implement it, and nothing in the engine may assume either.
 *
 * @since 0.1.0
 */
import type * as Duration from "effect/Duration"
import type * as SubscriptionRef from "effect/SubscriptionRef"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type { MessageType } from "./Protocol.ts"
import type { LeaseLost, PublishError, TransportError } from "./WorkerError.ts"

/**
 * What the broker says about earlier deliveries of a message. A quorum queue counts them:
 * `count` is its `x-delivery-count`, the deliveries that failed (on RabbitMQ 3.x every return
 * counts; on 4.x only a `basic.reject` or a lost channel does, not a `basic.nack`), and
 * `acquired` its `x-acquired-count` where the broker sends it (RabbitMQ 4.x): every earlier
 * hand-out to a consumer, failed or not. A classic queue only flags a redelivery.
 *
 * @since 0.1.0
 * @category models
 */
export type Redeliveries = Data.TaggedEnum<{
  Counted: { readonly count: number; readonly acquired?: number | undefined }
  Flagged: { readonly redelivered: boolean }
}>

/**
 * Constructors and matchers for {@link Redeliveries}.
 *
 * @since 0.1.0
 * @category models
 */
export const Redeliveries: Data.TaggedEnum.Constructor<Redeliveries> = Data.taggedEnum<
  Redeliveries
>()

/**
 * The worker's hold on a delivery, until it settles it or loses it.
 *
 * @since 0.1.0
 * @category models
 */
export interface Lease {
  /** How long one grant of the lease lasts, when the transport grants leases for a time. */
  readonly duration: Option.Option<Duration.Duration>
  /** Extends the lease by `duration`; fails `LeaseLost` when it is already gone. */
  readonly renew: Option.Option<Effect.Effect<void, LeaseLost>>
  /** Completes, with why, when the lease is lost. Never completes for a settled delivery. */
  readonly lost: Effect.Effect<LeaseLost>
  /**
   * Calls `listener` once when the lease is lost (at once if it already is); the returned
   * function stops listening. The engine listens this way rather than with a fiber per lease.
   */
  readonly onLost: (listener: (lost: LeaseLost) => void) => () => void
  /**
   * Whether the lease is lost now: checked before anything is published for the task. A plain
   * read, not an Effect: the engine asks it twice per delivery.
   */
  readonly isLost: () => boolean
}

/**
 * A message's application headers, as its broker carries them: on RabbitMQ, the AMQP `headers`
 * table as amqplib decodes it (strings, numbers, booleans, nested tables, Buffers), which also
 * holds the broker's own (`x-delivery-count`).
 *
 * @since 0.1.0
 * @category models
 */
export type Headers = Readonly<Record<string, unknown>>

/**
 * One message handed to the worker.
 *
 * @since 0.1.0
 * @category models
 */
export interface Delivery {
  readonly body: Uint8Array
  /**
   * The message's headers, as the broker gave them (not copied); `undefined` when it has none. The
   * engine reads one: a W3C `traceparent` (a string), to continue the producer's trace.
   */
  readonly headers?: Headers | undefined
  readonly redeliveries: Redeliveries
  readonly lease: Lease
  /** Settles the delivery for good. */
  readonly ack: Effect.Effect<void, LeaseLost | TransportError>
  /**
   * Gives the message back to the queue as a failed attempt, counted as one on every broker
   * (RabbitMQ: `basic.reject` with requeue).
   */
  readonly requeue: Effect.Effect<void, LeaseLost | TransportError>
  /**
   * Gives the message back to the queue unprocessed, through no fault of its task (a shutdown, a
   * service missing): not counted where the broker tells the two apart (RabbitMQ 4.x:
   * `basic.nack` with requeue; 3.x counts every return). Since 0.3.0.
   */
  readonly release: Effect.Effect<void, LeaseLost | TransportError>
}

/**
 * How a message is published, beyond its body and type.
 *
 * @since 0.1.0
 * @category models
 */
export interface PublishOptions {
  /**
   * Headers set on the message (on RabbitMQ, its AMQP `headers`): the engine sets `traceparent`
   * (W3C Trace Context) on the messages of a traced delivery, and nothing otherwise.
   */
  readonly headers?: Readonly<Record<string, string>> | undefined
  /**
   * The message's id (on RabbitMQ, its `message_id`): the engine's is the same for every copy of
   * one message and no other (`<task_id>:<attempt>:<delivery_id>:<type>`, a progress message's
   * with `:<n>`), so that a consumer can drop the copies that at-least-once delivery still allows.
   */
  readonly messageId?: string | undefined
}

/**
 * The connection as readiness sees it. Only `connected` serves: `blocked` is the broker's
 * resource alarm (it reads no publish until it ends), `stalled` a broker not heard from for a
 * heartbeat (both since 0.2.0).
 *
 * @since 0.1.0
 * @category models
 */
export type ConnectionStatus =
  | "connecting"
  | "connected"
  | "blocked"
  | "stalled"
  | "disconnected"
  | "closed"

/**
 * Whether the connection is up, serving or not: `connected`, or `blocked` or `stalled` (which
 * readiness fails on, but which are no broker out of reach: a job does not give up on them).
 *
 * @since 0.2.0
 * @category models
 */
export const isLive = (status: ConnectionStatus): boolean =>
  status === "connected" || status === "blocked" || status === "stalled"

/**
 * A transport's publish: completes once the broker has confirmed the message. With `send`, it can
 * also send a message now and leave its confirm to be awaited later, with the Effect `send`
 * succeeds with (which fails as the publish fails, and may be awaited any number of times): the
 * engine sends `started` so, and runs the handler while the confirm is on the way. Messages sent
 * and published keep their order. `send` is the publish function's own, so that a wrapper which
 * replaces `publish` (`{ ...transport, publish }`) sees every message: without `send`, `started`
 * is confirmed before the handler runs.
 *
 * @since 0.3.0
 * @category models
 */
export interface Publish {
  (body: Uint8Array, type: MessageType, options?: PublishOptions): Effect.Effect<void, PublishError>
  readonly send?:
    | ((
      body: Uint8Array,
      type: MessageType,
      options?: PublishOptions,
    ) => Effect.Effect<Effect.Effect<void, PublishError>>)
    | undefined
}

interface TransportShape {
  /**
   * The next delivery of the input queue, waiting for one; `None` once intake has stopped.
   * The transport never holds more unsettled deliveries than the capacity (the prefetch):
   * that is the back-pressure. Several fibers may take at once.
   */
  readonly take: Effect.Effect<Option.Option<Delivery>, TransportError>
  /**
   * Publishes to the output queue; completes only once the broker has confirmed, and fails
   * within a bounded time otherwise (the engine sets no time limit of its own). `options.headers`
   * go on the message as they are. It may also send ahead of the confirm ({@link Publish}).
   */
  readonly publish: Publish
  /** Changes the capacity at run time, without touching deliveries in hand. */
  readonly setCapacity: (capacity: number) => Effect.Effect<void>
  /** Stops intake: no new deliveries; those in hand may still be settled. */
  readonly stopIntake: Effect.Effect<void>
  /** The connection's state, for readiness. */
  readonly status: SubscriptionRef.SubscriptionRef<ConnectionStatus>
  /**
   * The broker node connected to, or last connected to, its password redacted: readiness names
   * it (since 0.2.0).
   */
  readonly node?: Effect.Effect<string | undefined> | undefined
  /** The input queue's ready messages, as the broker reports them (for `onIdle`). */
  readonly readyCount?: Effect.Effect<number, TransportError> | undefined
}

const TransportService: Context.ServiceClass<
  Transport,
  "@async-task/worker/Transport",
  TransportShape
> = Context.Service<Transport, TransportShape>()("@async-task/worker/Transport")

/**
 * A broker connection as the engine uses it.
 *
 * @since 0.1.0
 * @category services
 */
export class Transport extends TransportService {}
