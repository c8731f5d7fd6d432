/**
 * The MemoryBroker's state machine: queues, consumers with prefetch, leases with deadlines and
 * fencing. Synchronous and single-threaded by construction; `MemoryBroker.ts` wraps it in
 * Effect services.
 */
import { LeaseLost } from "../../WorkerError.ts"
import { Inbox } from "../transport/inbox.ts"
import { LeaseLoss } from "../transport/leaseLoss.ts"

export interface StoredMessage {
  readonly id: number
  readonly queue: QueueCore
  readonly body: Uint8Array
  readonly type: string | undefined
  /** The headers the publisher set, if any. */
  readonly headers: Readonly<Record<string, unknown>> | undefined
  /** The id the publisher gave the message, if any. */
  readonly messageId: string | undefined
  /** Its failed deliveries, as a quorum queue's `x-delivery-count`. */
  deliveryCount: number
  /** Its hand-outs to a consumer, as RabbitMQ 4's `x-acquired-count`. */
  acquiredCount: number
}

export type LeaseState = "held" | "settled" | "lost"

export interface Held {
  readonly message: StoredMessage
  /** The message's hand-outs before this one. */
  readonly acquired: number
  readonly consumer: ConsumerCore | undefined
  readonly leaseMillis: number | undefined
  deadline: number
  state: LeaseState
  readonly loss: LeaseLoss
}

export interface QueueCore {
  readonly name: string
  readonly ready: Array<StoredMessage>
  head: number
  readonly log: Array<StoredMessage>
  readonly consumers: Array<ConsumerCore>
  next: number
}

export interface ConsumerCore {
  readonly queue: QueueCore
  prefetch: number
  active: boolean
  readonly leaseMillis: number | undefined
  readonly held: Set<Held>
  readonly inbox: Inbox<Held, never>
}

export class BrokerCore {
  private readonly queues = new Map<string, QueueCore>()
  private readonly leased = new Set<Held>()
  private nextId = 1

  readonly now: () => number
  private readonly retainLog: boolean

  constructor(now: () => number, retainLog: boolean) {
    this.now = now
    this.retainLog = retainLog
  }

  queue(name: string): QueueCore {
    let q = this.queues.get(name)
    if (q === undefined) {
      q = { name, ready: [], head: 0, log: [], consumers: [], next: 0 }
      this.queues.set(name, q)
    }
    return q
  }

  publish(
    name: string,
    body: Uint8Array,
    type: string | undefined,
    deliveryCount: number,
    headers?: Readonly<Record<string, unknown>> | undefined,
    messageId?: string | undefined,
  ): StoredMessage {
    const q = this.queue(name)
    const message: StoredMessage = {
      id: this.nextId++,
      queue: q,
      body,
      type,
      headers,
      messageId,
      deliveryCount,
      acquiredCount: deliveryCount,
    }
    if (this.retainLog) q.log.push(message)
    q.ready.push(message)
    this.dispatch(q)
    return message
  }

  /** The queue's logged messages with an id above `after`: the log is in id order. */
  published(name: string, after: number): Array<StoredMessage> {
    const log = this.queue(name).log
    let low = 0
    let high = log.length
    while (low < high) {
      const middle = (low + high) >>> 1
      // low <= middle < high <= log.length: the entry exists.
      if (log[middle]!.id <= after) low = middle + 1
      else high = middle
    }
    return log.slice(low)
  }

  /** Drops the queue's ready messages and its log. */
  purge(name: string): number {
    const q = this.queue(name)
    const dropped = q.ready.length - q.head
    q.ready.length = 0
    q.head = 0
    q.log.length = 0
    return dropped
  }

  readyCount(name: string): number {
    const q = this.queue(name)
    return q.ready.length - q.head
  }

  unackedCount(name: string): number {
    let n = 0
    for (const h of this.leased) if (h.message.queue.name === name) n++
    return n
  }

  /** Takes the next ready message, as AMQP's basic.get does. */
  get(name: string, leaseMillis: number | undefined): Held | undefined {
    const q = this.queue(name)
    const message = this.shift(q)
    return message === undefined ? undefined : this.lease(message, undefined, leaseMillis)
  }

  addConsumer(name: string, prefetch: number, leaseMillis: number | undefined): ConsumerCore {
    const q = this.queue(name)
    const consumer: ConsumerCore = {
      queue: q,
      prefetch,
      active: true,
      leaseMillis,
      held: new Set(),
      inbox: new Inbox<Held, never>(),
    }
    q.consumers.push(consumer)
    this.dispatch(q)
    return consumer
  }

  setPrefetch(consumer: ConsumerCore, prefetch: number): void {
    consumer.prefetch = prefetch
    this.dispatch(consumer.queue)
  }

  /** Stops dispatching to the consumer; what it had not yet taken goes back to the queue. */
  cancel(consumer: ConsumerCore): Array<Held> {
    if (!consumer.active) return []
    consumer.active = false
    const q = consumer.queue
    q.consumers.splice(q.consumers.indexOf(consumer), 1)
    const untaken = consumer.inbox.takeAll()
    // Back to the front of the queue in their original order: the last one goes first.
    for (let i = untaken.length - 1; i >= 0; i--) {
      const h = untaken[i]!
      // Never seen by the application: back to the queue as if never handed out.
      this.release(h, "settled")
      h.message.acquiredCount = h.acquired
      this.requeueFront(q, h.message)
    }
    this.dispatch(q)
    return untaken
  }

  /** The consumer's channel closes: every lease it holds is lost and its messages requeued. */
  close(consumer: ConsumerCore): void {
    this.cancel(consumer)
    this.lose([...consumer.held], "channel_closed")
  }

  ack(h: Held): LeaseLost | undefined {
    if (h.state !== "held") return new LeaseLost({ reason: "stale" })
    this.release(h, "settled")
    this.dispatch(h.message.queue)
    return undefined
  }

  /**
   * Back to the queue's tail as a failed delivery (`basic.reject`), or, `counted` false,
   * unprocessed (`basic.nack`, which RabbitMQ 4 does not count).
   */
  requeue(h: Held, counted: boolean): LeaseLost | undefined {
    if (h.state !== "held") return new LeaseLost({ reason: "stale" })
    this.release(h, "settled")
    if (counted) h.message.deliveryCount++
    h.message.queue.ready.push(h.message)
    this.dispatch(h.message.queue)
    return undefined
  }

  renew(h: Held): LeaseLost | undefined {
    if (h.state !== "held") return new LeaseLost({ reason: "expired" })
    if (h.leaseMillis !== undefined) h.deadline = this.now() + h.leaseMillis
    return undefined
  }

  /** Expires every lease past its deadline. */
  expireDue(): number {
    const now = this.now()
    const due: Array<Held> = []
    for (const h of this.leased) if (h.deadline <= now) due.push(h)
    this.lose(due, "expired")
    return due.length
  }

  /**
   * Loses the leases (oldest first) and requeues their messages at the front of their queues
   * in that order, then dispatches them.
   */
  private lose(hs: ReadonlyArray<Held>, reason: LeaseLost["reason"]): void {
    const queues = new Set<QueueCore>()
    for (let i = hs.length - 1; i >= 0; i--) {
      const h = hs[i]!
      if (h.state !== "held") continue
      this.release(h, "lost")
      h.loss.lose(reason)
      h.message.deliveryCount++
      this.requeueFront(h.message.queue, h.message)
      queues.add(h.message.queue)
    }
    for (const q of queues) this.dispatch(q)
  }

  /** Calls `listener` when the lease is lost, or at once if it is. */
  onLost(h: Held, listener: (lost: LeaseLost) => void): () => void {
    return h.state === "settled" ? () => {} : h.loss.onLost(listener)
  }

  private release(h: Held, state: LeaseState): void {
    h.state = state
    this.leased.delete(h)
    h.consumer?.held.delete(h)
  }

  private requeueFront(q: QueueCore, message: StoredMessage): void {
    if (q.head > 0) {
      q.ready[--q.head] = message
    } else {
      q.ready.unshift(message)
    }
  }

  private shift(q: QueueCore): StoredMessage | undefined {
    if (q.head >= q.ready.length) return undefined
    const message = q.ready[q.head]!
    q.head++
    if (q.head > 1024 && q.head * 2 > q.ready.length) {
      q.ready.splice(0, q.head)
      q.head = 0
    }
    return message
  }

  private lease(
    message: StoredMessage,
    consumer: ConsumerCore | undefined,
    leaseMillis: number | undefined,
  ): Held {
    const h: Held = {
      message,
      acquired: message.acquiredCount++,
      consumer,
      leaseMillis,
      deadline: leaseMillis === undefined ? Infinity : this.now() + leaseMillis,
      state: "held",
      loss: new LeaseLoss(),
    }
    this.leased.add(h)
    consumer?.held.add(h)
    return h
  }

  private dispatch(q: QueueCore): void {
    const n = q.consumers.length
    if (n === 0) return
    while (q.head < q.ready.length) {
      let chosen: ConsumerCore | undefined
      for (let i = 0; i < n; i++) {
        const c = q.consumers[(q.next + i) % n]!
        if (c.active && c.held.size < c.prefetch) {
          chosen = c
          q.next = (q.next + i + 1) % n
          break
        }
      }
      if (chosen === undefined) return
      const h = this.lease(this.shift(q)!, chosen, chosen.leaseMillis)
      chosen.inbox.offer(h)
    }
  }
}
