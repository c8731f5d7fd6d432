/**
 * The deliveries of a consumer channel: what each one shares with its channel (the lease, which
 * dies with the channel, and how it is settled) is made once per channel, so that a delivery costs
 * a few small objects.
 */
import type * as Amqp from "amqplib"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { LeaseLoss } from "../transport/leaseLoss.ts"
import { type Delivery, type Lease, Redeliveries } from "../../Transport.ts"
import { LeaseLost } from "../../WorkerError.ts"

/** What of amqplib's channel settling uses. */
export type SettlingChannel = Pick<Amqp.Channel, "ack" | "nack" | "reject">

/**
 * How a delivery is settled: acked; given back as a failed attempt (`basic.reject`, which every
 * RabbitMQ counts in `x-delivery-count`); or given back unprocessed (`basic.nack`, which 4.x does
 * not count, and whose quorum queues never drop it for its delivery-limit).
 */
export type Settlement = "ack" | "reject" | "nack"

/** What every delivery of one consumer channel shares. */
export interface ChannelDeliveries {
  readonly lease: Lease
  readonly settle: (
    message: Amqp.ConsumeMessage,
    settlement: Settlement,
  ) => Effect.Effect<void, LeaseLost>
}

const FIRST_DELIVERY = Redeliveries.Counted({ count: 0 })
const REDELIVERED = Redeliveries.Flagged({ redelivered: true })

const isCount = (n: unknown): n is number => typeof n === "number"

/** The lease and settlement of a channel's deliveries: lost with `leases`. */
export const channelDeliveries = (
  channel: SettlingChannel,
  leases: LeaseLoss,
): ChannelDeliveries => ({
  lease: {
    duration: Option.none(),
    renew: Option.none(),
    lost: Effect.callback<LeaseLost>((resume) =>
      Effect.sync(leases.onLost((lost) => resume(Effect.succeed(lost))))
    ),
    onLost: (listener) => leases.onLost(listener),
    isLost: () => leases.lost !== undefined,
  },
  settle: (message, settlement) =>
    Effect.suspend(() => {
      if (leases.lost !== undefined) return Effect.fail(leases.lost)
      try {
        if (settlement === "ack") channel.ack(message)
        else if (settlement === "reject") channel.reject(message, true)
        else channel.nack(message, false, true)
        return Effect.void
      } catch {
        return Effect.fail(new LeaseLost({ reason: "channel_closed" }))
      }
    }),
})

/**
 * What the broker says of a message's earlier deliveries. A quorum queue adds its headers only
 * from a message's second delivery on: `x-delivery-count` once a delivery failed (on 3.x, once
 * it came back at all), `x-acquired-count` (4.x) once it was handed out. A first delivery without
 * either is attempt 1 on any queue, and only a redelivery with neither tells a classic queue: a
 * quorum queue on 4.x whose message was only nacked has no `x-delivery-count`, but it has
 * `x-acquired-count`.
 */
export const redeliveriesOf = (
  headers: Amqp.MessagePropertyHeaders | undefined,
  redelivered: boolean,
): Redeliveries => {
  const count = headers?.["x-delivery-count"]
  const acquired = headers?.["x-acquired-count"]
  if (isCount(acquired)) return Redeliveries.Counted({ count: count ?? 0, acquired })
  if (count !== undefined) return Redeliveries.Counted({ count })
  return redelivered ? REDELIVERED : FIRST_DELIVERY
}

/** A delivery of a consumer channel: its lease and settlement are the channel's. */
export const toDelivery = (message: Amqp.ConsumeMessage, shared: ChannelDeliveries): Delivery => {
  const headers = message.properties.headers
  return {
    body: message.content,
    headers,
    redeliveries: redeliveriesOf(headers, message.fields.redelivered),
    lease: shared.lease,
    ack: shared.settle(message, "ack"),
    requeue: shared.settle(message, "reject"),
    release: shared.settle(message, "nack"),
  }
}
