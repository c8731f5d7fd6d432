/**
 * The SDK on RabbitMQ against the raw amqplib loop, in one process run, on the same broker and
 * quorum queues: 20 000 tasks at concurrency 50 each.
 *
 *   deno run -A bench/amqp.ts [tasks] [concurrency]    (RabbitMQ on 127.0.0.1:5672, guest/guest)
 *   node bench/amqp.ts [tasks] [concurrency]           (Node 24: it runs the sources as they are)
 *
 * Concurrency 1 (prefetch 1) is a job-mode pod's, or a slow handler's worker's: each task's
 * round trips to the broker are all of its time.
 *
 * The raw loop is the least a worker can do: consume with prefetch 50, parse the envelope,
 * publish `started` and `success` on a confirm channel, wait for both confirms, ack. The SDK
 * runs a no-op handler through the whole engine, decision lines included (to a logger that
 * only counts them).
 *
 * Both first run a warm-up (a tenth of the tasks, not timed), so that the figures are of code
 * the JIT has compiled: the raw loop is a few lines, hot at once, the SDK's path is not. Then
 * they run alternately, five rounds each, as the machine's and the broker's speed drift over
 * seconds: the median of the rounds' ratios is the figure. Each rate is timed from the first
 * task settled to the last, on both sides: the SDK connects, declares and starts consuming
 * inside its run, the raw loop before it, and neither start is the loop's throughput.
 *
 * A third loop in each round says where the SDK's cost lies: the raw loop's steps written with
 * Effect on the SDK's `AmqpTransport` (50 fibers: take, decode, publish `started` and `success`,
 * ack), without the engine. Its ratio to the raw loop is the transport's share of the gap, and
 * the SDK's to it the engine's. Each loop's CPU per task (this process's, user and system, over
 * the same first-to-last window) is printed too: the broker shares the machine's cores, so a
 * loop's CPU is taken from the broker it waits on.
 */
import { Buffer } from "node:buffer"
import { execFileSync } from "node:child_process"
import process from "node:process"
import amqp from "amqplib"
import { Duration, Effect, Fiber, Layer, Logger, Option, Schema } from "effect"
import { AmqpTransport, Settings, Transport, Worker } from "../src/index.ts"
import { settleMinimally } from "./minimalLoop.ts"
import { median, settledAfter } from "./stable.ts"

const TASKS = Number(process.argv[2] ?? 20_000)
const RUNTIME = "Deno" in globalThis
  ? `deno ${process.versions.deno}`
  : `node ${process.versions.node}`
const WARMUP = Math.ceil(TASKS / 10)
const ROUNDS = 5
const CONCURRENCY = Number(process.argv[3] ?? 50)
const VHOST = "async-task-worker-quorum"
const URL = `amqp://guest:guest@127.0.0.1:5672/${VHOST}`

const rabbitmqctl = (...args: Array<string>) =>
  execFileSync("rabbitmqctl", ["-q", ...args], { encoding: "utf8" })
if (!rabbitmqctl("list_vhosts").split("\n").map((l) => l.trim()).includes(VHOST)) {
  rabbitmqctl("add_vhost", VHOST, "--default-queue-type", "quorum")
  rabbitmqctl("set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*")
}

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

/** What one loop's run measured, from its first task settled to its last. */
interface Run {
  readonly rate: number
  /** This process's CPU time per task, in µs. */
  readonly cpu: number
}

/**
 * A loop's settled tasks: `settle` as each one is, `all` when every one is, and the loop's run
 * from its first task settled to its last.
 */
const settlements = (tasks: number) => {
  let settled = 0
  let first = 0
  let last = 0
  let firstCpu = process.cpuUsage()
  let cpu = 0
  let done!: () => void
  const all = new Promise<void>((resolve) => (done = resolve))
  return {
    settle: () => {
      last = performance.now()
      if (++settled === 1) {
        first = last
        firstCpu = process.cpuUsage()
      }
      if (settled === tasks) {
        const used = process.cpuUsage(firstCpu)
        cpu = used.user + used.system
        done()
      }
    },
    all,
    run: (): Run => ({
      rate: (tasks - 1) / ((last - first) / 1000),
      cpu: cpu / (tasks - 1),
    }),
  }
}

const raw = async (tasks: number): Promise<Run> => {
  await preload("bench-raw_queue_in", tasks)
  const connection = await amqp.connect(URL, { noDelay: true })
  const consumer = await connection.createChannel()
  const publisher = await connection.createConfirmChannel()
  await consumer.prefetch(CONCURRENCY)
  const publish = (text: string, type: string) =>
    new Promise<void>((resolve, reject) =>
      publisher.sendToQueue("bench-raw_queue_out", Buffer.from(text), {
        persistent: true,
        contentType: "application/json",
        type,
      }, (error) => (error ? reject(error) : resolve()))
    )
  const settled = settlements(tasks)
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

const sdk = async (tasks: number): Promise<Run> => {
  await preload("bench-sdk_queue_in", tasks)
  const worker = Worker.make({
    name: "bench-sdk",
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ ok: Schema.Boolean }),
    timeout: "30 seconds",
    handler: () => Effect.succeed({ ok: true }),
  })
  const settled = settlements(tasks)
  const counter = Logger.make(({ message }) => {
    if (String(Array.isArray(message) ? message[0] : message).startsWith("Delivery settled")) {
      settled.settle()
    }
  })
  const settings = Settings.layer({ name: worker.name, timeout: worker.timeout }, {
    brokerUrl: URL,
    concurrency: CONCURRENCY,
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

const transportOnly = async (tasks: number): Promise<Run> => {
  await preload("bench-transport_queue_in", tasks)
  const settings = Settings.layer({ name: "bench-transport", timeout: Duration.seconds(30) }, {
    brokerUrl: URL,
    concurrency: CONCURRENCY,
  })
  const settled = settlements(tasks)
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
        Effect.all(Array.from({ length: CONCURRENCY }, () => taker), {
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

await raw(WARMUP)
await transportOnly(WARMUP)
await sdk(WARMUP)
const raws: Array<Run> = []
const transports: Array<Run> = []
const sdks: Array<Run> = []
for (let round = 0; round < ROUNDS; round++) {
  raws.push(await raw(TASKS))
  transports.push(await transportOnly(TASKS))
  sdks.push(await sdk(TASKS))
}
const round = (n: number) => Math.round(n).toLocaleString("en-US")
const each = (runs: Array<Run>, field: keyof Run, unit: string) =>
  `${runs.map((r) => round(r[field])).join(", ")} ${unit}`
const rates = (runs: Array<Run>) => each(runs, "rate", "tasks/s")
const cpus = (runs: Array<Run>) => each(runs, "cpu", "µs")
const ratios = (of: Array<Run>, to: Array<Run>) => of.map((s, i) => s.rate / to[i]!.rate)
const line = (xs: Array<number>) =>
  `${xs.map((r) => r.toFixed(2)).join(", ")}   median ${
    median(xs).toFixed(2)
  }, within ±0.05 from round ${settledAfter(xs, () => 0.05)} of ${xs.length}`
console.log(
  `tasks: ${TASKS} per run (after a warm-up of ${WARMUP}), concurrency ${CONCURRENCY}, quorum queues, ${process.platform} ${RUNTIME}`,
)
console.log(`raw amqplib loop:          ${rates(raws)}`)
console.log(`the loop on AmqpTransport: ${rates(transports)}`)
console.log(`SDK (no-op):               ${rates(sdks)}`)
console.log(`SDK / raw, per round:      ${line(ratios(sdks, raws))}`)
console.log(`transport loop / raw:      ${line(ratios(transports, raws))}`)
console.log(`SDK / transport loop:      ${line(ratios(sdks, transports))}`)
console.log(`CPU per task, raw loop:    ${cpus(raws)}`)
console.log(`  the transport loop:      ${cpus(transports)}`)
console.log(`  the SDK:                 ${cpus(sdks)}`)
