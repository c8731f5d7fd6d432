/**
 * The patch of amqplib's internals against the real amqplib and broker: fails when amqplib's
 * connection no longer has the shape `coalesceWrites` reaches for, which would otherwise leave the
 * patch silently unapplied (and every publish a system call of its own again).
 */
import { Buffer } from "node:buffer"
import type * as Amqp from "amqplib"
import amqp from "amqplib"
import { beforeAll, describe, expect, it } from "vitest"
import { coalesceWrites, connect } from "../../../src/internal/amqp/connect.ts"
import { CLASSIC_VHOST, ensureVhosts, urlFor } from "../../integration/broker.ts"

interface Muxer {
  readonly _readIncoming: unknown
  readonly out: { readonly cork: unknown; readonly uncork: unknown }
}

const muxerOf = (model: Amqp.ChannelModel): Muxer =>
  (model as unknown as { connection: { muxer: Muxer } }).connection.muxer

/** A round trip through the patched flush: a publish confirmed, and counted on its queue. */
const roundTrip = async (model: Amqp.ChannelModel) => {
  const channel = await model.createConfirmChannel()
  const { queue } = await channel.assertQueue("", { exclusive: true })
  for (let i = 0; i < 10; i++) channel.sendToQueue(queue, Buffer.from(`${i}`))
  await channel.waitForConfirms()
  return (await channel.checkQueue(queue)).messageCount
}

beforeAll(() => ensureVhosts(), 60_000)

describe("coalesceWrites on amqplib's connection", () => {
  it(
    "finds the multiplexer's flush and its stream's cork and uncork, and patches the flush",
    async () => {
      const model = await amqp.connect(urlFor(CLASSIC_VHOST))
      try {
        const muxer = muxerOf(model)
        expect(typeof muxer._readIncoming).toBe("function")
        expect(typeof muxer.out.cork).toBe("function")
        expect(typeof muxer.out.uncork).toBe("function")
        expect(Object.hasOwn(muxer, "_readIncoming")).toBe(false)
        expect(coalesceWrites(model)).toBe(true)
        expect(Object.hasOwn(muxer, "_readIncoming")).toBe(true)
        expect(await roundTrip(model)).toBe(10)
      } finally {
        await model.close()
      }
    },
    30_000,
  )

  it("the transport's connections are patched", async () => {
    const model = await connect(urlFor(CLASSIC_VHOST))
    try {
      expect(Object.hasOwn(muxerOf(model), "_readIncoming")).toBe(true)
      expect(await roundTrip(model)).toBe(10)
    } finally {
      await model.close()
    }
  }, 30_000)

  it("a connection of another shape is left as it is", () => {
    const model = { connection: { muxer: { _readIncoming: () => {}, out: {} } } }
    expect(coalesceWrites(model as unknown as Amqp.ChannelModel)).toBe(false)
    expect(Object.keys(model.connection.muxer)).toEqual(["_readIncoming", "out"])
  })
})
