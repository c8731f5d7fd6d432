/**
 * Fakes of amqplib's channel and connection: only the methods the transport's parts call, each
 * call written to a log shared by a connection and its channels, so that a test reads the order of
 * what reached the "broker". A method can be held (its answer waits for `release`) or made to fail.
 */
import { EventEmitter } from "node:events"
import type { Buffer } from "node:buffer"
import type * as Amqp from "amqplib"
import { Effect } from "effect"

export interface FakeConsumer {
  readonly queue: string
  /** The channel's prefetch when the consumer was made: its window. */
  readonly prefetch: number
  readonly onMessage: (message: Amqp.ConsumeMessage | null) => void
  readonly options: Amqp.Options.Consume | undefined
}

export interface Published {
  readonly exchange: string
  readonly routingKey: string
  readonly content: Buffer
  readonly options: Amqp.Options.Publish | undefined
  readonly confirm: (error: unknown) => void
}

export class FakeChannel extends EventEmitter {
  /** The consumers the broker has, by tag. */
  readonly consumers = new Map<string, FakeConsumer>()
  readonly published: Array<Published> = []
  /** Methods whose answer waits for `release`. */
  readonly holding = new Set<string>()
  /** Methods that fail with the error given. */
  readonly failing = new Map<string, unknown>()
  /** Thrown by `publish`, as amqplib does on a closed channel. */
  publishThrows: unknown = undefined
  private readonly held: Array<{ readonly answer: () => void; readonly fail: () => void }> = []
  private window = 0
  private tags = 0

  constructor(readonly name: string, readonly log: Array<string> = []) {
    super()
  }

  /** Answers every held call. */
  release(): void {
    for (const call of this.held.splice(0)) call.answer()
  }

  /** The windows of the consumers the broker has, oldest first. */
  windows(): Array<number> {
    return [...this.consumers.values()].map((c) => c.prefetch)
  }

  /** Delivers a message to the consumer `tag`. */
  deliver(tag: string, message: {
    readonly deliveryTag: number
    readonly redelivered?: boolean
    readonly headers?: Record<string, unknown>
  }): void {
    this.consumers.get(tag)!.onMessage({
      content: new TextEncoder().encode(`{"n":${message.deliveryTag}}`) as Buffer,
      fields: {
        deliveryTag: message.deliveryTag,
        redelivered: message.redelivered ?? false,
        consumerTag: tag,
        exchange: "",
        routingKey: "in",
      },
      properties: { headers: message.headers ?? {} } as Amqp.MessageProperties,
    })
  }

  private call<A>(method: string, detail: string, answer: () => A): Promise<A> {
    this.log.push(`${this.name}.${method}${detail === "" ? "" : ` ${detail}`}`)
    if (this.failing.has(method)) return Promise.reject(this.failing.get(method))
    if (!this.holding.has(method)) return Promise.resolve().then(answer)
    return new Promise((resolve, reject) =>
      this.held.push({
        answer: () => resolve(answer()),
        // As amqplib fails a channel's pending calls when it closes.
        fail: () => reject(new Error("Channel ended, no reply will be forthcoming")),
      })
    )
  }

  prefetch(count: number): Promise<Amqp.Replies.Empty> {
    this.window = count
    return this.call("prefetch", `${count}`, () => ({}))
  }

  consume(
    queue: string,
    onMessage: (message: Amqp.ConsumeMessage | null) => void,
    options?: Amqp.Options.Consume,
  ): Promise<Amqp.Replies.Consume> {
    const consumerTag = `ctag-${++this.tags}`
    this.consumers.set(consumerTag, { queue, prefetch: this.window, onMessage, options })
    return this.call("consume", queue, () => ({ consumerTag }))
  }

  cancel(consumerTag: string): Promise<Amqp.Replies.Cancel> {
    return this.call("cancel", consumerTag, () => {
      this.consumers.delete(consumerTag)
      return { consumerTag }
    })
  }

  ack(message: Amqp.Message): void {
    this.log.push(`${this.name}.ack ${message.fields.deliveryTag}`)
  }

  nack(message: Amqp.Message, _allUpTo?: boolean, requeue?: boolean): void {
    this.log.push(`${this.name}.nack ${message.fields.deliveryTag}${requeue ? " requeue" : ""}`)
  }

  reject(message: Amqp.Message, requeue?: boolean): void {
    this.log.push(`${this.name}.reject ${message.fields.deliveryTag}${requeue ? " requeue" : ""}`)
  }

  assertQueue(queue: string, options?: Amqp.Options.AssertQueue): Promise<unknown> {
    return this.call("assertQueue", `${queue}${options?.durable ? " durable" : ""}`, () => ({}))
  }

  checkQueue(queue: string): Promise<Amqp.Replies.AssertQueue> {
    return this.call("checkQueue", queue, () => ({ queue, messageCount: 0, consumerCount: 0 }))
  }

  close(): Promise<void> {
    return this.call("close", "", () => void this.emit("close"))
  }

  waitForConfirms(): Promise<void> {
    return this.call("waitForConfirms", "", () => undefined)
  }

  /**
   * The broker closes the channel for `error` (a channel error, such as a message past its
   * `max_message_size`), as amqplib reports one: the error, then the close, which fails every
   * confirm still awaited with "channel closed".
   */
  closeByBroker(error: Error): void {
    this.closed = true
    for (const call of this.held.splice(0)) call.fail()
    this.emit("error", error)
    for (const p of this.published.splice(0)) p.confirm(new Error("channel closed"))
    this.emit("close")
  }

  /** Whether the broker closed the channel. */
  closed = false

  publish(
    exchange: string,
    routingKey: string,
    content: Buffer,
    options?: Amqp.Options.Publish,
    callback?: (error: unknown, ok: Amqp.Replies.Empty) => void,
  ): boolean {
    if (this.publishThrows !== undefined) throw this.publishThrows
    this.published.push({
      exchange,
      routingKey,
      content,
      options,
      confirm: (error) => callback?.(error, {}),
    })
    return true
  }
}

export class FakeConnection extends EventEmitter {
  /** The confirm channel: a new one once the broker closed the last. */
  publisher: FakeChannel
  readonly consumer: FakeChannel

  constructor(readonly log: Array<string> = []) {
    super()
    this.publisher = new FakeChannel("publisher", log)
    this.consumer = new FakeChannel("consumer", log)
  }

  createConfirmChannel(): Promise<FakeChannel> {
    this.log.push("connection.createConfirmChannel")
    if (this.publisher.closed) this.publisher = new FakeChannel("publisher", this.log)
    return Promise.resolve(this.publisher)
  }

  createChannel(): Promise<FakeChannel> {
    this.log.push("connection.createChannel")
    return Promise.resolve(this.consumer)
  }

  close(): Promise<void> {
    this.log.push("connection.close")
    this.emit("close")
    return Promise.resolve()
  }

  /**
   * amqplib's connection inside its model: the socket the session destroys to give it up and
   * reads the bytes of, the heartbeat agreed (0, none, unless a test sets one), and what the
   * broker said of itself (a broker that honours x-consumer-timeout, unless a test says older).
   */
  readonly connection = {
    serverProperties: { product: "RabbitMQ", version: "4.3.6" } as Record<string, unknown>,
    heartbeat: 0,
    stream: {
      bytesRead: 0,
      destroy: (error?: Error) => {
        this.log.push("connection.stream.destroy")
        this.emit("error", error)
        this.emit("close", error)
      },
    },
  }

  /** The broker dropped the connection, amqplib saying why if `error` is given. */
  lose(error?: Error): void {
    this.emit("close", error)
  }
}

/**
 * Waits, turn by turn, until `check` holds: the fakes answer in promise callbacks, which the
 * TestClock does not hold back.
 */
export const eventually = (check: () => boolean): Effect.Effect<void> =>
  Effect.gen(function* () {
    for (let turn = 0; turn < 1000; turn++) {
      if (check()) return
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 0)))
    }
    return yield* Effect.die(new Error("the condition never held"))
  })
