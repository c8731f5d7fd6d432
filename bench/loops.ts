/**
 * The loops `bench/amqp.ts` compares and `bench/profile.ts` profiles, on RabbitMQ (127.0.0.1, a
 * quorum vhost of their own): the raw amqplib loop, the same steps on the SDK's `AmqpTransport`,
 * and the SDK with a no-op handler. Each preloads its tasks, runs them, and measures its run from
 * its first task settled to its last.
 */
import { Buffer } from "node:buffer"
import amqp from "amqplib"
import { Duration, Effect, Fiber, Layer, Logger, Option, Schema } from "effect"
import * as AmqpTransport from "../src/AmqpTransport.ts"
import { Settings, Transport, Worker } from "../src/index.ts"
import { settleMinimally } from "./minimalLoop.ts"
import { ensureQuorumVhost, QUORUM_VHOST } from "./quorumVhost.ts"
import { type Run, tally, type Window } from "./tally.ts"

export type { Run, Window }

const URL = `amqp://guest:guest@127.0.0.1:5672/${QUORUM_VHOST}`
ensureQuorumVhost()

const envelope = (i: number) =>
  Buffer.from(
    `{"task_id": "task-${i}", "data": {"message_type": "submission", "body": {"n": ${i}}}}`,
  )

const preload = async (queue: string, tasks: number) => {
  const connection = await amqp.connect(URL)
  const channel = await connection.createConfirmChannel()
  await channel.assertQueue(queue, { durable: true })
  await channel.assertQueue(queue.replace(/_in$/, "_out"), { durable: true })
  await channel.purgeQueue(queue)
  await channel.purgeQueue(queue.replace(/_in$/, "_out"))
  for (let i = 0; i < tasks; i++) channel.sendToQueue(queue, envelope(i), { persistent: true })
  await channel.waitForConfirms()
  await connection.close()
}

const cleanup = async (...queues: Array<string>) => {
  const connection = await amqp.connect(URL)
  const channel = await connection.createChannel()
  for (const queue of queues) await channel.deleteQueue(queue)
  await connection.close()
}

export const raw = async (
  tasks: number,
  concurrency: number,
  window: Window = {},
): Promise<Run> => {
  await preload("bench-raw_queue_in", tasks)
  const connection = await amqp.connect(URL, { noDelay: true })
  const consumer = await connection.createChannel()
  const publisher = await connection.createConfirmChannel()
  await consumer.prefetch(concurrency)
  const publish = (text: string, type: string) =>
    new Promise<void>((resolve, reject) =>
      publisher.sendToQueue("bench-raw_queue_out", Buffer.from(text), {
        persistent: true,
        contentType: "application/json",
        type,
      }, (error) => (error ? reject(error) : resolve()))
    )
  const settled = tally(tasks, window)
  await consumer.consume("bench-raw_queue_in", (message) => {
    if (message === null) return
    const taskId = JSON.parse(message.content.toString("utf8")).task_id as string
    const head = `{"task_id":${JSON.stringify(taskId)},"data":{"message_type":`
    publish(`${head}"started","hostname":"bench"}}`, "started")
      .then(() => publish(`${head}"success","response":{"ok":true}}}`, "success"))
      .then(() => {
        consumer.ack(message)
        settled.settle()
      }, (error) => console.error(error))
  })
  await settled.all
  await connection.close()
  await cleanup("bench-raw_queue_in", "bench-raw_queue_out")
  return settled.run()
}

export const sdk = async (
  tasks: number,
  concurrency: number,
  window: Window = {},
): Promise<Run> => {
  await preload("bench-sdk_queue_in", tasks)
  const worker = Worker.make({
    name: "bench-sdk",
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ ok: Schema.Boolean }),
    timeout: "30 seconds",
    handler: () => Effect.succeed({ ok: true }),
  })
  const settled = tally(tasks, window)
  const counter = Logger.make(({ message }) => {
    if (String(Array.isArray(message) ? message[0] : message).startsWith("Delivery settled")) {
      settled.settle()
    }
  })
  const settings = Settings.layer({ name: worker.name, timeout: worker.timeout }, {
    brokerUrl: URL,
    concurrency: concurrency,
  })
  const fiber = Effect.runFork(
    Worker.serve(worker).pipe(
      Effect.provide(AmqpTransport.layer.pipe(Layer.provideMerge(settings))),
      Effect.provide(Logger.layer([counter])),
    ),
  )
  await settled.all
  await Effect.runPromise(Fiber.interrupt(fiber))
  await cleanup("bench-sdk_queue_in", "bench-sdk_queue_out")
  return settled.run()
}

export const transportOnly = async (
  tasks: number,
  concurrency: number,
  window: Window = {},
): Promise<Run> => {
  await preload("bench-transport_queue_in", tasks)
  const settings = Settings.layer({ name: "bench-transport", timeout: Duration.seconds(30) }, {
    brokerUrl: URL,
    concurrency: concurrency,
  })
  const settled = tally(tasks, window)
  await Effect.runPromise(
    Effect.gen(function* () {
      const transport = yield* Transport.Transport
      const taker = Effect.gen(function* () {
        for (;;) {
          const next = yield* transport.take
          if (Option.isNone(next)) return
          yield* settleMinimally(transport, next.value)
          settled.settle()
        }
      })
      yield* Effect.raceFirst(
        Effect.all(Array.from({ length: concurrency }, () => taker), {
          concurrency: "unbounded",
          discard: true,
        }),
        Effect.promise(() => settled.all),
      )
    }).pipe(
      Effect.provide(AmqpTransport.layer.pipe(Layer.provideMerge(settings))),
      Effect.scoped,
    ),
  )
  await cleanup("bench-transport_queue_in", "bench-transport_queue_out")
  return settled.run()
}
