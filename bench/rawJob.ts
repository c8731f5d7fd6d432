/**
 * The least a job-mode pod does, the floor of `bench/lifecycle.ts`'s start: amqplib alone,
 * connect, open a confirm channel and a consumer channel at once, declare both queues, take one
 * task with prefetch 1, publish `started` and `success` each confirmed, ack, close, exit. It logs
 * the same two startup lines as the worker (before connecting, once consuming), so that the bench
 * splits its time the same way. Run by the bench with `BROKER_URL`, `IN_QUEUE_NAME` and
 * `OUT_QUEUE_NAME` set.
 */
import { Buffer } from "node:buffer"
import process from "node:process"
import amqp from "amqplib"

const inQueue = process.env.IN_QUEUE_NAME!
const outQueue = process.env.OUT_QUEUE_NAME!
console.log(`Worker raw connecting to the broker (job mode, ${inQueue})`)
const connection = await amqp.connect(process.env.BROKER_URL!)
const [publisher, consumer] = await Promise.all([
  connection.createConfirmChannel(),
  connection.createChannel(),
])
await Promise.all([
  publisher.assertQueue(outQueue, { durable: true }),
  consumer.assertQueue(inQueue, { durable: true }),
])
await consumer.prefetch(1)
const publish = (text: string, type: string) =>
  new Promise<void>((resolve, reject) =>
    publisher.sendToQueue(outQueue, Buffer.from(text), {
      persistent: true,
      contentType: "application/json",
      type,
    }, (error) => (error ? reject(error) : resolve()))
  )
let finish!: () => void
let fail!: (error: unknown) => void
const done = new Promise<void>((resolve, reject) => {
  finish = resolve
  fail = reject
})
await consumer.consume(inQueue, (message) => {
  if (message === null) return
  const taskId = JSON.parse(message.content.toString("utf8")).task_id as string
  const head = `{"task_id":${JSON.stringify(taskId)},"data":{"message_type":`
  publish(`${head}"started","hostname":"bench"}}`, "started")
    .then(() => publish(`${head}"success","response":{"words":2}}}`, "success"))
    .then(() => {
      consumer.ack(message)
      finish()
    }, fail)
})
console.log(`Worker raw started in job mode on ${inQueue}`)
await done
await connection.close()
