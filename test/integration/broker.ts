/**
 * The real RabbitMQ for integration tests: the machine's on 127.0.0.1:5672, or the one that
 * `TEST_RABBITMQ_PORT` and `TEST_RABBITMQCTL` name (the RabbitMQ 4 node of scripts/rabbitmq4.sh,
 * as vitest.rabbitmq4.config.ts sets them); vhosts made like production ones (quorum by default)
 * or plain (classic), unique queue names, and a client to play the platform.
 */
import { execFileSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { Buffer } from "node:buffer"
import process from "node:process"
import amqp from "amqplib"
import { envelope } from "../support/builders.ts"
import { pollUntil, sleep } from "../support/waits.ts"

export const QUORUM_VHOST = "async-task-worker-quorum"
export const CLASSIC_VHOST = "async-task-worker-classic"

/** The AMQP port of the broker under test, on 127.0.0.1. */
export const BROKER_PORT = Number(process.env.TEST_RABBITMQ_PORT ?? 5672)

/** The `rabbitmqctl` that reaches the broker under test (a wrapper for the RabbitMQ 4 node). */
export const RABBITMQCTL = process.env.TEST_RABBITMQCTL ?? "rabbitmqctl"

/** The `rabbitmq-diagnostics` beside it. */
export const RABBITMQ_DIAGNOSTICS = RABBITMQCTL.replace(/rabbitmqctl$/, "rabbitmq-diagnostics")

/** How a `rabbitmqctl` call may end. */
export interface CtlOptions {
  /** A failure is no error: what the call makes may be there already. */
  readonly ignoreFailure?: boolean
  /** Its bound in ms, 60 000 unless said: a broker's stop or start may take longer. */
  readonly timeout?: number
}

/**
 * `rabbitmqctl -q ...args` on the broker under test, `CtlOptions` last if any: its output (empty
 * for a failure ignored).
 */
export const rabbitmqctl = (...args: ReadonlyArray<string | CtlOptions>): string => {
  const words = args.filter((a): a is string => typeof a === "string")
  const options = args.find((a): a is CtlOptions => typeof a !== "string") ?? {}
  try {
    return execFileSync(RABBITMQCTL, ["-q", ...words], {
      encoding: "utf8",
      timeout: options.timeout ?? 60_000,
    })
  } catch (error) {
    if (options.ignoreFailure) return ""
    throw error
  }
}

/** Starts the broker's application if it is stopped, and waits for it: idempotent. */
export const ensureBrokerRunning = (): void => {
  // A start fails when the application runs already.
  rabbitmqctl("start_app", { ignoreFailure: true, timeout: 120_000 })
  rabbitmqctl("await_startup", { timeout: 120_000 })
}

/** Whether the broker under test is RabbitMQ 4 or later. */
export const isRabbitMQ4 = (): boolean => Number(rabbitmqctl("version").trim().split(".")[0]) >= 4

/** Makes both vhosts once, idempotently, with guest's permissions. */
export const ensureVhosts = (): void => {
  const existing = rabbitmqctl("list_vhosts").split("\n").map((l) => l.trim())
  if (!existing.includes(QUORUM_VHOST)) {
    rabbitmqctl("add_vhost", QUORUM_VHOST, "--default-queue-type", "quorum")
  }
  if (!existing.includes(CLASSIC_VHOST)) rabbitmqctl("add_vhost", CLASSIC_VHOST)
  for (const vhost of [QUORUM_VHOST, CLASSIC_VHOST]) {
    rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
  }
}

export const urlFor = (vhost: string, password = "guest"): string =>
  `amqp://guest:${password}@127.0.0.1:${BROKER_PORT}/${encodeURIComponent(vhost)}`

export const uniqueName = (prefix: string): string => `${prefix}-${randomUUID().slice(0, 8)}`

export interface OutMessage {
  readonly text: string
  readonly type: string | undefined
  readonly contentType: string | undefined
  readonly deliveryMode: number | undefined
  readonly messageId: string | undefined
}

/** Whether `m` concludes its task: a success or a failure. */
export const terminal = (m: { readonly type: string | undefined }): boolean =>
  m.type === "success" || m.type === "failure"

const toOut = (message: amqp.GetMessage): OutMessage => ({
  text: message.content.toString("utf8"),
  type: message.properties.type,
  contentType: message.properties.contentType,
  deliveryMode: message.properties.deliveryMode,
  messageId: message.properties.messageId,
})

/**
 * The platform's side: publishes envelopes, reads the output queue, inspects and cleans up; on
 * `vhost` of the broker under test, or of the broker `url` names (a test's own node).
 */
export const platform = async (vhost: string, url: string = urlFor(vhost)) => {
  const connection = await amqp.connect(url)
  // A confirm channel: what `publish` sends is on the broker once `close` (or `confirmed`) returns.
  const channel = await connection.createConfirmChannel()
  const waitForQueue = async (queue: string, ms = 20_000) => {
    await pollUntil(`${queue} declared`, async () => {
      const probe = await connection.createChannel()
      probe.on("error", () => {})
      const found = await probe.checkQueue(queue).then(() => true, () => false)
      // The check of a missing queue closes the probe's channel; a found one leaves it open.
      if (found) await probe.close()
      return found
    }, { ms })
  }
  return {
    publish: (queue: string, body: string) =>
      channel.sendToQueue(queue, Buffer.from(body), {
        persistent: true,
        contentType: "application/json",
      }),
    envelope,
    /** Takes every message now on the queue. */
    drain: async (queue: string): Promise<Array<OutMessage>> => {
      const out: Array<OutMessage> = []
      for (;;) {
        const message = await channel.get(queue, { noAck: true })
        if (message === false) return out
        out.push(toOut(message))
      }
    },
    count: async (queue: string) => (await channel.checkQueue(queue)).messageCount,
    /**
     * Takes the queue's head message `times` times and closes the channel that holds it unacked,
     * as a crashed worker would: a failed delivery on every RabbitMQ (a nack would not count on 4).
     */
    redeliver: async (queue: string, times: number) => {
      // A quorum queue may not hold a message published just before until its confirm: without
      // this, the first `get` could find the queue empty.
      await channel.waitForConfirms()
      for (let i = 0; i < times; i++) {
        const holder = await connection.createChannel()
        // The message closed with the last holder may take a moment to be back.
        const deadline = Date.now() + 10_000
        let message = await holder.get(queue, { noAck: false })
        while (message === false && Date.now() < deadline) {
          await sleep(20)
          message = await holder.get(queue, { noAck: false })
        }
        if (message === false) throw new Error(`${queue} is empty`)
        await holder.close()
      }
    },
    /** Reads the output queue until `done` holds of all read so far, within `ms`. */
    readUntil: async (
      queue: string,
      done: (all: ReadonlyArray<OutMessage>) => boolean,
      ms = 20_000,
    ) => {
      const all: Array<OutMessage> = []
      const deadline = Date.now() + ms
      while (Date.now() < deadline) {
        const message = await channel.get(queue, { noAck: true })
        if (message === false) {
          if (done(all)) return all
          await sleep(20)
          continue
        }
        all.push(toOut(message))
      }
      throw new Error(
        `${queue}: not done within ${ms} ms; read ${all.length}: ${
          all.map((m) => m.text).join(" | ")
        }`,
      )
    },
    declare: (queue: string, options: amqp.Options.AssertQueue) =>
      channel.assertQueue(queue, options),
    /**
     * `queue`'s ready messages once the broker has let go of its worker: no consumer left, then a
     * moment for the broker to requeue what a closed channel held unacked. The queue is read by
     * declaring it as the worker does: a check of a missing one would close this client's channel.
     */
    leftover: async (queue: string) => {
      await pollUntil(
        `${queue} without a consumer`,
        async () => (await channel.assertQueue(queue, { durable: true })).consumerCount === 0,
        { ms: 10_000 },
      )
      await sleep(500)
      return (await channel.checkQueue(queue)).messageCount
    },
    /** Waits until the worker has declared both queues of `name`: reading a missing one would close this client's channel. */
    waitForQueues: async (name: string, ms = 20_000) => {
      await waitForQueue(`${name}_queue_in`, ms)
      await waitForQueue(`${name}_queue_out`, ms)
    },
    /** Waits until the worker has declared `queue` (a missing queue closes the channel that asks). */
    waitForQueue,
    remove: async (...queues: ReadonlyArray<string>) => {
      for (const queue of queues) await channel.deleteQueue(queue).catch(() => undefined)
    },
    confirmed: () => channel.waitForConfirms(),
    close: async () => {
      await channel.waitForConfirms().catch(() => undefined)
      await connection.close()
    },
  }
}

/**
 * A unique name after `prefix`, and its pair of queues, declared as a worker declares them
 * (durable, no arguments: the vhost's default type), so that a test may publish before its worker
 * runs.
 */
export const declaredQueues = async (
  broker: Awaited<ReturnType<typeof platform>>,
  prefix: string,
) => {
  const name = uniqueName(prefix)
  const [inQueue, outQueue] = [`${name}_in`, `${name}_out`]
  for (const queue of [inQueue, outQueue]) await broker.declare(queue, { durable: true })
  return { name, inQueue, outQueue }
}
