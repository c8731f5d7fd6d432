/**
 * The raw amqplib loop of `bench/loops.ts`, the least a worker does, in a worker process of
 * `bench/compare.ts`: consume with the run's prefetch, parse the envelope, publish `started` and
 * wait for its confirm, run the mode's handler, publish `success` and wait for its confirm, ack.
 * Started as `worker.ts raw ahead`, it runs the handler while `started`'s confirm is on its way,
 * and awaits both before `success`.
 */
import { Buffer } from "node:buffer"
import amqp from "amqplib"
import { type Contender, handlerOf, holding, inQueue, outQueue } from "./protocol.ts"
import { tally } from "../tally.ts"

const AHEAD = process.argv[3] === "ahead"

export const contender: Contender = async (run, ready) => {
  const connection = await amqp.connect(run.url, { noDelay: true })
  let running = true
  const lost = new Promise<never>((_, reject) => {
    connection.on("error", () => {})
    connection.on("close", () => running && reject(new Error("the connection closed")))
  })
  try {
    const consumer = await connection.createChannel()
    const publisher = await connection.createConfirmChannel()
    await consumer.prefetch(run.concurrency)
    const out = outQueue(run.name)
    const publish = (text: string, type: string) =>
      new Promise<void>((resolve, reject) =>
        publisher.sendToQueue(out, Buffer.from(text), {
          persistent: true,
          contentType: "application/json",
          type,
        }, (error) => (error ? reject(error) : resolve()))
      )
    const settled = tally(run.tasks)
    const held = holding(run.tasks)
    const handler = handlerOf(run.mode, held)
    await consumer.consume(inQueue(run.name), (message) => {
      if (message === null) return
      const taskId = JSON.parse(message.content.toString("utf8")).task_id as string
      const head = `{"task_id":${JSON.stringify(taskId)},"data":{"message_type":`
      const started = publish(`${head}"started","hostname":"bench"}}`, "started")
      const handled = handler === undefined
        ? started
        : AHEAD
        ? Promise.all([started, handler()])
        : started.then(handler)
      handled
        .then(() => publish(`${head}"success","response":{"ok":true}}}`, "success"))
        .then(() => {
          consumer.ack(message)
          settled.settle()
        }, (error) => console.error(error))
    })
    if (run.mode === "held") held.before()
    ready()
    await Promise.race([settled.all, lost])
    return { ...settled.run(), heap: run.mode === "held" ? held.perTask() : undefined }
  } finally {
    running = false
    await connection.close().catch(() => {})
  }
}
