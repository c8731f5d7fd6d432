// The built package on the real RabbitMQ, as a Node app would run it: a worker served on a
// quorum queue concludes a task and acks it.
import assert from "node:assert/strict"
import { execFileSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { test } from "node:test"
import amqp from "amqplib"
import { Effect, Fiber, Schema } from "effect"
import { Worker } from "@async-task/worker"

const VHOST = "async-task-worker-quorum"
const URL = `amqp://guest:guest@127.0.0.1:5672/${VHOST}`

const ensureVhost = () => {
  const vhosts = execFileSync("rabbitmqctl", ["-q", "list_vhosts"], { encoding: "utf8" }).split(
    "\n",
  ).map((l) => l.trim())
  if (!vhosts.includes(VHOST)) {
    execFileSync("rabbitmqctl", ["-q", "add_vhost", VHOST, "--default-queue-type", "quorum"])
  }
  execFileSync("rabbitmqctl", ["-q", "set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*"])
}

test("a worker from the built package concludes a task on RabbitMQ", async () => {
  ensureVhost()
  const name = `smoke-${randomUUID().slice(0, 8)}`
  const worker = Worker.make({
    name,
    input: Schema.Struct({ text: Schema.String }),
    output: Schema.Struct({ words: Schema.Number }),
    timeout: "5 seconds",
    handler: (input) => Effect.succeed({ words: input.text.split(" ").length }),
  })
  // RabbitMQ at the settings' broker URL: what Worker.serve connects to by itself.
  const fiber = Effect.runFork(
    Worker.serve(worker, { settings: { brokerUrl: URL, logLevel: "Error" } }),
  )
  const connection = await amqp.connect(URL)
  const channel = await connection.createConfirmChannel()
  try {
    await channel.assertQueue(`${name}_queue_in`, { durable: true })
    await channel.assertQueue(`${name}_queue_out`, { durable: true })
    channel.sendToQueue(
      `${name}_queue_in`,
      Buffer.from(
        JSON.stringify({
          task_id: "t-smoke",
          data: { message_type: "submission", body: { text: "a b c" } },
        }),
      ),
    )
    await channel.waitForConfirms()
    const texts = []
    const deadline = Date.now() + 15_000
    while (!texts.some((t) => t.includes('"success"')) && Date.now() < deadline) {
      const message = await channel.get(`${name}_queue_out`, { noAck: true })
      if (message === false) await new Promise((resolve) => setTimeout(resolve, 25))
      else texts.push(message.content.toString("utf8"))
    }
    assert.deepEqual(
      texts.at(-1),
      '{"task_id":"t-smoke","data":{"message_type":"success","response":{"words":3}}}',
    )
    await Effect.runPromise(Fiber.interrupt(fiber))
    assert.equal((await channel.checkQueue(`${name}_queue_in`)).messageCount, 0)
  } finally {
    await Effect.runPromise(Fiber.interrupt(fiber))
    await channel.deleteQueue(`${name}_queue_in`).catch(() => undefined)
    await channel.deleteQueue(`${name}_queue_out`).catch(() => undefined)
    await connection.close()
  }
})
