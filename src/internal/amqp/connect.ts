/**
 * The amqplib connection a session starts from, and the one patch of amqplib's internals: its
 * writes coalesced. The patch reaches into objects amqplib does not type or document, so
 * `test/internal/amqp/connect.test.ts` fails when their shape changes, on both runtimes.
 */
import type * as Amqp from "amqplib"
import { connect as amqplibConnect } from "amqplib"

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

/** Connects with Nagle's algorithm off (a publish waits on its confirm), within 10 s. */
export const connect = (url: string): Promise<Amqp.ChannelModel> =>
  amqplibConnect(url, { noDelay: true, timeout: 10_000 }).then((model) => {
    coalesceWrites(model)
    return model
  })
