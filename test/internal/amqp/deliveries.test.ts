import { describe, expect, it } from "@effect/vitest"
import type * as Amqp from "amqplib"
import { Effect } from "effect"
import { channelDeliveries, toDelivery } from "../../../src/internal/amqp/deliveries.ts"
import { LeaseLoss } from "../../../src/internal/transport/leaseLoss.ts"
import { Redeliveries } from "../../../src/Transport.ts"
import { LeaseLost } from "../../../src/WorkerError.ts"

const message = (
  fields: { readonly redelivered: boolean; readonly headers?: Record<string, unknown> },
) =>
  ({
    content: new Uint8Array(),
    fields: { deliveryTag: 1, redelivered: fields.redelivered },
    properties: { headers: fields.headers },
  }) as unknown as Amqp.ConsumeMessage

const settling = (log: Array<string>) => ({
  ack: () => void log.push("ack"),
  nack: (_: unknown, __?: boolean, requeue?: boolean) => void log.push(`nack ${requeue}`),
  reject: (_: unknown, requeue?: boolean) => void log.push(`reject ${requeue}`),
})

describe("a consumer channel's deliveries", () => {
  it("count redeliveries with x-delivery-count, or tell a classic queue's redelivery by its flag", () => {
    const shared = channelDeliveries(settling([]), new LeaseLoss())
    const of = (m: Amqp.ConsumeMessage) => toDelivery(m, shared).redeliveries
    expect(of(message({ redelivered: true, headers: { "x-delivery-count": 2 } }))).toEqual(
      Redeliveries.Counted({ count: 2 }),
    )
    expect(of(message({ redelivered: false }))).toEqual(Redeliveries.Counted({ count: 0 }))
    expect(of(message({ redelivered: true }))).toEqual(
      Redeliveries.Flagged({ redelivered: true }),
    )
  })

  it("on RabbitMQ 4, read x-acquired-count beside x-delivery-count: a quorum queue whose message was only nacked is no classic one", () => {
    const shared = channelDeliveries(settling([]), new LeaseLoss())
    const of = (m: Amqp.ConsumeMessage) => toDelivery(m, shared).redeliveries
    // Nacked three times (a shutdown's requeues): no failed delivery, three earlier hand-outs.
    expect(of(message({ redelivered: true, headers: { "x-acquired-count": 3 } }))).toEqual(
      Redeliveries.Counted({ count: 0, acquired: 3 }),
    )
    expect(
      of(message({
        redelivered: true,
        headers: { "x-delivery-count": 2, "x-acquired-count": 5 },
      })),
    ).toEqual(Redeliveries.Counted({ count: 2, acquired: 5 }))
  })

  it.effect("settle on their channel while its lease lives; then fail with why it was lost", () =>
    Effect.gen(function* () {
      const log: Array<string> = []
      const leases = new LeaseLoss()
      const delivery = toDelivery(
        message({ redelivered: false }),
        channelDeliveries(settling(log), leases),
      )
      yield* delivery.ack
      yield* delivery.requeue
      yield* delivery.release
      // A failed attempt is rejected (counted by every RabbitMQ), an unprocessed one nacked.
      expect(log).toEqual(["ack", "reject true", "nack true"])
      leases.lose("channel_closed")
      expect(delivery.lease.isLost()).toBe(true)
      expect(yield* delivery.lease.lost).toEqual(new LeaseLost({ reason: "channel_closed" }))
      expect(yield* Effect.flip(delivery.ack)).toEqual(new LeaseLost({ reason: "channel_closed" }))
    }))

  it.effect("a settle the closed channel throws on is a lost lease", () =>
    Effect.gen(function* () {
      const closed = {
        ack: () => {
          throw new Error("Channel closed")
        },
        nack: () => {},
        reject: () => {},
      }
      const delivery = toDelivery(
        message({ redelivered: false }),
        channelDeliveries(closed, new LeaseLoss()),
      )
      expect(yield* Effect.flip(delivery.ack)).toEqual(new LeaseLost({ reason: "channel_closed" }))
    }))
})
