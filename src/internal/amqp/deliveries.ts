/**
 * The deliveries of a consumer channel: what each one shares with its channel (the lease, which
 * dies with the channel, and how it is settled) is made once per channel, so that a delivery costs
 * a few small objects.
 */
import type * as Amqp from "amqplib"
import { Effect, Option } from "effect"
import type { LeaseLoss } from "../transport/leaseLoss.ts"
import { type Delivery, type Lease, Redeliveries } from "../../Transport.ts"
import { LeaseLost } from "../../WorkerError.ts"

/** What of amqplib's channel settling uses. */
export type SettlingChannel = Pick<Amqp.Channel, "ack" | "nack">

/** What every delivery of one consumer channel shares. */
export interface ChannelDeliveries {
  readonly lease: Lease
  readonly settle: (
    message: Amqp.ConsumeMessage,
    requeue: boolean,
  ) => Effect.Effect<void, LeaseLost>
}

const FIRST_DELIVERY = Redeliveries.Counted({ count: 0 })
const REDELIVERED = Redeliveries.Flagged({ redelivered: true })

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
export const toDelivery = (message: Amqp.ConsumeMessage, shared: ChannelDeliveries): Delivery => {
  const headers = message.properties.headers
  const count = headers?.["x-delivery-count"]
  return {
    body: message.content,
    headers,
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
