/**
 * The consumers of a connection's consumer channel, and the intake they feed. Each consumer has
 * its own prefetch and their sum is the capacity: a prefetch only applies to consumers made after
 * it, and a cancelled consumer's deliveries stop counting against any window, so a resize adds or
 * cancels consumers. The channel changes with each connection; the capacity and whether intake
 * has stopped outlive it.
 */
import type * as Amqp from "amqplib"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Semaphore from "effect/Semaphore"
import type { Inbox } from "../transport/inbox.ts"
import { LeaseLoss } from "../transport/leaseLoss.ts"
import type { Delivery } from "../../Transport.ts"
import { TransportError } from "../../WorkerError.ts"
import { closeStep } from "./closing.ts"
import { type ChannelDeliveries, channelDeliveries, toDelivery } from "./deliveries.ts"
import { connectError, messageOf } from "./errors.ts"

/** RabbitMQ's refusal of the consumer argument on a queue type that takes none. */
const TIMEOUT_REFUSED = /invalid arg 'x-consumer-timeout'/

/** Consumers kept on one channel by successive grows before they are merged into one. */
export const MAX_CONSUMERS = 16

/** What of amqplib's channel consuming uses. */
export type ConsumerChannel = Pick<
  Amqp.Channel,
  "prefetch" | "consume" | "cancel" | "ack" | "nack" | "reject"
>

/** The consumer channel of a connection, with what its deliveries' leases die with. */
export interface Consuming {
  readonly channel: ConsumerChannel
  readonly leases: LeaseLoss
  readonly deliveries: ChannelDeliveries
  /**
   * Completed, with why, when the broker cancels a consumer: the session ends, and the next one
   * consumes.
   */
  readonly ended: Deferred.Deferred<string>
  /** The broker's version, as its connection said (`3.10.8`), if it did. */
  readonly brokerVersion?: string | undefined
}

/** A new consumer channel, its leases alive. */
export const consuming = (
  channel: ConsumerChannel,
  ended: Deferred.Deferred<string>,
  brokerVersion?: string,
): Consuming => {
  const leases = new LeaseLoss()
  return { channel, leases, deliveries: channelDeliveries(channel, leases), ended, brokerVersion }
}

/** Whether a broker of `version` honours `x-consumer-timeout`: RabbitMQ 3.12 and later do. */
export const takesConsumerTimeout = (version: string | undefined): boolean => {
  const match = version === undefined ? null : /^(\d+)\.(\d+)/.exec(version)
  if (match === null) return true
  const major = Number(match[1])
  return major > 3 || (major === 3 && Number(match[2]) >= 12)
}

/**
 * What a lease the worker cannot ask for comes to, and the one command that makes it as long as
 * `WORKER_CONSUMER_TIMEOUT_S`: the broker's own lease, which no client can read.
 */
const leaseWarning = (why: string, millis: number, command: string): string =>
  `${why}: the lease is the broker's own, which the worker cannot read (its node's ` +
  `consumer_timeout, 30 min unless raised). WORKER_CONSUMER_TIMEOUT_S ` +
  `(${Math.round(millis / 1000)} s) holds only if that is as long: ${command} ` +
  "(docs/deployment.md, Leases)"

export interface ConsumersOptions {
  /** The broker URL, for the message of a refused prefetch. */
  readonly url: string
  readonly inQueue: string
  readonly capacity: number
  /** Asked for with `x-consumer-timeout` (see `AmqpTransportOptions`). */
  readonly consumerTimeout?: Duration.Input | undefined
  /** Where deliveries go, for `take`. */
  readonly inbox: Inbox<Delivery, TransportError>
}

export interface Consumers {
  /** Whether intake has stopped: a new connection then opens no consumer channel. */
  readonly stopped: () => boolean
  /** Takes a new connection's consumer channel: `setCapacity` resizes on it from now. */
  readonly attach: (target: Consuming) => void
  /** Consumes on the channel up to the capacity, once its queue is declared. */
  readonly fill: (target: Consuming) => Effect.Effect<void, TransportError>
  /** Forgets the channel and its consumers: they are gone with their connection. */
  readonly detach: () => void
  /** Cancels every consumer, each awaited (and bounded). */
  readonly cancelAll: Effect.Effect<void>
  /** The capacity from now: applied at once on a channel, else by the next connection. */
  readonly setCapacity: (capacity: number) => Effect.Effect<void>
  /** Stops intake, once: cancels the consumers, gives back what was not taken, ends `take`. */
  readonly stopIntake: Effect.Effect<void>
  /** Ends intake with a configuration error: `take` fails with it. */
  readonly fail: (error: TransportError) => void
}

interface Consumer {
  readonly channel: ConsumerChannel
  readonly tag: string
  readonly prefetch: number
}

/** Waiting for cancel-ok means every ack sent before it has reached the broker. */
const cancelOne = (consumer: Consumer): Effect.Effect<void> =>
  closeStep(Effect.tryPromise({
    try: () => consumer.channel.cancel(consumer.tag),
    catch: (e) => new TransportError({ reason: "closed", message: messageOf(e) }),
  }))

/** Starts a consumer with `prefetch` on the channel, its deliveries offered to the inbox. */
const startConsumer = (
  target: Consuming,
  prefetch: number,
  options: ConsumersOptions,
  consumeOptions: Amqp.Options.Consume,
): Effect.Effect<Consumer, TransportError> =>
  Effect.gen(function* () {
    const { channel, ended, leases, deliveries } = target
    const inbox = options.inbox
    // AMQP's prefetch count is 16 bits: a larger window is as good as unbounded here.
    yield* Effect.tryPromise({
      try: () => channel.prefetch(Math.min(prefetch, 65_535)),
      catch: (e) => connectError(e, options.url),
    })
    const { consumerTag } = yield* Effect.tryPromise({
      try: () =>
        channel.consume(options.inQueue, (message) => {
          if (message === null) {
            // basic.cancel from the server (the queue was deleted, or the consumer timed out).
            leases.lose("consumer_cancelled")
            Deferred.doneUnsafe(ended, Effect.succeed("the broker cancelled the consumer"))
            return
          }
          inbox.offer(toDelivery(message, deliveries))
        }, consumeOptions),
      catch: (e) =>
        new TransportError({
          reason: "consume",
          message: `Consuming "${options.inQueue}" failed: ${messageOf(e)}`,
        }),
    })
    return { channel, tag: consumerTag, prefetch }
  })

/** The consumers of the transport's connections, one connection's channel at a time. */
export const make = (options: ConsumersOptions): Effect.Effect<Consumers> =>
  Effect.map(Semaphore.make(1), (resizing) => {
    const inbox = options.inbox
    // RabbitMQ 4 refuses the argument on a classic queue (406, "invalid arg
    // 'x-consumer-timeout'"): that refusal closes the channel, and every later consumer goes
    // without it, the node's consumer_timeout ruling there.
    const timeoutMillis = options.consumerTimeout === undefined
      ? undefined
      : Duration.toMillis(Duration.fromInputUnsafe(options.consumerTimeout))
    let consumeOptions: Amqp.Options.Consume = {
      noAck: false,
      ...(timeoutMillis === undefined
        ? {}
        : { arguments: { "x-consumer-timeout": timeoutMillis } }),
    }
    const refusedTimeout = (error: TransportError) =>
      Effect.suspend(() => {
        if (consumeOptions.arguments === undefined || !TIMEOUT_REFUSED.test(error.message)) {
          return Effect.fail(error)
        }
        consumeOptions = { noAck: false }
        return Effect.andThen(
          Effect.logWarning(
            leaseWarning(
              `The broker takes no x-consumer-timeout on "${options.inQueue}" (a classic queue ` +
                "on RabbitMQ 4), so the worker consumes without it",
              timeoutMillis!,
              `rabbitmqctl set_policy -p <vhost> worker-lease '^${options.inQueue}$' ` +
                `'{"consumer-timeout":${timeoutMillis}}' --apply-to queues (or add the key to ` +
                "the queue's own policy)",
            ),
          ),
          Effect.fail(error),
        )
      })
    /**
     * A broker older than 3.12 ignores the argument: said once, and the argument dropped, so
     * that nothing pretends to ask for a lease.
     */
    const olderBroker = (target: Consuming): Effect.Effect<void> => {
      if (consumeOptions.arguments === undefined || takesConsumerTimeout(target.brokerVersion)) {
        return Effect.void
      }
      consumeOptions = { noAck: false }
      return Effect.logWarning(
        leaseWarning(
          `RabbitMQ ${target.brokerVersion} takes no x-consumer-timeout (3.12 and later do)`,
          timeoutMillis!,
          `rabbitmqctl eval 'application:set_env(rabbit, consumer_timeout, ${timeoutMillis}).' ` +
            `on every node, then restart the workers, and consumer_timeout = ${timeoutMillis} ` +
            "in their rabbitmq.conf",
        ),
      )
    }
    let capacity = options.capacity
    let consumers: Array<Consumer> = []
    let consuming: Consuming | undefined
    let stopped = false

    const cancelAll = Effect.suspend(() => {
      const all = consumers
      consumers = []
      return Effect.forEach(all, cancelOne, { concurrency: "unbounded", discard: true })
    })

    const consumeOn = (target: Consuming, prefetch: number) =>
      Effect.flatMap(
        Effect.catch(startConsumer(target, prefetch, options, consumeOptions), refusedTimeout),
        (made) => {
          // Intake stopped while the broker was making it: `stopIntake` could not cancel it.
          if (stopped) return cancelOne(made)
          consumers.push(made)
          return Effect.void
        },
      )

    /**
     * Brings the consumers' windows to the capacity: growing adds a consumer with the difference
     * (the deliveries in hand keep counting against their own consumers' windows); shrinking
     * cancels the newest consumers (cancel-ok awaited) until the windows fit, then tops up with
     * one consumer. Past {@link MAX_CONSUMERS}, they are replaced by one consumer of the capacity.
     */
    const resize = (target: Consuming) =>
      Effect.gen(function* () {
        let window = consumers.reduce((sum, c) => sum + c.prefetch, 0)
        if (capacity > window && consumers.length >= MAX_CONSUMERS) {
          yield* cancelAll
          window = 0
        }
        while (window > capacity) {
          const newest = consumers.pop()!
          window -= newest.prefetch
          yield* cancelOne(newest)
        }
        if (capacity > window && !stopped) yield* consumeOn(target, capacity - window)
      })

    const stopIntake = Effect.suspend(() => {
      // Idempotent: a drain stops intake, then the scope's finalizer does again, and a second
      // `takeAll` on the shut-down inbox would interrupt that finalizer.
      if (stopped) return Effect.void
      stopped = true
      return cancelAll.pipe(
        // Delivered but never taken: give them back now, unprocessed (a nack, which RabbitMQ 4 does not
        // count), rather than when the channel closes (which counts as a failed delivery).
        Effect.andThen(
          Effect.suspend(() =>
            Effect.forEach(inbox.takeAll(), (d) => Effect.ignore(d.release), { discard: true })
          ),
        ),
        Effect.andThen(Effect.sync(() => inbox.close())),
      )
    })

    return {
      stopped: () => stopped,
      attach: (target) => {
        consuming = target
      },
      fill: (target) =>
        resizing.withPermits(1)(Effect.andThen(olderBroker(target), resize(target))),
      detach: () => {
        consuming = undefined
        consumers = []
      },
      cancelAll,
      setCapacity: (n) =>
        resizing.withPermits(1)(Effect.suspend(() => {
          capacity = n
          const target = consuming
          // Without a channel, or with intake stopped, the next connection applies it.
          if (target === undefined || stopped) return Effect.void
          return Effect.ignore(resize(target))
        })),
      stopIntake,
      fail: (error) => {
        stopped = true
        inbox.close(error)
      },
    }
  })
