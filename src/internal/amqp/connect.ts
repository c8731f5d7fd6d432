/**
 * The amqplib connection a session starts from, and the two patches of amqplib's internals: its
 * writes coalesced, and the broker's reason kept when it refuses the handshake. The patches reach
 * into objects amqplib does not type or document, so `test/internal/amqp/connect.test.ts` fails
 * when their shape changes, on both runtimes.
 */
import type * as Amqp from "amqplib"
import { connect as amqplibConnect } from "amqplib"
import { createRequire } from "node:module"

/**
 * amqplib writes the frames its channels have buffered one `write` at a time, each a system call
 * with `noDelay`: corked around its flush, they leave in one `writev`. Reaches into amqplib's
 * connection (its multiplexer's flush and output stream); left as it is if their shape differs.
 * Returns whether the patch was applied.
 */
export const coalesceWrites = (model: Amqp.ChannelModel): boolean => {
  const muxer = (model as { connection?: { muxer?: unknown } }).connection?.muxer as
    | { _readIncoming?: () => void; out?: { cork?: () => void; uncork?: () => void } }
    | undefined
  const flush = muxer?._readIncoming
  const out = muxer?.out
  if (
    typeof flush !== "function" || typeof out?.cork !== "function" ||
    typeof out.uncork !== "function"
  ) {
    return false
  }
  muxer!._readIncoming = () => {
    out.cork!()
    try {
      flush.call(muxer)
    } finally {
      out.uncork!()
    }
  }
  return true
}

/**
 * Gives a connection up at once: its socket destroyed, which amqplib reads as the connection's
 * loss (every confirm awaited fails, and the broker requeues what the connection held once it
 * notices). A close would wait for the broker's answer, which a dead or stalled path never
 * sends. Reaches into amqplib's connection (its socket); returns whether it could.
 */
export const destroySocket = (model: unknown, why: Error): boolean => {
  const stream = (model as { connection?: { stream?: { destroy?: (error?: Error) => void } } })
    ?.connection?.stream
  if (typeof stream?.destroy !== "function") return false
  stream.destroy(why)
  return true
}

/** What of a connection's socket and tuning {@link hearing} reads. */
export interface Hearing {
  /** The bytes the broker has sent so far, heartbeats included. */
  readonly bytesRead: () => number
  /** The heartbeat the broker and amqplib agreed, in seconds (0: none). */
  readonly heartbeatSeconds: number
}

/**
 * How to tell whether the broker is still heard from: its socket's byte count and the heartbeat
 * agreed in the handshake. Reaches into amqplib's connection (its socket and tuning); undefined
 * if their shape differs.
 */
export const hearing = (model: unknown): Hearing | undefined => {
  const connection = (model as {
    connection?: { stream?: { bytesRead?: unknown }; heartbeat?: unknown }
  })?.connection
  const stream = connection?.stream
  const heartbeatSeconds = connection?.heartbeat
  if (typeof stream?.bytesRead !== "number" || typeof heartbeatSeconds !== "number") {
    return undefined
  }
  return { bytesRead: () => stream.bytesRead as number, heartbeatSeconds }
}

/** Why the broker closed a connection during its handshake: Connection.Close's fields. */
export interface CloseReason {
  readonly replyCode: number
  readonly replyText: string
}

/** The broker's reason that `keepCloseReasons` attached to a failed handshake's error, if any. */
export const closeReasonOf = (error: unknown): CloseReason | undefined => {
  const { replyCode, replyText } = (error ?? {}) as { replyCode?: unknown; replyText?: unknown }
  return typeof replyCode === "number" && typeof replyText === "string"
    ? { replyCode, replyText }
    : undefined
}

/** What of amqplib's `Connection` (its prototype) the handshake patch wraps. */
interface Handshaking {
  open(fields: unknown, callback: (error: unknown, ok?: unknown) => void): unknown
  recvFrame(): unknown
}

/** A frame as amqplib decodes it; a method frame has an `id` and `fields`. */
interface Frame {
  readonly id?: unknown
  readonly channel?: unknown
  readonly fields?: { readonly replyCode?: unknown; readonly replyText?: unknown }
}

const PATCHED = Symbol.for("@async-task/worker/amqp/keepCloseReasons")

/**
 * A refused Connection.Open (an unknown vhost, one the user may not use) fails in amqplib with
 * `Expected ConnectionOpenOk; got <ConnectionClose channel:0>`, the broker's reply code and text
 * dropped. Wraps amqplib's `Connection.prototype.open`: during the handshake only, the
 * connection's frame reading notes a Connection.Close (`closeId`, amqplib's method id) on
 * channel 0, and the error the handshake ends with carries its `replyCode` and `replyText` (see
 * {@link closeReasonOf}). Left as it is if the shape differs, and patched once however many
 * copies of the SDK share one amqplib. Returns whether the patch is applied.
 */
export const keepCloseReasons = (connectionClass: unknown, closeId: unknown): boolean => {
  const proto = (connectionClass as { prototype?: Partial<Handshaking> } | undefined)?.prototype
  const open = proto?.open
  if (
    typeof open !== "function" || open.length !== 2 || typeof proto!.recvFrame !== "function" ||
    typeof closeId !== "number"
  ) {
    return false
  }
  if ((proto as { [PATCHED]?: boolean })[PATCHED] === true) return true
  proto!.open = function (this: Handshaking, fields, callback) {
    const recvFrame = this.recvFrame
    let reason: CloseReason | undefined
    this.recvFrame = function () {
      const frame = recvFrame.call(this) as Frame | false
      if (frame && frame.id === closeId && frame.channel === 0) {
        reason = closeReasonOf(frame.fields)
      }
      return frame
    }
    return open.call(this, fields, (error, ok) => {
      // The prototype's again: the connection's frames, once it is open, go through no wrapper.
      delete (this as Partial<Handshaking>).recvFrame
      if (reason !== undefined && typeof error === "object" && error !== null) {
        Object.assign(error, reason)
      }
      callback?.(error, ok)
    })
  }
  Object.defineProperty(proto, PATCHED, { value: true })
  return true
}

/**
 * The file of amqplib's main module, the copy `import "amqplib"` loads: resolved as that import
 * is (a module from JSR has no file to resolve from), else from this file (vitest on Deno, whose
 * `import.meta.resolve` refuses a bare name).
 */
const amqplibMain = (): string => {
  try {
    return import.meta.resolve("amqplib")
  } catch {
    return createRequire(import.meta.url).resolve("amqplib")
  }
}

/**
 * Where a one-file build leaves amqplib's own modules, which it cannot require: its entry module
 * imports them by their files (`examples/deploy/bundle/build.mjs`).
 */
const BUNDLED_AMQPLIB = Symbol.for("@async-task/worker/amqplib-modules")

/**
 * One of amqplib's own modules, which its package does not export: required beside its main
 * module, or as a one-file build left it. `undefined` where neither can give it.
 */
export const amqplibModule = (path: string): unknown => {
  try {
    return createRequire(amqplibMain())(path)
  } catch {
    return (globalThis as { [BUNDLED_AMQPLIB]?: Record<string, unknown> })[BUNDLED_AMQPLIB]?.[path]
  }
}

let handshakePatched: boolean | undefined

/** Whether refused handshakes carry the broker's reason: patched at the first connection. */
export const patchHandshake = (): boolean =>
  handshakePatched ??= keepCloseReasons(
    (amqplibModule("./lib/connection.js") as { Connection?: unknown } | undefined)?.Connection,
    (amqplibModule("./lib/defs.js") as { ConnectionClose?: unknown } | undefined)?.ConnectionClose,
  )

/** Connects with Nagle's algorithm off (a publish waits on its confirm), within 10 s. */
export const connect = (url: string): Promise<Amqp.ChannelModel> => {
  patchHandshake()
  return amqplibConnect(url, { noDelay: true, timeout: 10_000 }).then((model) => {
    coalesceWrites(model)
    return model
  })
}
