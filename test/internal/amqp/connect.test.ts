/**
 * The patches of amqplib's internals against the real amqplib and broker: fail when amqplib no
 * longer has the shape `coalesceWrites` and `keepCloseReasons` reach for, which would otherwise
 * leave a patch silently unapplied (every publish a system call of its own again; a refused vhost
 * retried forever, the broker's reason lost).
 */
import { execFileSync } from "node:child_process"
import { Buffer } from "node:buffer"
import type * as Amqp from "amqplib"
import amqp from "amqplib"
import { beforeAll, describe, expect, it } from "vitest"
import {
  amqplibModule,
  closeReasonOf,
  coalesceWrites,
  connect,
  hearing,
  keepCloseReasons,
  patchHandshake,
} from "../../../src/internal/amqp/connect.ts"
import { CLASSIC_VHOST, ensureVhosts, urlFor } from "../../integration/broker.ts"

/** A vhost guest has no permissions on (`add_vhost` grants none). */
const FORBIDDEN_VHOST = "async-task-worker-forbidden"

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

beforeAll(() => {
  ensureVhosts()
  try {
    execFileSync("rabbitmqctl", ["-q", "add_vhost", FORBIDDEN_VHOST], {
      stdio: "ignore",
      timeout: 60_000,
    })
  } catch {
    // It exists (made by an earlier run, or by test/integration/AmqpTransport.test.ts).
  }
}, 60_000)

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

describe("hearing on amqplib's connection", () => {
  it(
    "reads the heartbeat agreed and the bytes the broker sent, which grow with each reply",
    async () => {
      const model = await connect(`${urlFor(CLASSIC_VHOST)}?heartbeat=7`)
      try {
        const heard = hearing(model)
        expect(heard?.heartbeatSeconds).toBe(7)
        const before = heard!.bytesRead()
        expect(before).toBeGreaterThan(0)
        expect(await roundTrip(model)).toBe(10)
        expect(heard!.bytesRead()).toBeGreaterThan(before)
      } finally {
        await model.close()
      }
    },
    30_000,
  )

  it("a connection of another shape is not read", () => {
    expect(hearing({ connection: { stream: {}, heartbeat: 10 } })).toBeUndefined()
    expect(hearing({})).toBeUndefined()
  })
})

/** How `connect` fails, for a URL it cannot open. */
const refusal = (url: string): Promise<unknown> =>
  connect(url).then(
    async (model) => {
      await model.close()
      throw new Error(`${url} was opened`)
    },
    (error: unknown) => error,
  )

describe("keepCloseReasons on amqplib's handshake", () => {
  interface Handshaking {
    readonly open: (...args: ReadonlyArray<unknown>) => unknown
    readonly recvFrame: unknown
  }
  const connectionModule = () =>
    amqplibModule("./lib/connection.js") as { Connection?: { prototype: Handshaking } }

  it("finds amqplib's Connection (open of two parameters, recvFrame) and ConnectionClose's id, and patches open", () => {
    const { Connection } = connectionModule()
    expect(typeof Connection).toBe("function")
    const proto = Connection!.prototype
    expect(typeof proto.recvFrame).toBe("function")
    expect(typeof proto.open).toBe("function")
    expect(proto.open.length).toBe(2)
    expect((amqplibModule("./lib/defs.js") as { ConnectionClose?: unknown }).ConnectionClose)
      .toBe(655410)
    expect(patchHandshake()).toBe(true)
    expect(Object.getOwnPropertySymbols(proto).map(String)).toContain(
      "Symbol(@async-task/worker/amqp/keepCloseReasons)",
    )
  })

  it("the module it patches is the one amqplib connects with", async () => {
    const model = await amqp.connect(urlFor(CLASSIC_VHOST))
    try {
      const connection = (model as unknown as { connection: object }).connection
      expect(Object.getPrototypeOf(connection)).toBe(connectionModule().Connection!.prototype)
    } finally {
      await model.close()
    }
  }, 30_000)

  it("an unknown vhost: the error carries the broker's 530 and its text", async () => {
    const error = await refusal(urlFor("async-task-worker-no-such-vhost"))
    expect(String(error)).toContain("Expected ConnectionOpenOk")
    expect(closeReasonOf(error)).toEqual({
      replyCode: 530,
      replyText: "NOT_ALLOWED - vhost async-task-worker-no-such-vhost not found",
    })
  }, 30_000)

  it("a vhost the user may not use: 530, with the broker's text", async () => {
    const error = await refusal(urlFor(FORBIDDEN_VHOST))
    expect(closeReasonOf(error)).toEqual({
      replyCode: 530,
      replyText: `NOT_ALLOWED - access to vhost '${FORBIDDEN_VHOST}' refused for user 'guest'`,
    })
  }, 30_000)

  it("refused credentials: 403, with the broker's text", async () => {
    const error = await refusal(urlFor(CLASSIC_VHOST, "not-the-password"))
    expect(closeReasonOf(error)?.replyCode).toBe(403)
    expect(closeReasonOf(error)?.replyText).toContain("ACCESS_REFUSED")
  }, 30_000)

  it("an open connection reads its frames with amqplib's own recvFrame again", async () => {
    const model = await connect(urlFor(CLASSIC_VHOST))
    try {
      const connection = (model as unknown as { connection: object }).connection
      expect(Object.hasOwn(connection, "recvFrame")).toBe(false)
      expect(await roundTrip(model)).toBe(10)
    } finally {
      await model.close()
    }
  }, 30_000)

  it("a class of another shape is left as it is", () => {
    class OtherConnection {
      open(fields: unknown) {
        return fields
      }
      recvFrame() {
        return false
      }
    }
    const open = OtherConnection.prototype.open
    expect(keepCloseReasons(OtherConnection, 655410)).toBe(false)
    expect(keepCloseReasons(undefined, 655410)).toBe(false)
    expect(OtherConnection.prototype.open).toBe(open)
  })

  it("a handshake the broker closes gives its error the close's code and text, once patched", () => {
    const close = { id: 655410, channel: 0, fields: { replyCode: 530, replyText: "NOT_ALLOWED" } }
    class FakeConnection {
      frames: Array<unknown> = [{ id: 655401, channel: 0, fields: {} }, close]
      open(_fields: unknown, callback: (error: unknown) => void) {
        this.recvFrame()
        this.recvFrame()
        callback(new Error("Expected ConnectionOpenOk; got <ConnectionClose channel:0>"))
      }
      recvFrame(): unknown {
        return this.frames.shift() ?? false
      }
    }
    expect(keepCloseReasons(FakeConnection, 655410)).toBe(true)
    const patched = FakeConnection.prototype.open
    expect(keepCloseReasons(FakeConnection, 655410)).toBe(true)
    expect(FakeConnection.prototype.open).toBe(patched)
    const connection = new FakeConnection()
    let failure: unknown
    connection.open({}, (error) => (failure = error))
    expect(closeReasonOf(failure)).toEqual({ replyCode: 530, replyText: "NOT_ALLOWED" })
    expect(Object.hasOwn(connection, "recvFrame")).toBe(false)
  })
})
