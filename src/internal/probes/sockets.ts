/**
 * The probe server's bounds on its sockets (see `src/Probes.ts` for why they are what they are):
 * at most `maxConnections` requests answered at once and as many sockets held past their grace,
 * each socket living at most `connectionTimeout`, one whose request head has not arrived within
 * `headerTimeout` dropped, and the oldest incomplete one giving way to a new connection.
 *
 * Plain callbacks and timers rather than Effects: it runs on every connection accepted, slow
 * clients' included, and must cost no more than refusing them (`bench/probes.ts` and
 * `test/timed/ProbesSlowloris.test.ts`).
 */
import type { Socket } from "node:net"

/** The bounds, resolved. */
export interface SocketBounds {
  readonly maxConnections: number
  readonly connectionTimeoutMillis: number
  readonly headerTimeoutMillis: number
  readonly graceMillis: number
}

/** A socket held by the server. */
interface Slot {
  /** Its request head has not arrived yet: it gives way to a new connection. */
  incomplete: boolean
  /** Closes it at the end of its life (`connectionTimeout`). */
  readonly deadline: ReturnType<typeof setTimeout>
  /** Closes it if its request head has not arrived by then (`headerTimeout`). */
  readonly headerDeadline: ReturnType<typeof setTimeout>
  /** In its grace (`connectionGrace`): it gives way to no new connection below the hard limit. */
  young: boolean
  /** Ends its grace. */
  readonly grace: ReturnType<typeof setTimeout>
}

export class ProbeSockets {
  /** The sockets held, in the order they were accepted: the first incomplete one is the oldest. */
  private readonly held = new Map<Socket, Slot>()
  /** How many of them are being answered (their request head has arrived): at most `max`. */
  private answering = 0
  private readonly max: number
  private readonly hardLimit: number
  private readonly bounds: SocketBounds

  constructor(bounds: SocketBounds) {
    this.bounds = bounds
    this.max = bounds.maxConnections
    this.hardLimit = 2 * bounds.maxConnections
  }

  /** A new connection (the server's `connection` event): held, or closed at once. */
  accept(socket: Socket): void {
    if (this.held.size >= this.max) {
      // A socket in its grace may hold a request that the runtime has not read yet: the oldest
      // incomplete one past its grace gives way, and only at the hard limit one in its grace.
      const victim = this.oldestIncomplete(true) ??
        (this.held.size >= this.hardLimit ? this.oldestIncomplete(false) : undefined)
      if (victim !== undefined) this.drop(victim)
      // Below the hard limit, the new socket is held over the bound for its grace. At the limit,
      // at least half the sockets held are incomplete (at most `max` are answered): none gives
      // way only when `max` is 0.
      else if (this.held.size >= this.hardLimit) {
        socket.destroy()
        return
      }
    }
    const slot: Slot = {
      incomplete: true,
      young: true,
      deadline: setTimeout(() => this.drop(socket), this.bounds.connectionTimeoutMillis),
      // Cleared when its head arrives.
      headerDeadline: setTimeout(() => this.drop(socket), this.bounds.headerTimeoutMillis),
      grace: setTimeout(() => {
        slot.young = false
        this.trim()
      }, this.bounds.graceMillis),
    }
    this.held.set(socket, slot)
    socket.once("close", () => this.release(socket))
  }

  /**
   * A request's head has arrived on `socket` (`req.socket` is the socket of the `connection`
   * event, on Node and on Deno alike): whether it is answered. It then no longer gives way; when
   * `max` requests are being answered, it is closed unanswered.
   */
  admit(socket: Socket): boolean {
    const slot = this.held.get(socket)
    if (slot === undefined) return true
    // One request per connection: should a runtime ever hand over a second request pipelined
    // behind the first (Node and Deno do not, after a `connection: close` answer), it is not
    // answered, or it would count as answering once more and be given back once.
    if (!slot.incomplete || this.answering >= this.max) {
      this.drop(socket)
      return false
    }
    slot.incomplete = false
    this.answering++
    clearTimeout(slot.headerDeadline)
    return true
  }

  /** Frees the socket's slot and closes it. */
  drop(socket: Socket): void {
    this.release(socket)
    socket.destroy()
  }

  /** Closes every socket held, idle or busy: the server's end. */
  dropAll(): void {
    for (const socket of [...this.held.keys()]) this.drop(socket)
  }

  // A socket's slot is freed as it is destroyed (which closes it at once, on Node and on Deno),
  // not on its `close` event a turn later: each connection accepted in the same turn then counts
  // the sockets truly held, and evicts another one (never the same one twice).
  private release(socket: Socket): void {
    const slot = this.held.get(socket)
    if (slot === undefined) return
    clearTimeout(slot.deadline)
    clearTimeout(slot.headerDeadline)
    clearTimeout(slot.grace)
    if (!slot.incomplete) this.answering--
    this.held.delete(socket)
  }

  /** The oldest socket whose request head has not arrived, past its grace or not. */
  private oldestIncomplete(pastGrace: boolean): Socket | undefined {
    for (const [socket, slot] of this.held) {
      if (slot.incomplete && !(pastGrace && slot.young)) return socket
    }
    return undefined
  }

  // Over `max`, the oldest incomplete sockets past their grace give way: run as each grace ends,
  // it leaves at most `max` sockets held past their grace (those being answered are at most as
  // many).
  private trim(): void {
    while (this.held.size > this.max) {
      const victim = this.oldestIncomplete(true)
      if (victim === undefined) return
      this.drop(victim)
    }
  }
}
