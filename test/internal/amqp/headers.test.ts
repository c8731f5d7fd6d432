import { describe, expect, it } from "@effect/vitest"
import type * as Amqp from "amqplib"
import { Duration, Effect, Fiber } from "effect"
import * as Confirms from "../../../src/internal/amqp/confirms.ts"
import { channelDeliveries, toDelivery } from "../../../src/internal/amqp/deliveries.ts"
import { LeaseLoss } from "../../../src/internal/transport/leaseLoss.ts"
import { eventually, FakeChannel } from "./fakes.ts"

const TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

describe("AMQP headers", () => {
  it.effect("a publish given headers sets them as the message's AMQP headers", () =>
    Effect.gen(function* () {
      const confirms = yield* Confirms.make({
        outQueue: "out",
        confirmTimeout: Duration.seconds(10),
      })
      const channel = new FakeChannel("publisher")
      const on = { publisher: channel, returned: confirms.track(channel) }
      const body = new TextEncoder().encode(`{"task_id":"t-1"}`)
      const fiber = yield* Effect.forkChild(
        confirms.publish(on, body, "started", { traceparent: TRACEPARENT }),
      )
      yield* eventually(() => channel.published.length > 0)
      const sent = channel.published[0]!
      expect(sent.options?.headers).toEqual({ traceparent: TRACEPARENT })
      expect(sent.options?.type).toBe("started")
      sent.confirm(null)
      yield* Fiber.join(fiber)
    }))

  it("a delivery carries its message's headers as amqplib decoded them, or none", () => {
    const shared = channelDeliveries(
      { ack: () => {}, nack: () => {}, reject: () => {} },
      new LeaseLoss(),
    )
    const message = (headers: Record<string, unknown> | undefined) =>
      ({
        content: new Uint8Array(),
        fields: { deliveryTag: 1, redelivered: false },
        properties: { headers },
      }) as unknown as Amqp.ConsumeMessage
    const headers = { traceparent: TRACEPARENT, "x-delivery-count": 1 }
    const delivery = toDelivery(message(headers), shared)
    expect(delivery.headers).toBe(headers)
    expect(delivery.redeliveries).toMatchObject({ _tag: "Counted", count: 1 })
    expect(toDelivery(message(undefined), shared).headers).toBeUndefined()
  })
})
