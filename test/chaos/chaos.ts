/**
 * The chaos suite (issue 15): worker processes run by the CLI on a quorum vhost of the real
 * RabbitMQ on 127.0.0.1, a backlog of tasks, and faults spread over the run while tasks are in
 * flight: connections closed by the broker (`rabbitmqctl close_connection`), a broker
 * `stop_app` / `start_app`, and `kill -9` of worker processes (each replaced at once, so that
 * the same number keeps running). It reports the tasks lost (no terminal message: must be 0),
 * the duplicates (tasks concluded more than once) against what was in flight at each fault, and
 * the time from the broker's return to the first task settled.
 *
 * `npm run chaos -- --tasks 10000` (Deno: `deno run -A test/chaos/chaos.ts`); `--help` for the
 * options. It stops and restarts the broker and closes connections: run it alone, e.g. under
 * `flock -x /tmp/rabbit.lock`. `test/faults/chaos.test.ts` runs a smaller one in CI.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process"
import { randomUUID } from "node:crypto"
import { createWriteStream, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import process from "node:process"
import { Buffer } from "node:buffer"
import amqp from "amqplib"
import { BROKER_PORT, ensureBrokerRunning, RABBITMQCTL, urlFor } from "../integration/broker.ts"
import { checkBuild, ROOT, type Runtime, runtimeSpec } from "../support/runtimes.ts"
import { envelope } from "../support/builders.ts"
import { sleep } from "../support/waits.ts"

export type { Runtime }

const FIXTURE = join(ROOT, "test/fixtures/chaos/worker.mjs")

/** A vhost of its own, quorum by default as production's: no other test's connection is in it. */
export const CHAOS_VHOST = "async-task-worker-chaos"

export interface ChaosOptions {
  /** Tasks in all: the backlog published before the workers start, and the reserve. */
  readonly tasks: number
  /** Connections of a worker closed by the broker. */
  readonly closes: number
  /** Worker processes killed with SIGKILL (each replaced at once). */
  readonly kills: number
  /** Whether to stop the broker's application and start it again, once, mid-run. */
  readonly restartBroker: boolean
  /** `WORKER_CONCURRENCY` of each worker: tasks at once, and the prefetch. */
  readonly concurrency: number
  /** The runtime of the worker processes: Deno runs the CLI from the sources, Node from dist/. */
  readonly runtime: Runtime
  /** Worker processes running at once (default 2). */
  readonly workers?: number
  /**
   * The handler's random wait, in ms (default 50..150: with two workers at concurrency 20,
   * about 300 tasks/s, so that the faults, half a second to a second of `rabbitmqctl` each,
   * all strike with a backlog left).
   */
  readonly taskMs?: readonly [number, number]
  /**
   * The faults strike when this fraction of the tasks published first has concluded, spread
   * evenly (default 0.03..0.85).
   */
  readonly faultWindow?: readonly [number, number]
  /**
   * Tasks held back (default a fifth of them): before each fault, as many as keep a backlog of
   * twice what the workers prefetch are published, and the last half only once the last fault
   * has struck. However slow the faults (seconds of `rabbitmqctl` each) or fast the workers,
   * every fault strikes with work left, and the work cannot end before it.
   */
  readonly reserve?: number
  /** Give up waiting for the last tasks after this long without a new one concluded (default 30 s). */
  readonly stallMs?: number
  /** Give up waiting for the tasks after this long in all (default 10 min). */
  readonly timeoutMs?: number
  /** Where the workers' logs go (default a new directory under the system's temporary one). */
  readonly logDir?: string
  /** Progress lines, as the run goes. */
  readonly log?: (line: string) => void
  /** Checks of the accounting itself: task ids counted but never published (they must show as lost). */
  readonly dropTasks?: number
  /** Checks of the accounting itself: tasks published twice (each must show as a duplicate). */
  readonly duplicateTasks?: number
  /** Run the Node CLI even when dist/ is older than src/. */
  readonly allowStaleBuild?: boolean
}

export type FaultKind = "close" | "kill" | "restart"

export interface FaultRecord {
  readonly index: number
  readonly kind: FaultKind
  /** ms from the start of the run (the first worker spawned) to the fault. */
  readonly at: number
  /** Tasks concluded when the fault struck, and the target fraction it waited for. */
  readonly concluded: number
  readonly threshold: number
  /** The worker processes it touched, and what each had in flight just before (its gauge). */
  readonly targets: ReadonlyArray<string>
  readonly inFlight: ReadonlyArray<number | undefined>
  /** Sum of in flight (a target whose gauge could not be read counts its prefetch). */
  readonly inFlightSum: number
  /** The prefetch of the workers touched: the most any of them can hold. */
  readonly prefetchBound: number
  /** What was done: the connection closed, the pid killed, the restart's timings. */
  readonly detail: string
  readonly durationMs: number
  /** Duplicates put down to this fault: a run of theirs ended before it, in a process it touched. */
  duplicates: number
}

export interface WorkerRecord {
  readonly label: string
  readonly pid: number | undefined
  readonly startedAt: number
  readonly probePort: number | undefined
  /** "killed" (SIGKILL by the suite), or how it ended after SIGTERM at the end. */
  end: string
  exitCode: number | null | undefined
  /** ms from the SIGTERM to its exit. */
  stopMs: number | undefined
  readonly logFile: string
}

export interface DuplicateDetail {
  readonly id: string
  /** The fault (its number) put down as the cause: the first that touched its first run after it. */
  readonly fault: number | undefined
  readonly runs: ReadonlyArray<string>
}

export interface ChaosReport {
  readonly options: Omit<ChaosOptions, "log">
  readonly vhost: string
  readonly queues: { readonly in: string; readonly out: string }
  readonly tasks: number
  readonly published: number
  readonly concluded: number
  readonly lost: number
  readonly lostIds: ReadonlyArray<string>
  /** Of the lost, those still ready on the input queue at the end (not consumed yet). */
  readonly stillQueued: number
  /** Tasks with more than one terminal message (different runs of the task). */
  readonly duplicates: number
  readonly duplicateIds: ReadonlyArray<string>
  /** Each duplicate's terminal messages (who ran it, when), and the fault it is put down to. */
  readonly duplicateDetails: ReadonlyArray<DuplicateDetail>
  /** Terminal messages beyond the first of each task. */
  readonly extraTerminalMessages: number
  /** The same message delivered again to the platform's consumer (after its own reconnection). */
  readonly rereadByPlatform: number
  readonly faultsPlanned: number
  readonly faults: ReadonlyArray<FaultRecord>
  /** Σ over the faults of what was in flight in the workers each touched. */
  readonly inFlightBound: number
  /** Σ over the faults of the prefetch of the workers each touched. */
  readonly prefetchBound: number
  readonly failuresByCode: Readonly<Record<string, number>>
  /** The workers' decision lines, counted by `outcome/action[/code]`. */
  readonly decisions: Readonly<Record<string, number>>
  /** WARN / ERROR lines of the workers, counted by message (digits masked). */
  readonly workerWarnings: Readonly<Record<string, number>>
  readonly recovery: {
    /** ms the broker was down: stop_app issued → a client reaches the input queue again. */
    readonly downMs: number
    /** The broker back → the first task settled by a worker (its decision line). */
    readonly firstSettledMs: number | undefined
    /** The broker back → the first terminal message of a task run after it, read by the platform. */
    readonly firstReceivedMs: number | undefined
    /**
     * Each worker running at the restart: the broker back → the first terminal message of a
     * task it ran after that, read by the platform (null: none before it ended, e.g. killed).
     */
    readonly perWorker: Readonly<Record<string, number | null>>
  } | undefined
  readonly workers: ReadonlyArray<WorkerRecord>
  readonly wallMs: number
  /** From the first worker spawned to the last task concluded. */
  readonly workMs: number
  readonly throughput: number
  readonly logDir: string
  readonly notes: ReadonlyArray<string>
}

// ---------------------------------------------------------------------------------------------
// The broker

const execFileAsync = (file: string, args: ReadonlyArray<string>, timeout = 120_000) =>
  new Promise<string>((resolvePromise, reject) => {
    execFile(file, [...args], { encoding: "utf8", timeout }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${file} ${args.join(" ")}: ${error.message} ${stderr}`))
      else resolvePromise(stdout)
    })
  })

/** `rabbitmqctl`, without blocking the event loop: the platform's consumer goes on meanwhile. */
export const rabbitmqctl = (...args: ReadonlyArray<string>): Promise<string> =>
  execFileAsync(RABBITMQCTL, ["-q", ...args])

/** The chaos vhost, quorum by default, with guest's permissions: made once, idempotently. */
export const ensureChaosVhost = async (): Promise<void> => {
  const existing = (await rabbitmqctl("list_vhosts")).split("\n").map((l) => l.trim())
  if (!existing.includes(CHAOS_VHOST)) {
    await rabbitmqctl("add_vhost", CHAOS_VHOST, "--default-queue-type", "quorum")
  }
  await rabbitmqctl("set_permissions", "-p", CHAOS_VHOST, "guest", ".*", ".*", ".*")
}

/** The connections on `vhost`, each with the local port of its client. */
const listConnections = async (vhost: string) =>
  (await rabbitmqctl("list_connections", "pid", "peer_port", "vhost"))
    .split("\n")
    .map((line) => line.split("\t"))
    .filter((f) => f.length === 3 && f[0]!.startsWith("<") && f[2] === vhost)
    .map(([pid, port]) => ({ pid: pid!, port: Number(port) }))

/** Local ports of the TCP connections to the broker each process holds (`ss -p`). */
const portsByProcess = async (): Promise<Map<number, Set<number>>> => {
  const out = await execFileAsync("ss", ["-tnpH", `dport = :${BROKER_PORT}`], 10_000)
  const map = new Map<number, Set<number>>()
  const connection = new RegExp(`\\s127\\.0\\.0\\.1:(\\d+)\\s+127\\.0\\.0\\.1:${BROKER_PORT}\\s`)
  for (const line of out.split("\n")) {
    const local = connection.exec(line)
    if (local === null) continue
    for (const owner of line.matchAll(/pid=(\d+)/g)) {
      const pid = Number(owner[1])
      const ports = map.get(pid) ?? new Set<number>()
      ports.add(Number(local[1]))
      map.set(pid, ports)
    }
  }
  return map
}

// ---------------------------------------------------------------------------------------------
// Worker processes

/** Every worker process started and not yet ended: killed on an interrupted run. */
const live = new Set<ChildProcess>()

/** Kills (SIGKILL) every worker process of the suite still running: for an interrupted run. */
export const killAllWorkers = (): void => {
  for (const child of live) {
    if (child.pid !== undefined) {
      try {
        process.kill(child.pid, "SIGKILL")
      } catch {
        // Already gone.
      }
    }
  }
}

/** A worker process of the suite (the cluster suite starts its own with `spawnWorker`). */
export interface WorkerProcess {
  readonly record: WorkerRecord
  readonly child: ChildProcess
  readonly exited: Promise<{ code: number | null; signal: string | null; at: number }>
  readonly running: () => boolean
  /** Resolves once the worker consumes (its start line), with its probe port. */
  readonly started: Promise<void>
  readonly port: () => number | undefined
}

/** Starts a worker process of the chaos fixture through the CLI. */
export const spawnWorker = (
  label: string,
  runtime: Runtime,
  env: Record<string, string>,
  logDir: string,
): WorkerProcess => {
  const spec = runtimeSpec(runtime)
  const baseEnv: Record<string, string> = { NO_COLOR: "1" }
  for (const key of ["PATH", "HOME", "TMPDIR", "LANG", "DENO_DIR", "XDG_CACHE_HOME"]) {
    const value = process.env[key]
    if (value !== undefined) baseEnv[key] = value
  }
  const child = spawn(spec.command, [...spec.args, "run", FIXTURE], {
    cwd: ROOT,
    env: {
      ...baseEnv,
      WORKER_SDK: spec.sdk,
      HOSTNAME: `chaos-${label}`,
      HEALTH_CHECK_HOST: "127.0.0.1",
      HEALTH_CHECK_PORT: "0",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  })
  live.add(child)
  const logFile = join(logDir, `${label}.log`)
  const out = createWriteStream(logFile)
  const err = createWriteStream(join(logDir, `${label}.stderr`))
  let port: number | undefined
  let pending = ""
  let onStarted: () => void = () => {}
  let onFailed: (e: Error) => void = () => {}
  const started = new Promise<void>((res, rej) => {
    onStarted = res
    onFailed = rej
  })
  started.catch(() => undefined)
  child.stdout!.on("data", (chunk: Buffer) => {
    out.write(chunk)
    if (port !== undefined && pending === "") return
    pending += chunk.toString("utf8")
    const probes = /Probes on http:\/\/[^:]+:(\d+)/.exec(pending)
    if (probes !== null && port === undefined) port = Number(probes[1])
    if (/Worker chaos started in service mode/.test(pending)) {
      pending = ""
      onStarted()
    } else if (pending.length > 100_000) pending = pending.slice(-10_000)
  })
  child.stderr!.on("data", (chunk: Buffer) => err.write(chunk))
  const record: WorkerRecord = {
    label,
    pid: child.pid,
    startedAt: Date.now(),
    get probePort() {
      return port
    },
    end: "running",
    exitCode: undefined,
    stopMs: undefined,
    logFile,
  }
  const exited = new Promise<{ code: number | null; signal: string | null; at: number }>(
    (res) => {
      child.once("error", (e) => {
        live.delete(child)
        onFailed(e)
        res({ code: null, signal: null, at: Date.now() })
      })
      child.once("close", (code, signal) => {
        live.delete(child)
        out.end()
        err.end()
        onFailed(
          new Error(`worker ${label} ended (code ${code}, signal ${signal}) before it started`),
        )
        res({ code, signal, at: Date.now() })
      })
    },
  )
  return {
    record,
    child,
    exited,
    running: () => live.has(child),
    started,
    port: () => port,
  }
}

/** The worker's `worker_tasks_in_flight` gauge, or undefined when its probe does not answer. */
export const inFlightOf = async (worker: WorkerProcess): Promise<number | undefined> => {
  const port = worker.port()
  if (port === undefined || !worker.running()) return undefined
  try {
    const response = await fetch(`http://127.0.0.1:${port}/metrics`, {
      signal: AbortSignal.timeout(1_000),
    })
    const text = await response.text()
    const m = /^worker_tasks_in_flight(?:\{[^}]*\})?\s+(\S+)/m.exec(text)
    return m === null ? 0 : Number(m[1])
  } catch {
    return undefined
  }
}

// ---------------------------------------------------------------------------------------------
// The platform's side: publishing, and the output queue read throughout with its own reconnection

interface Terminal {
  readonly type: "success" | "failure"
  /** The run's nonce (success), or the text (failure). */
  readonly key: string
  readonly receivedAt: number
  /** When the handler ended, in which process, at which attempt (success only). */
  readonly handlerAt: number | undefined
  readonly pid: number | undefined
  readonly attempt: number | undefined
  readonly code: string | undefined
}

/** Publishes `envelopes` on `queue` with confirms, 500 at a time. */
export const publishTasks = async (
  url: string,
  queue: string,
  envelopes: ReadonlyArray<string>,
): Promise<void> => {
  const connection = await amqp.connect(url)
  try {
    const channel = await connection.createConfirmChannel()
    const BATCH = 500
    for (let i = 0; i < envelopes.length; i += BATCH) {
      for (const body of envelopes.slice(i, i + BATCH)) {
        const ok = channel.sendToQueue(queue, Buffer.from(body), {
          persistent: true,
          contentType: "application/json",
        })
        if (!ok) await new Promise<void>((r) => channel.once("drain", () => r()))
      }
      await channel.waitForConfirms()
    }
    await channel.close()
  } finally {
    await connection.close().catch(() => undefined)
  }
}

/** Resolves with the time a client first reaches `queue` again (the broker is back), within `ms`. */
const brokerBack = async (url: string, queue: string, ms: number): Promise<number> => {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    let connection: amqp.ChannelModel | undefined
    try {
      connection = await amqp.connect(url, { timeout: 2_000 })
      connection.on("error", () => {})
      const channel = await connection.createChannel()
      channel.on("error", () => {})
      await channel.checkQueue(queue)
      const at = Date.now()
      await connection.close().catch(() => undefined)
      return at
    } catch {
      await connection?.close().catch(() => undefined)
      await sleep(25)
    }
  }
  throw new Error(`the broker did not come back within ${ms} ms`)
}

/**
 * The platform's side of one connection: `queue` read and acked, each message handed to
 * `onMessage`, until the connection closes. `opened` is told the connection as soon as it exists,
 * so that a reader can close it to stop.
 */
export const readUntilClosed = async (
  url: string,
  queue: string,
  onMessage: (m: amqp.ConsumeMessage) => void,
  opened: (connection: amqp.ChannelModel) => void,
): Promise<void> => {
  const connection = await amqp.connect(url, { timeout: 5_000 })
  opened(connection)
  const closed = new Promise<void>((r) => {
    connection.on("close", () => r())
    connection.on("error", () => {})
  })
  const channel = await connection.createChannel()
  channel.on("error", () => {})
  await channel.prefetch(2_000)
  await channel.consume(queue, (m) => {
    if (m === null) return
    onMessage(m)
    channel.ack(m)
  })
  await closed
}

const outputReader = (url: string, queue: string, onMessage: (m: amqp.ConsumeMessage) => void) => {
  let stopped = false
  let connection: amqp.ChannelModel | undefined
  let reconnections = -1
  const opened = (c: amqp.ChannelModel) => {
    connection = c
    reconnections++
  }
  const loop = (async () => {
    while (!stopped) {
      // The broker away: try again.
      await readUntilClosed(url, queue, onMessage, opened).catch(() => undefined)
      if (!stopped) await sleep(100)
    }
  })()
  return {
    reconnections: () => Math.max(0, reconnections),
    stop: async () => {
      stopped = true
      await connection?.close().catch(() => undefined)
      await loop
    },
  }
}

// ---------------------------------------------------------------------------------------------
// The run

/** The order of the faults: the restart in the middle, the kills spread, closes elsewhere. */
export const faultPlan = (
  closes: number,
  kills: number,
  restart: boolean,
): Array<FaultKind> => {
  const n = closes + kills + (restart ? 1 : 0)
  const plan: Array<FaultKind | undefined> = new Array(n).fill(undefined)
  const place = (kind: FaultKind, ideal: number) => {
    for (let d = 0; d < n; d++) {
      for (const i of [ideal + d, ideal - d]) {
        if (i >= 0 && i < n && plan[i] === undefined) {
          plan[i] = kind
          return
        }
      }
    }
  }
  if (restart) place("restart", Math.floor(n / 2))
  for (let k = 0; k < kills; k++) place("kill", Math.round(((k + 0.5) * n) / kills))
  return plan.map((kind) => kind ?? "close")
}

export const runChaos = async (options: ChaosOptions): Promise<ChaosReport> => {
  const t0 = Date.now()
  const log = options.log ?? (() => {})
  const notes: Array<string> = []
  const workerCount = options.workers ?? 2
  const [taskMin, taskMax] = options.taskMs ?? [50, 150]
  const [windowStart, windowEnd] = options.faultWindow ?? [0.03, 0.85]
  const stallMs = options.stallMs ?? 30_000
  const timeoutMs = options.timeoutMs ?? 600_000
  if (options.runtime === "node") {
    const stale = checkBuild(options.allowStaleBuild ?? false)
    if (stale !== undefined) notes.push(stale)
  }
  const name = `chaos-${randomUUID().slice(0, 8)}`
  const inQueue = `${name}_queue_in`
  const outQueue = `${name}_queue_out`
  const logDir = options.logDir ?? join(tmpdir(), name)
  mkdirSync(logDir, { recursive: true })
  const url = urlFor(CHAOS_VHOST)

  ensureBrokerRunning()
  await ensureChaosVhost()

  // The queues as the worker declares them (durable, no arguments: quorum on this vhost), and
  // away with those an interrupted run left (no consumer: this vhost is the suite's alone).
  {
    const leftovers = (await rabbitmqctl("list_queues", "-p", CHAOS_VHOST, "name", "consumers"))
      .split("\n")
      .map((line) => line.split("\t"))
      .filter((f) =>
        f.length === 2 && /^chaos-[0-9a-f]{8}_queue_(in|out)$/.test(f[0]!) && f[1] === "0"
      )
      .map((f) => f[0]!)
    const connection = await amqp.connect(url)
    const channel = await connection.createChannel()
    for (const queue of leftovers) await channel.deleteQueue(queue)
    if (leftovers.length > 0) log(`removed ${leftovers.length} queues left by an interrupted run`)
    await channel.assertQueue(inQueue, { durable: true })
    await channel.assertQueue(outQueue, { durable: true })
    await connection.close()
  }

  // The tasks: ids counted, some perhaps dropped or doubled to check the accounting itself.
  const ids = Array.from({ length: options.tasks }, (_, i) => `${name}-${i}`)
  const dropped = new Set(ids.slice(0, options.dropTasks ?? 0))
  const order = [
    ...ids.filter((id) => !dropped.has(id)),
    ...ids.slice(ids.length - (options.duplicateTasks ?? 0)),
  ]
  const publishedIds = new Set(order)
  const reserve = Math.min(options.reserve ?? Math.floor(order.length / 5), order.length)
  const first = order.slice(0, order.length - reserve)
  const heldBack = order.slice(order.length - reserve)
  let published = first.length
  /** Spent before the faults: at most half the reserve, the rest published after the last. */
  let topUpsLeft = Math.floor(reserve / 2)
  // The faults' thresholds count the tasks of the first batch only, which can all conclude
  // before the reserve is published.
  const firstExpected = new Set(first).size
  await publishTasks(url, inQueue, first.map((id) => envelope(id, { id })))
  log(`published ${first.length} envelopes on ${CHAOS_VHOST}/${inQueue}, ${reserve} held back`)

  // The output queue, read throughout.
  const terminals = new Map<string, Array<Terminal>>()
  let concludedCount = 0
  let lastConcludedAt = Date.now()
  let rereadByPlatform = 0
  const extraTimes: Array<{ at: number; id: string }> = []
  const reader = outputReader(url, outQueue, (m) => {
    const type = m.properties.type
    if (type !== "success" && type !== "failure") return
    const now = Date.now()
    const text = m.content.toString("utf8")
    let parsed: {
      task_id: string
      data: {
        response?: { run: string; at: number; pid: number; attempt: number }
        error_message?: { code: string }
      }
    }
    try {
      parsed = JSON.parse(text)
    } catch {
      notes.push(`unparsable terminal message: ${text.slice(0, 200)}`)
      return
    }
    const key = type === "success" ? parsed.data.response?.run ?? text : text
    const list = terminals.get(parsed.task_id) ?? []
    if (list.some((t) => t.key === key) && (type === "success" || m.fields.redelivered)) {
      rereadByPlatform++
      return
    }
    list.push({
      type,
      key,
      receivedAt: now,
      handlerAt: parsed.data.response?.at,
      pid: parsed.data.response?.pid,
      attempt: parsed.data.response?.attempt,
      code: parsed.data.error_message?.code,
    })
    if (list.length === 1) {
      terminals.set(parsed.task_id, list)
      concludedCount++
      lastConcludedAt = now
    } else {
      extraTimes.push({ at: now, id: parsed.task_id })
    }
  })

  const env: Record<string, string> = {
    BROKER_URL: url,
    IN_QUEUE_NAME: inQueue,
    OUT_QUEUE_NAME: outQueue,
    WORKER_CONCURRENCY: String(options.concurrency),
    WORKER_SHUTDOWN_GRACE_S: "5",
    LOG_LEVEL: "info",
    CHAOS_TASK_MIN_MS: String(taskMin),
    CHAOS_TASK_MAX_MS: String(taskMax),
  }
  const all: Array<WorkerProcess> = []
  const slots: Array<WorkerProcess> = []
  let spawned = 0
  const startWorker = (slot: number) => {
    const w = spawnWorker(`w${++spawned}`, options.runtime, env, logDir)
    all.push(w)
    slots[slot] = w
    return w
  }

  const faults: Array<FaultRecord> = []
  const plan = faultPlan(options.closes, options.kills, options.restartBroker)
  let restart: { issuedAt: number; backAt: number; targets: Array<string> } | undefined
  let workStart = 0
  let workEnd = 0
  let listingTimer: ReturnType<typeof setTimeout> | undefined
  try {
    workStart = Date.now()
    for (let i = 0; i < workerCount; i++) startWorker(i)
    await Promise.all(slots.map((w) => w.started))
    log(`${workerCount} ${options.runtime} workers consuming after ${Date.now() - workStart} ms`)

    const expected = publishedIds.size
    /**
     * What the targets had in flight at a fault: their gauges read just before `action`, and
     * every 50 ms while it runs (a `rabbitmqctl` command takes half a second or more, and the
     * workers go on meanwhile), the largest reading of each. A target whose probe never
     * answered counts its prefetch, the most it can hold.
     */
    const inFlightDuring = async <A>(
      targets: ReadonlyArray<WorkerProcess>,
      action: () => Promise<A>,
    ) => {
      const values: Array<number | undefined> = targets.map(() => undefined)
      const sample = async () => {
        const now = await Promise.all(targets.map(inFlightOf))
        now.forEach((v, i) => {
          if (v !== undefined) values[i] = Math.max(values[i] ?? 0, v)
        })
      }
      await sample()
      let running = true
      const sampler = (async () => {
        while (running) {
          await sleep(50)
          if (running) await sample()
        }
      })()
      try {
        return {
          result: await action(),
          values,
          sum: values.reduce<number>((s, v) => s + (v ?? options.concurrency), 0),
        }
      } finally {
        running = false
        await sampler
      }
    }
    /** Waits until `w` has a task in flight, within `ms`. */
    const untilInFlight = async (w: WorkerProcess, ms: number) => {
      const deadline = Date.now() + ms
      while (Date.now() < deadline && w.running() && ((await inFlightOf(w)) ?? 0) === 0) {
        await sleep(50)
      }
    }
    let nextSlot = 0
    let listing: Promise<Array<{ pid: string; port: number }>> = Promise.resolve([])
    const refreshListing = (delay: number) => {
      clearTimeout(listingTimer)
      if (delay === 0) {
        listing = listConnections(CHAOS_VHOST)
        listing.catch(() => undefined)
      } else listingTimer = setTimeout(() => refreshListing(0), delay)
    }
    refreshListing(0)
    for (let index = 0; index < plan.length; index++) {
      const kind = plan[index]!
      const threshold = plan.length === 1
        ? windowStart
        : windowStart + ((windowEnd - windowStart) * index) / (plan.length - 1)
      while (
        concludedCount < threshold * firstExpected && Date.now() - t0 < timeoutMs &&
        Date.now() - lastConcludedAt < stallMs
      ) {
        await sleep(10)
      }
      // A backlog for this fault, whatever the faults before it took.
      const backlog = 2 * options.concurrency * workerCount
      const topUp = Math.min(topUpsLeft, Math.max(0, backlog - (published - concludedCount)))
      if (topUp > 0) {
        await publishTasks(
          url,
          inQueue,
          heldBack.splice(0, topUp).map((id) => envelope(id, { id })),
        )
        published += topUp
        topUpsLeft -= topUp
        log(`published ${topUp} of the envelopes held back, for a backlog at fault ${index + 1}`)
      }
      const at = Date.now()
      const concluded = concludedCount
      if (concluded >= expected) {
        notes.push(`fault ${index + 1} (${kind}) struck after every task had concluded`)
      }
      if (kind === "close") {
        // A worker with a connection, alternating: one that is (re)connecting is skipped. The
        // broker's listing (half a second of `rabbitmqctl`) is taken ahead, between faults, and
        // checked against the sockets each process holds now (`ss`, a few ms): a worker that
        // reconnected since is looked up again.
        let done: FaultRecord | undefined
        const deadline = Date.now() + 15_000
        while (done === undefined && Date.now() < deadline) {
          const ports = await portsByProcess()
          const candidates = (connections: ReadonlyArray<{ pid: string; port: number }>) =>
            Array.from({ length: slots.length }, (_, k) => (nextSlot + k) % slots.length)
              .map((slot) => {
                const w = slots[slot]!
                const held = ports.get(w.record.pid ?? -1) ?? new Set<number>()
                return { slot, w, connection: connections.find((c) => held.has(c.port)) }
              })
              .filter((c) => c.connection !== undefined && c.w.running())
          let found = candidates(await listing.catch(() => []))
          if (found.length === 0) {
            refreshListing(0)
            found = candidates(await listing.catch(() => []))
          }
          const target = found[0]
          if (target === undefined) {
            await sleep(200)
            continue
          }
          const { w, connection } = target as typeof target & {
            connection: { pid: string; port: number }
          }
          // A worker just reconnected may have nothing in hand yet: a moment for it to take some.
          await untilInFlight(w, 3_000)
          let inFlight: { values: Array<number | undefined>; sum: number }
          try {
            inFlight = await inFlightDuring(
              [w],
              () => rabbitmqctl("close_connection", connection.pid, "chaos: forced close"),
            )
          } catch (e) {
            notes.push(`close ${index + 1}: ${(e as Error).message.slice(0, 200)}; trying again`)
            refreshListing(0)
            continue
          }
          nextSlot = (target.slot + 1) % slots.length
          done = {
            index,
            kind,
            at: at - workStart,
            concluded,
            threshold,
            targets: [w.record.label],
            inFlight: inFlight.values,
            inFlightSum: inFlight.sum,
            prefetchBound: options.concurrency,
            detail: `closed ${connection.pid} (port ${connection.port})`,
            durationMs: Date.now() - at,
            duplicates: 0,
          }
        }
        if (done === undefined) {
          notes.push(`close ${index + 1}: no worker connection found within 15 s`)
          continue
        }
        faults.push(done)
      } else if (kind === "kill") {
        const slot = nextSlot
        nextSlot = (nextSlot + 1) % slots.length
        const w = slots[slot]!
        // A replacement still starting, or a worker not yet back after the broker's restart,
        // has nothing in flight: it is killed once it has (within 10 s).
        await Promise.race([w.started.catch(() => undefined), sleep(30_000)])
        await untilInFlight(w, 10_000)
        const inFlight = await inFlightDuring([w], () => {
          process.kill(w.record.pid!, "SIGKILL")
          return w.exited
        })
        w.record.end = "killed"
        const replacement = startWorker(slot)
        faults.push({
          index,
          kind,
          at: at - workStart,
          concluded,
          threshold,
          targets: [w.record.label],
          inFlight: inFlight.values,
          inFlightSum: inFlight.sum,
          prefetchBound: options.concurrency,
          detail: `kill -9 ${w.record.pid}; replaced by ${replacement.record.label}`,
          durationMs: Date.now() - at,
          duplicates: 0,
        })
      } else {
        const targets = [...slots]
        const issuedAt = Date.now()
        let stoppedAt = issuedAt
        let startedAt = issuedAt
        let backAt = issuedAt
        let inFlight = { values: targets.map((): number | undefined => undefined), sum: 0 }
        try {
          inFlight = await inFlightDuring(targets, () => rabbitmqctl("stop_app"))
          stoppedAt = Date.now()
        } finally {
          // The broker's return, as a client sees it: the first connection that reaches the
          // input queue, polled from the moment the application is stopped. (`start_app` and
          // `await_startup` return later than that, by the start of each `rabbitmqctl`.)
          const back = brokerBack(url, inQueue, 120_000)
          await rabbitmqctl("start_app")
          startedAt = Date.now()
          await rabbitmqctl("await_startup")
          backAt = await back
        }
        const awaitedAt = Date.now()
        restart = { issuedAt, backAt, targets: targets.map((w) => w.record.label) }
        faults.push({
          index,
          kind,
          at: at - workStart,
          concluded,
          threshold,
          targets: targets.map((w) => w.record.label),
          inFlight: inFlight.values,
          inFlightSum: inFlight.sum,
          prefetchBound: options.concurrency * targets.length,
          detail: `stop_app took ${stoppedAt - issuedAt} ms; back (a client reaches the queue) ` +
            `${backAt - stoppedAt} ms after it, start_app returned ${startedAt - stoppedAt} ms, ` +
            `await_startup ${awaitedAt - stoppedAt} ms`,
          durationMs: awaitedAt - at,
          duplicates: 0,
        })
      }
      // A worker touched has reconnected by then: the listing for the next close is ready.
      refreshListing(700)
      const f = faults.at(-1)!
      log(
        `fault ${index + 1}/${plan.length} ${kind} at ${concluded}/${expected} concluded: ` +
          `${f.targets.join("+")} in flight ${
            f.inFlight.map((v) => v ?? "?").join("+")
          }; ${f.detail}`,
      )
    }

    // Every fault has struck: the reserve, then the rest of the tasks.
    await publishTasks(url, inQueue, heldBack.map((id) => envelope(id, { id })))
    log(`published the last ${heldBack.length} envelopes held back`)
    // The wait for a new conclusion starts with them: while the faults struck, every task
    // published may have concluded long ago, and the stall counted from then would give up on
    // tasks just published.
    lastConcludedAt = Math.max(lastConcludedAt, Date.now())
    while (
      concludedCount < expected &&
      Date.now() - lastConcludedAt < stallMs &&
      Date.now() - t0 < timeoutMs
    ) {
      await sleep(20)
    }
    workEnd = lastConcludedAt
    if (concludedCount < expected) {
      notes.push(
        `stopped waiting with ${expected - concludedCount} tasks unconcluded ` +
          `(${Date.now() - lastConcludedAt} ms without a new one)`,
      )
    }
    log(`${concludedCount}/${expected} concluded; stopping the workers (SIGTERM)`)
  } finally {
    clearTimeout(listingTimer)
    // A replacement still starting would die of SIGTERM before its handlers are installed.
    await Promise.all(
      all.filter((w) => w.running()).map((w) =>
        Promise.race([w.started.catch(() => undefined), sleep(30_000)])
      ),
    )
    // The end: SIGTERM to every worker still running, within the shutdown bound (max(5, 5) + 17 s).
    await Promise.all(
      all.filter((w) => w.running()).map(async (w) => {
        const sent = Date.now()
        process.kill(w.record.pid!, "SIGTERM")
        const timer = setTimeout(() => {
          if (w.running()) process.kill(w.record.pid!, "SIGKILL")
        }, 27_000)
        const exited = await w.exited
        clearTimeout(timer)
        w.record.exitCode = exited.code
        w.record.stopMs = exited.at - sent
        w.record.end = exited.signal !== null
          ? `ended by ${exited.signal}`
          : `exit ${exited.code} after SIGTERM`
      }),
    )
    for (const w of all) {
      if (w.record.end === "running") {
        const exited = await w.exited
        w.record.end = `ended by itself (code ${exited.code}, signal ${exited.signal})`
        w.record.exitCode = exited.code
      }
    }
    ensureBrokerRunning()
  }

  // What is still on its way to the platform's consumer.
  {
    const quiet = Date.now()
    let count = concludedCount + extraTimes.length + rereadByPlatform
    let since = Date.now()
    while (Date.now() - since < 1_000 && Date.now() - quiet < 15_000) {
      await sleep(100)
      const now = concludedCount + extraTimes.length + rereadByPlatform
      if (now !== count) {
        count = now
        since = Date.now()
      }
    }
  }
  await reader.stop()

  let stillQueued = 0
  {
    const connection = await amqp.connect(url)
    const channel = await connection.createChannel()
    stillQueued = (await channel.checkQueue(inQueue)).messageCount
    const left = (await channel.checkQueue(outQueue)).messageCount
    if (left > 0) notes.push(`${left} messages left unread on the output queue`)
    await channel.deleteQueue(inQueue)
    await channel.deleteQueue(outQueue)
    await connection.close()
  }

  // The accounting.
  const lostIds = ids.filter((id) => !terminals.has(id))
  const duplicateIds = [...terminals].filter(([, list]) => list.length > 1).map(([id]) => id)
  const extraTerminalMessages = [...terminals.values()].reduce((s, l) => s + l.length - 1, 0)
  // Each duplicate is put down to the fault that took its first run's ack: the first fault that
  // touched the process of that run and ended after its handler did.
  const labelOf = new Map(all.map((w) => [w.record.pid, w.record.label]))
  const duplicateDetails: Array<DuplicateDetail> = []
  for (const id of duplicateIds) {
    const list = terminals.get(id)!
    const first = list[0]!
    const label = first.pid === undefined ? undefined : labelOf.get(first.pid)
    const since = first.handlerAt ?? first.receivedAt
    const fault = faults.find((f) =>
      workStart + f.at + f.durationMs >= since &&
      (label === undefined || f.targets.includes(label))
    )
    if (fault !== undefined) fault.duplicates++
    duplicateDetails.push({
      id,
      fault: fault === undefined ? undefined : fault.index + 1,
      runs: list.map((t) =>
        `${t.type} by ${t.pid === undefined ? "?" : labelOf.get(t.pid) ?? t.pid} attempt ${
          t.attempt ?? "?"
        }, handler ended ${t.handlerAt === undefined ? "?" : t.handlerAt - workStart} ms, ` +
        `read ${t.receivedAt - workStart} ms`
      ),
    })
  }
  const failuresByCode: Record<string, number> = {}
  for (const list of terminals.values()) {
    for (const t of list) {
      if (t.type === "failure") {
        failuresByCode[t.code ?? "?"] = (failuresByCode[t.code ?? "?"] ?? 0) + 1
      }
    }
  }

  // The workers' logs: decisions, warnings, and the first task settled after the broker's return.
  const decisions: Record<string, number> = {}
  const workerWarnings: Record<string, number> = {}
  let firstSettledAfterBack: number | undefined
  const perWorker: Record<string, number | null> = {}
  for (const w of all) {
    const atRestart = restart?.targets.includes(w.record.label) ?? false
    if (atRestart) perWorker[w.record.label] = null
    let text = ""
    try {
      text = readFileSync(w.record.logFile, "utf8")
    } catch {
      continue
    }
    for (const line of text.split("\n")) {
      if (line === "") continue
      let r: Record<string, unknown>
      try {
        r = JSON.parse(line)
      } catch {
        workerWarnings["(a line that is not JSON)"] =
          (workerWarnings["(a line that is not JSON)"] ?? 0) + 1
        continue
      }
      const msg = String(r.msg)
      if (msg.startsWith("Delivery settled:")) {
        const key = `${r.outcome}/${r.action}${r.code === undefined ? "" : `/${r.code}`}`
        decisions[key] = (decisions[key] ?? 0) + 1
        if (
          restart !== undefined && (r.outcome === "success" || r.outcome === "failure")
        ) {
          const ts = Date.parse(String(r.ts))
          if (
            ts >= restart.backAt &&
            (firstSettledAfterBack === undefined || ts < firstSettledAfterBack)
          ) firstSettledAfterBack = ts
        }
      } else if (
        r.level === "WARN" || r.level === "WARNING" || r.level === "ERROR" || r.level === "FATAL"
      ) {
        const key = `${r.level}: ${msg.replace(/\d+/g, "N").slice(0, 160)}`
        workerWarnings[key] = (workerWarnings[key] ?? 0) + 1
      }
    }
  }
  let firstReceivedAfterBack: number | undefined
  if (restart !== undefined) {
    for (const list of terminals.values()) {
      for (const t of list) {
        if (
          t.handlerAt !== undefined && t.handlerAt >= restart.backAt &&
          (firstReceivedAfterBack === undefined || t.receivedAt < firstReceivedAfterBack)
        ) firstReceivedAfterBack = t.receivedAt
        // Per worker, from the messages (a killed process loses the last lines of its log).
        const label = t.pid === undefined ? undefined : labelOf.get(t.pid)
        const mine = label === undefined ? undefined : perWorker[label]
        if (
          label !== undefined && mine !== undefined && t.handlerAt !== undefined &&
          t.handlerAt >= restart.backAt &&
          (mine === null || t.receivedAt - restart.backAt < mine)
        ) perWorker[label] = t.receivedAt - restart.backAt
      }
    }
  }

  const inFlightBound = faults.reduce((s, f) => s + f.inFlightSum, 0)
  const prefetchBound = faults.reduce((s, f) => s + f.prefetchBound, 0)
  const workMs = Math.max(1, (workEnd || Date.now()) - workStart)
  const { log: _log, ...rest } = options
  const report: ChaosReport = {
    options: rest,
    vhost: CHAOS_VHOST,
    queues: { in: inQueue, out: outQueue },
    tasks: ids.length,
    published: order.length,
    concluded: terminals.size,
    lost: lostIds.length,
    lostIds,
    stillQueued,
    duplicates: duplicateIds.length,
    duplicateIds,
    duplicateDetails,
    extraTerminalMessages,
    rereadByPlatform,
    faultsPlanned: plan.length,
    faults,
    inFlightBound,
    prefetchBound,
    failuresByCode,
    decisions,
    workerWarnings,
    recovery: restart === undefined ? undefined : {
      downMs: restart.backAt - restart.issuedAt,
      firstSettledMs: firstSettledAfterBack === undefined
        ? undefined
        : firstSettledAfterBack - restart.backAt,
      firstReceivedMs: firstReceivedAfterBack === undefined
        ? undefined
        : firstReceivedAfterBack - restart.backAt,
      perWorker,
    },
    workers: all.map((w) => w.record),
    wallMs: Date.now() - t0,
    workMs,
    throughput: (terminals.size / workMs) * 1000,
    logDir,
    notes: [
      ...notes,
      ...(reader.reconnections() > 0
        ? [`the platform's consumer reconnected ${reader.reconnections()} time(s)`]
        : []),
    ],
  }
  writeFileSync(join(logDir, "report.json"), JSON.stringify(report, null, 2))
  return report
}

// ---------------------------------------------------------------------------------------------
// The report

const counts = (record: Readonly<Record<string, number>>) =>
  Object.entries(record).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(", ") ||
  "none"

export const formatReport = (r: ChaosReport): string => {
  const lines: Array<string> = []
  const o = r.options
  lines.push(
    `chaos: ${r.tasks} tasks, ${
      o.workers ?? 2
    } ${o.runtime} workers at concurrency ${o.concurrency}, ` +
      `${r.faults.length}/${r.faultsPlanned} faults (${o.closes} closes, ${o.kills} kill -9, ` +
      `${o.restartBroker ? 1 : 0} broker restart), vhost ${r.vhost}`,
  )
  lines.push("")
  const row = (cells: ReadonlyArray<string>, widths: ReadonlyArray<number>) =>
    cells.map((c, i) => (i < widths.length ? c.padStart(widths[i]!) : c)).join("  ")
  const widths = [3, 7, 6, 9, 9, 9, 8, 4, 6]
  lines.push(
    row(
      [
        "#",
        "kind",
        "at (s)",
        "concluded",
        "targets",
        "in flight",
        "prefetch",
        "dups",
        "took",
        "detail",
      ],
      widths,
    ),
  )
  for (const f of r.faults) {
    lines.push(row([
      String(f.index + 1),
      f.kind,
      (f.at / 1000).toFixed(1),
      String(f.concluded),
      f.targets.join("+"),
      f.inFlight.map((v) => v ?? "?").join("+"),
      String(f.prefetchBound),
      String(f.duplicates),
      `${(f.durationMs / 1000).toFixed(1)}s`,
      f.detail,
    ], widths))
  }
  for (const d of r.duplicateDetails.slice(0, 8)) {
    lines.push(`  duplicate ${d.id} (fault ${d.fault ?? "?"}): ${d.runs.join("; ")}`)
  }
  if (r.duplicateDetails.length > 8) {
    lines.push(`  ... ${r.duplicateDetails.length - 8} more duplicates in report.json`)
  }
  lines.push("")
  lines.push(`tasks            ${r.tasks} (published ${r.published} envelopes)`)
  lines.push(`concluded        ${r.concluded}`)
  lines.push(
    `LOST             ${r.lost}${
      r.lost > 0 ? `  (still queued ${r.stillQueued}): ${r.lostIds.slice(0, 10).join(" ")}` : ""
    }`,
  )
  lines.push(
    `duplicates       ${r.duplicates} tasks (${r.extraTerminalMessages} extra terminal messages); ` +
      `in-flight bound ${r.inFlightBound} (Σ in flight at each fault), prefetch bound ${r.prefetchBound}` +
      ` -> ${r.duplicates <= r.inFlightBound ? "within" : "OVER"} the in-flight bound`,
  )
  lines.push(`failures by code ${counts(r.failuresByCode)}`)
  if (r.recovery !== undefined) {
    const ms = (v: number | undefined) => (v === undefined ? "none" : `${v} ms`)
    lines.push(
      `broker restart   down ${r.recovery.downMs} ms (stop_app issued → a client reaches the queue); from its return ` +
        `to the first task settled ${ms(r.recovery.firstSettledMs)} (worker's decision line), ` +
        `to the first terminal message of a task run after it read by the platform ${
          ms(r.recovery.firstReceivedMs)
        }; each worker's first such message ${
          Object.entries(r.recovery.perWorker).map(([label, v]) =>
            `${label} ${v === null ? "none before it ended" : `${v} ms`}`
          ).join(", ")
        }`,
    )
  }
  lines.push(
    `wall time        ${(r.wallMs / 1000).toFixed(1)} s; work ${(r.workMs / 1000).toFixed(1)} s ` +
      `(first worker spawned → last task concluded), ${r.throughput.toFixed(0)} tasks/s`,
  )
  lines.push(`decisions        ${counts(r.decisions)}`)
  lines.push(`worker warnings  ${counts(r.workerWarnings)}`)
  lines.push(
    `workers          ${
      r.workers.map((w) =>
        `${w.label}(pid ${w.pid}): ${w.end}${w.stopMs === undefined ? "" : ` in ${w.stopMs} ms`}`
      ).join("; ")
    }`,
  )
  if (r.rereadByPlatform > 0) {
    lines.push(
      `platform reread  ${r.rereadByPlatform} messages delivered again to its consumer (not duplicates)`,
    )
  }
  for (const note of r.notes) lines.push(`note             ${note}`)
  lines.push(`logs             ${r.logDir} (the workers' JSON lines, and report.json)`)
  return lines.join("\n")
}

// ---------------------------------------------------------------------------------------------
// The command

const USAGE = `Usage: deno run -A test/chaos/chaos.ts [options]   (npm run chaos -- [options])
  --tasks N          tasks (10000)
  --closes N         forced connection closes (20)
  --kills N          kill -9 of a worker process (3)
  --no-restart       no broker stop_app/start_app (one by default)
  --concurrency N    WORKER_CONCURRENCY of each worker (20)
  --workers N        worker processes at once (2)
  --runtime R        deno (the CLI from the sources, default) or node (dist/cli.js)
  --task-ms A-B      the handler's random wait (50-150)
  --allow-stale-build  with --runtime node, run dist/ even when src/ is newer
  --drop N           check the accounting: N task ids never published (must show as lost)
  --duplicate N      check the accounting: N tasks published twice (must show as duplicates)
  --json             print the report as JSON too
It stops and restarts the broker: run it alone, e.g. flock -x /tmp/rabbit.lock npm run chaos`

export const main = async (argv: ReadonlyArray<string>): Promise<number> => {
  const args = [...argv]
  const options: {
    -readonly [K in keyof ChaosOptions]: ChaosOptions[K]
  } = {
    tasks: 10_000,
    closes: 20,
    kills: 3,
    restartBroker: true,
    concurrency: 20,
    runtime: "deno",
    workers: 2,
  }
  let json = false
  const int = (flag: string, value: string | undefined) => {
    const n = Number(value)
    if (!Number.isInteger(n) || n < 0) throw new Error(`${flag} needs a whole number, not ${value}`)
    return n
  }
  try {
    while (args.length > 0) {
      const flag = args.shift()!
      switch (flag) {
        case "--tasks":
          options.tasks = int(flag, args.shift())
          break
        case "--closes":
          options.closes = int(flag, args.shift())
          break
        case "--kills":
          options.kills = int(flag, args.shift())
          break
        case "--no-restart":
          options.restartBroker = false
          break
        case "--concurrency":
          options.concurrency = Math.max(1, int(flag, args.shift()))
          break
        case "--workers":
          options.workers = Math.max(1, int(flag, args.shift()))
          break
        case "--runtime": {
          const r = args.shift()
          if (r !== "node" && r !== "deno") throw new Error("--runtime is node or deno")
          options.runtime = r
          break
        }
        case "--task-ms": {
          const m = /^(\d+)-(\d+)$/.exec(args.shift() ?? "")
          if (m === null) throw new Error("--task-ms is MIN-MAX, in ms")
          options.taskMs = [Number(m[1]), Number(m[2])]
          break
        }
        case "--drop":
          options.dropTasks = int(flag, args.shift())
          break
        case "--duplicate":
          options.duplicateTasks = int(flag, args.shift())
          break
        case "--json":
          json = true
          break
        case "--allow-stale-build":
          options.allowStaleBuild = true
          break
        case "--help":
        case "-h":
          console.log(USAGE)
          return 0
        default:
          throw new Error(`unknown option ${flag}`)
      }
    }
  } catch (e) {
    console.error(`${(e as Error).message}\n${USAGE}`)
    return 2
  }
  const interrupted = () => {
    console.error("interrupted: killing the workers and starting the broker if stopped")
    killAllWorkers()
    ensureBrokerRunning()
    process.exit(130)
  }
  process.on("SIGINT", interrupted)
  process.on("SIGTERM", interrupted)
  const started = Date.now()
  const report = await runChaos({
    ...options,
    log: (line) => console.log(`[${((Date.now() - started) / 1000).toFixed(1)} s] ${line}`),
  })
  console.log("")
  console.log(formatReport(report))
  if (json) console.log(JSON.stringify(report, null, 2))
  const verdict = checkReport(report)
  console.log(verdict.length === 0 ? "RESULT: PASS" : `RESULT: FAIL: ${verdict.join("; ")}`)
  return verdict.length === 0 ? 0 : 1
}

/** What is wrong with a run, by the suite's acceptance: nothing, for a pass. */
export const checkReport = (r: ChaosReport): Array<string> => {
  const wrong: Array<string> = []
  if (r.lost > 0) wrong.push(`${r.lost} tasks lost`)
  if (r.duplicates > r.inFlightBound) {
    wrong.push(`${r.duplicates} duplicates, over the in-flight bound ${r.inFlightBound}`)
  }
  if (r.faults.length < r.faultsPlanned) {
    wrong.push(`${r.faults.length} of ${r.faultsPlanned} faults struck`)
  }
  const late = r.faults.filter((f) => f.concluded >= r.tasks - (r.options.dropTasks ?? 0))
  if (late.length > 0) wrong.push(`${late.length} faults struck after every task had concluded`)
  return wrong
}

if ((import.meta as { main?: boolean }).main) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (e) => {
      console.error(e)
      killAllWorkers()
      ensureBrokerRunning()
      process.exit(1)
    },
  )
}
