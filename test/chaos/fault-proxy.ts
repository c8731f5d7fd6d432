/**
 * A TCP proxy of the cluster fault suite, in its own process, in front of one node for one
 * worker: a partition without iptables. `drop()` black-holes the path (no byte goes through
 * either way, and no close either: the sockets stay open, as behind a dead switch), `stall()`
 * holds every byte and close until `pass()` delivers them in order, as a link that comes back.
 * Connections made meanwhile suffer the same. `pass()` ends either: a dropped connection, whose
 * byte stream has holes, is closed then; a stalled one goes on (or ends, as its ends did).
 */
import { createServer, type Server, Socket } from "node:net"
import type { Buffer } from "node:buffer"

export type ProxyMode = "pass" | "drop" | "stall"

interface Pair {
  readonly client: Socket
  readonly upstream: Socket
  readonly openedAt: number
  /** Whether the mode the pair was put in since its opening has made its stream unusable. */
  holed: boolean
  /** Bytes and ends held during a stall, in order, for each direction. */
  readonly held: Array<{ readonly to: Socket; readonly chunk: Buffer | "end" }>
  /** Whether the worker's side has ended (its close, perhaps held). */
  clientEnded: boolean
}

export interface FaultProxy {
  readonly port: number
  readonly target: number
  /** Connections carried now whose worker's side is open: the worker is on this node. */
  readonly openConnections: () => number
  /** When the newest connection still open was made (undefined: none). */
  readonly newestOpenedAt: () => number | undefined
  readonly mode: () => ProxyMode
  readonly drop: () => void
  readonly stall: () => void
  readonly pass: () => void
  readonly close: () => Promise<void>
}

/** Writes `chunk` to `to`, or ends it, unless it is gone. */
const deliver = (to: Socket, chunk: Buffer | "end") => {
  if (to.destroyed) return
  if (chunk === "end") to.destroy()
  else to.write(chunk)
}

/** A proxy on 127.0.0.1 (a free port) to 127.0.0.1:`target`. */
export const startProxy = async (target: number): Promise<FaultProxy> => {
  let mode: ProxyMode = "pass"
  const pairs = new Set<Pair>()
  const forward = (pair: Pair, to: Socket, chunk: Buffer | "end") => {
    if (mode === "drop") return
    if (mode === "stall") pair.held.push({ to, chunk })
    else deliver(to, chunk)
  }
  const server: Server = createServer((client) => {
    const upstream = new Socket()
    const pair: Pair = {
      client,
      upstream,
      openedAt: Date.now(),
      holed: mode === "drop",
      held: [],
      clientEnded: false,
    }
    pairs.add(pair)
    upstream.connect(target, "127.0.0.1")
    client.on("data", (chunk: Buffer) => forward(pair, upstream, chunk))
    upstream.on("data", (chunk: Buffer) => forward(pair, client, chunk))
    const ended = (from: Socket, to: Socket) => () => {
      if (from === client) pair.clientEnded = true
      forward(pair, to, "end")
      if (from.destroyed && to.destroyed) pairs.delete(pair)
    }
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      from.on("error", () => {})
      from.on("close", ended(from, to))
    }
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as { port: number }).port
  const open = () => [...pairs].filter((p) => !p.clientEnded && !p.client.destroyed)
  return {
    port,
    target,
    openConnections: () => open().length,
    newestOpenedAt: () =>
      open().reduce<number | undefined>((m, p) => Math.max(m ?? 0, p.openedAt), undefined),
    mode: () => mode,
    drop: () => {
      mode = "drop"
      for (const pair of pairs) pair.holed = true
    },
    stall: () => {
      mode = "stall"
    },
    pass: () => {
      mode = "pass"
      for (const pair of [...pairs]) {
        if (pair.holed) {
          pair.client.destroy()
          pair.upstream.destroy()
          pairs.delete(pair)
          continue
        }
        for (const { to, chunk } of pair.held.splice(0)) deliver(to, chunk)
      }
    },
    close: () => {
      for (const pair of pairs) pair.client.destroy(), pair.upstream.destroy()
      pairs.clear()
      return new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
