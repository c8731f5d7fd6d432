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
import process from "node:process"
import { raw, type Run, sdk, transportOnly } from "./loops.ts"
import { median, settledAfter } from "./stable.ts"

const TASKS = Number(process.argv[2] ?? 20_000)
const RUNTIME = "Deno" in globalThis
  ? `deno ${process.versions.deno}`
  : `node ${process.versions.node}`
const WARMUP = Math.ceil(TASKS / 10)
const ROUNDS = 5
const CONCURRENCY = Number(process.argv[3] ?? 50)
await raw(WARMUP, CONCURRENCY)
await transportOnly(WARMUP, CONCURRENCY)
await sdk(WARMUP, CONCURRENCY)
const raws: Array<Run> = []
const transports: Array<Run> = []
const sdks: Array<Run> = []
for (let round = 0; round < ROUNDS; round++) {
  raws.push(await raw(TASKS, CONCURRENCY))
  transports.push(await transportOnly(TASKS, CONCURRENCY))
  sdks.push(await sdk(TASKS, CONCURRENCY))
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
console.log(
  `SDK CPU / raw, per round: ${line(sdks.map((s, i) => s.cpu / raws[i]!.cpu))}`,
)
