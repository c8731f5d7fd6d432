/**
 * An embedded broker that behaves like a quorum queue of RabbitMQ 4: named queues, consumers with
 * prefetch, a delivery count that a failed delivery (a requeue, a lease that expires) raises and a
 * release does not, the acquired count of every hand-out, renewal, fencing of stale
 * settlements, and injectable publish failures. A real {@link Transport}, for tests, the demo
 * and local trials.
 *
 * @since 0.1.0
 */
import type * as Scope from "effect/Scope"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as SubscriptionRef from "effect/SubscriptionRef"
import { BrokerCore, type ConsumerCore, type Held } from "./internal/memory/broker.ts"
import type { MessageType } from "./Protocol.ts"
import { Settings } from "./Settings.ts"
import {
  type ConnectionStatus,
  type Delivery,
  type PublishOptions,
  Redeliveries,
  Transport,
} from "./Transport.ts"
import { type LeaseLost, PublishError } from "./WorkerError.ts"

/**
 * A message as the broker stored it.
 *
 * @since 0.1.0
 * @category models
 */
export interface StoredMessage {
  readonly id: number
  readonly body: Uint8Array
  /** The AMQP `type` property the publisher set. */
  readonly type: string | undefined
  /** The headers the publisher set (the engine's `traceparent`, say); `undefined` if none. */
  readonly headers: Readonly<Record<string, unknown>> | undefined
  /** The id the publisher gave the message (the engine's, see `PublishOptions`), if any. */
  readonly messageId: string | undefined
}

/**
 * Options of a transport over the broker.
 *
 * @since 0.1.0
 * @category models
 */
export interface TransportOptions {
  readonly inQueue: string
  readonly outQueue: string
  readonly capacity: number
  /** How long a lease lasts unless renewed. Default: no expiry. */
  readonly leaseDuration?: Duration.Input | undefined
  /** Report only a `redelivered` flag, as a classic queue does. Default: counted. */
  readonly classic?: boolean | undefined
}

interface MemoryBrokerShape {
  /**
   * Publishes as the platform's API does; `deliveryCount` presets `x-delivery-count` (and as many
   * earlier hand-outs), and
   * `headers` (a `traceparent`, say) are delivered with the message.
   */
  readonly publish: (
    queue: string,
    body: Uint8Array | string,
    options?: {
      readonly type?: string
      readonly deliveryCount?: number
      readonly headers?: Readonly<Record<string, unknown>>
    },
  ) => Effect.Effect<StoredMessage, PublishError>
  /**
   * While `refusing`, every publish to `queue` fails (`nacked`), as RabbitMQ refuses publishes
   * to a queue at its length limit with the `reject-publish` overflow policy.
   */
  readonly refusePublishes: (queue: string, refusing: boolean) => Effect.Effect<void>
  /** Makes the next matching publish fail, as an unconfirmed publish would. */
  readonly failNextPublish: (
    options?: { readonly queue?: string; readonly type?: string },
  ) => Effect.Effect<void>
  /**
   * Every message published to the queue so far, consumed or not, oldest first; with `after`,
   * only those published after the message of that id, on whichever queue (ids are the broker's
   * count), found without reading the earlier ones.
   */
  readonly published: (
    queue: string,
    options?: { readonly after?: number },
  ) => Effect.Effect<ReadonlyArray<StoredMessage>>
  /** Messages waiting in the queue. */
  readonly ready: (queue: string) => Effect.Effect<number>
  /** Messages delivered and not yet settled. */
  readonly unacked: (queue: string) => Effect.Effect<number>
  /** Drops the queue's waiting messages and its published log. */
  readonly purge: (queue: string) => Effect.Effect<number>
  /** Takes one waiting message, as AMQP's basic.get does. */
  readonly get: (
    queue: string,
    options?: { readonly leaseDuration?: Duration.Input; readonly classic?: boolean },
  ) => Effect.Effect<Option.Option<Delivery>>
  /** A transport consuming `inQueue` and publishing to `outQueue`, closed with its scope. */
  readonly transport: (
    options: TransportOptions,
  ) => Effect.Effect<Transport["Service"], never, Scope.Scope>
}

const MemoryBrokerService: Context.ServiceClass<
  MemoryBroker,
  "@async-task/worker/MemoryBroker",
  MemoryBrokerShape
> = Context.Service<MemoryBroker, MemoryBrokerShape>()("@async-task/worker/MemoryBroker")

/**
 * The embedded broker.
 *
 * @since 0.1.0
 * @category services
 */
export class MemoryBroker extends MemoryBrokerService {}

const encoder = new TextEncoder()

const millis = (input: Duration.Input | undefined): number | undefined =>
  input === undefined ? undefined : Duration.toMillis(Duration.fromInputUnsafe(input))

const settle = (result: ReturnType<BrokerCore["ack"]>) =>
  result === undefined ? Effect.void : Effect.fail(result)

// Immutable values shared by deliveries rather than made for each one: a delivery is made per
// message, and the engine's throughput is bounded by what each one allocates.
const counted = Array.from({ length: 8 }, (_, count) => Redeliveries.Counted({ count }))
const flagged = [false, true].map((redelivered) => Redeliveries.Flagged({ redelivered }))
const noDuration: Option.Option<Duration.Duration> = Option.none()

const durationOf = (leaseMillis: number | undefined): Option.Option<Duration.Duration> =>
  leaseMillis === undefined ? noDuration : Option.some(Duration.millis(leaseMillis))

const toDelivery = (
  core: BrokerCore,
  h: Held,
  classic: boolean,
  duration: Option.Option<Duration.Duration> = durationOf(h.leaseMillis),
): Delivery => {
  const count = h.message.deliveryCount
  return {
    body: h.message.body,
    headers: h.message.headers,
    // As RabbitMQ 4 does: the acquired count only from the second hand-out on.
    redeliveries: classic
      ? flagged[h.acquired > 0 ? 1 : 0]!
      : h.acquired === 0
      ? counted[count] ?? Redeliveries.Counted({ count })
      : Redeliveries.Counted({ count, acquired: h.acquired }),
    lease: {
      duration,
      renew: h.leaseMillis === undefined
        ? Option.none()
        : Option.some(Effect.suspend(() => settle(core.renew(h)))),
      lost: Effect.callback<LeaseLost>((resume) =>
        Effect.sync(core.onLost(h, (lost) => resume(Effect.succeed(lost))))
      ),
      onLost: (listener) => core.onLost(h, listener),
      isLost: () => h.state === "lost",
    },
    ack: Effect.suspend(() => settle(core.ack(h))),
    requeue: Effect.suspend(() => settle(core.requeue(h, true))),
    release: Effect.suspend(() => settle(core.requeue(h, false))),
  }
}

/**
 * Options of the broker.
 *
 * @since 0.1.0
 * @category models
 */
export interface MemoryBrokerOptions {
  /** How often expired leases are looked for. Default 100 ms. */
  readonly reapInterval?: Duration.Input | undefined
  /** Keep a log of every published message for inspection. Default true. */
  readonly retainPublished?: boolean | undefined
  /**
   * The largest message body it takes, as RabbitMQ's `max_message_size`: a larger publish fails
   * `too_large` (since 0.3.0). Default: no limit.
   */
  readonly maxPublishBytes?: number | undefined
}

/**
 * Makes a broker whose lease reaper lives as long as the scope.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  options: MemoryBrokerOptions = {},
): Effect.Effect<MemoryBroker["Service"], never, Scope.Scope> =>
  Effect.gen(function* () {
    const clock = yield* Clock.Clock
    const core = new BrokerCore(
      () => clock.currentTimeMillisUnsafe(),
      options.retainPublished ?? true,
    )
    const armed: Array<
      { readonly queue?: string | undefined; readonly type?: string | undefined }
    > = []
    yield* Effect.sync(() => core.expireDue()).pipe(
      Effect.repeat(Schedule.spaced(options.reapInterval ?? Duration.millis(100))),
      Effect.forkScoped,
    )

    const injected = (queue: string, type: string | undefined): boolean => {
      if (armed.length === 0) return false // every publish asks: answer the usual case at once
      const i = armed.findIndex((a) =>
        (a.queue === undefined || a.queue === queue) && (a.type === undefined || a.type === type)
      )
      if (i < 0) return false
      armed.splice(i, 1)
      return true
    }

    const refusing = new Set<string>()
    const maxBytes = options.maxPublishBytes ?? Infinity

    const publish = (
      queue: string,
      body: Uint8Array,
      type: string | undefined,
      deliveryCount = 0,
      headers?: Readonly<Record<string, unknown>> | undefined,
      messageId?: string | undefined,
    ) =>
      injected(queue, type)
        ? Effect.fail(new PublishError({ reason: "injected", messageType: type ?? "unknown" }))
        : body.byteLength > maxBytes
        ? Effect.fail(new PublishError({ reason: "too_large", messageType: type ?? "unknown" }))
        : refusing.size !== 0 && refusing.has(queue)
        ? Effect.fail(new PublishError({ reason: "nacked", messageType: type ?? "unknown" }))
        : Effect.sync(() => core.publish(queue, body, type, deliveryCount, headers, messageId))

    const transport = (o: TransportOptions) =>
      Effect.gen(function* () {
        const leaseMillis = millis(o.leaseDuration)
        const classic = o.classic ?? false
        const duration = durationOf(leaseMillis)
        const consumer: ConsumerCore = yield* Effect.acquireRelease(
          Effect.sync(() => core.addConsumer(o.inQueue, o.capacity, leaseMillis)),
          (c) =>
            Effect.sync(() => {
              core.close(c)
              c.inbox.close()
            }),
        )
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connected")
        yield* Effect.addFinalizer(() => SubscriptionRef.set(status, "closed"))
        return Transport.of({
          take: consumer.inbox.takeMap((h) => toDelivery(core, h, classic, duration)),
          publish: Object.assign(
            (body: Uint8Array, type: MessageType, options?: PublishOptions) =>
              publish(o.outQueue, body, type, 0, options?.headers, options?.messageId),
            {
              // The broker answers a publish as it takes it: sent is confirmed (or refused) at once.
              send: (body: Uint8Array, type: MessageType, options?: PublishOptions) =>
                Effect.exit(
                  Effect.asVoid(
                    publish(o.outQueue, body, type, 0, options?.headers, options?.messageId),
                  ),
                ),
            },
          ),
          setCapacity: (capacity) => Effect.sync(() => core.setPrefetch(consumer, capacity)),
          stopIntake: Effect.sync(() => {
            core.cancel(consumer)
            consumer.inbox.close()
          }),
          status,
          readyCount: Effect.sync(() => core.readyCount(o.inQueue)),
        })
      })

    return MemoryBroker.of({
      publish: (queue, body, opts) =>
        publish(
          queue,
          typeof body === "string" ? encoder.encode(body) : body,
          opts?.type,
          opts?.deliveryCount,
          opts?.headers === undefined ? undefined : { ...opts.headers },
        ),
      refusePublishes: (queue, refuse) =>
        Effect.sync(() => void (refuse ? refusing.add(queue) : refusing.delete(queue))),
      failNextPublish: (opts) =>
        Effect.sync(() => void armed.push({ queue: opts?.queue, type: opts?.type })),
      published: (queue, opts) => Effect.sync(() => core.published(queue, opts?.after ?? 0)),
      ready: (queue) => Effect.sync(() => core.readyCount(queue)),
      unacked: (queue) => Effect.sync(() => core.unackedCount(queue)),
      purge: (queue) => Effect.sync(() => core.purge(queue)),
      get: (queue, opts) =>
        Effect.sync(() => {
          const h = core.get(queue, millis(opts?.leaseDuration))
          return h === undefined
            ? Option.none()
            : Option.some(toDelivery(core, h, opts?.classic ?? false))
        }),
      transport,
    })
  })

/**
 * The broker as a layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options?: MemoryBrokerOptions): Layer.Layer<MemoryBroker> =>
  Layer.effect(MemoryBroker, make(options))

/**
 * A {@link Transport} over the broker, configured by the worker's settings: the queues, the
 * concurrency as capacity, and the consumer timeout as the lease duration (renewed by the
 * engine while a task runs).
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransport = (
  options?: { readonly classic?: boolean; readonly leaseDuration?: Duration.Input },
): Layer.Layer<Transport, never, MemoryBroker | Settings> =>
  Layer.effect(
    Transport,
    Effect.gen(function* () {
      const broker = yield* MemoryBroker
      const settings = yield* Settings
      return yield* broker.transport({
        inQueue: settings.inQueue,
        outQueue: settings.outQueue,
        capacity: settings.concurrency,
        leaseDuration: options?.leaseDuration ?? settings.consumerTimeout,
        classic: options?.classic,
      })
    }),
  )
