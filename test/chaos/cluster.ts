/**
 * The cluster fault suite (issue 24, point 5): three RabbitMQ nodes of its own (`c1@localhost`…,
 * see cluster-nodes.ts) beside the machine's broker, joined, quorum queues on all three; two
 * worker processes of the CLI, each reaching every node through a TCP proxy of the suite's own
 * (fault-proxy.ts: a partition without iptables), `BROKER_URL` listing the three; then faults,
 * each on a backlog of its own: a queue leader's node killed (`kill -9`) or hung (`SIGSTOP`), a
 * worker's own node stopped then another's killed, a worker's path black-holed or stalled, a
 * worker's node hung past `net_ticktime`. It prints, per fault, what the workers touched had in
 * flight, the tasks lost (must be 0), the tasks run twice (allowed, against what was in flight),
 * the extra terminal copies (one message, by its `message_id`, read twice: must be 0), the time
 * from the fault to the first task delivered after it and settled, the longest time its backlog
 * went without a task concluded, when the worker gave its connection up (its log), and how long
 * its `/ready` stayed 200 (polled every 100 ms). Exit 1 on a task lost or an extra copy.
 *
 * Why each worker goes through proxies to every node: the suite knows which node each is on
 * (the proxy that carries its connection), and can cut one worker's path to one node alone.
 *
 * `npm run chaos:cluster -- --tasks 600 --faults kill-input-leader,own-node-stopped`; `--help`.
 * It stops its nodes at the end, whatever happened; the machine's broker is never touched.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import process from "node:process"
import amqp from "amqplib"
import {
  inFlightOf,
  killAllWorkers,
  publishTasks,
  readUntilClosed,
  spawnWorker,
  type WorkerProcess,
} from "./chaos.ts"
import {
  type Cluster,
  type ClusterNode,
  makeCluster,
  partitionsSeen,
  queueStates,
} from "./cluster-nodes.ts"
import { type FaultProxy, startProxy } from "./fault-proxy.ts"
import type { Runtime } from "../support/runtimes.ts"
import { envelope } from "../support/builders.ts"
import { sleep } from "../support/waits.ts"

const VHOST = "cluster-chaos"
const IN_QUEUE = "chaos-cluster_queue_in"
const OUT_QUEUE = "chaos-cluster_queue_out"
/** How long a leader's node hangs, a path drops or stalls, a worker's node hangs past ticktime. */
const HANG_S = 15
const PARTITION_S = 40
const LONG_HANG_S = 80

const secondsSince = (from: number, to: number | undefined) =>
  to === undefined ? undefined : (to - from) / 1000

// ---------------------------------------------------------------------------------------------
// Options

export const FAULTS = [
  "kill-input-leader",
  "kill-both-leader",
  "hang-both-leader",
  "own-node-stopped",
  "proxy-drop",
  "proxy-stall",
  "own-node-hung",
] as const
export type FaultName = typeof FAULTS[number]
const DEFAULT_FAULTS: ReadonlyArray<FaultName> = FAULTS

export interface ClusterOptions {
  readonly tasks: number
  readonly faults: ReadonlyArray<FaultName>
  /** WORKER_HEARTBEAT_S of the workers (undefined: the SDK's default, 10 s). */
  readonly heartbeat: number | undefined
  readonly taskMs: readonly [number, number]
  readonly concurrency: number
  readonly keep: boolean
  readonly firstPort: number
  /** The workers' runtime: Deno runs the CLI from the sources, Node from dist/ (default Deno). */
  readonly runtime: Runtime
}

const USAGE =
  `Usage: deno run -A test/chaos/cluster.ts [options]   (npm run chaos:cluster -- [options])
  --tasks N          tasks in all, shared out among the faults (5000)
  --faults a,b,...   which faults, in order (default ${DEFAULT_FAULTS.join(",")}):
                     ${FAULTS.join(", ")}
  --heartbeat S      WORKER_HEARTBEAT_S of the workers (the SDK's default, 10 s)
  --task-ms A..B     the handler's random wait, in ms (250..750)
  --concurrency N    WORKER_CONCURRENCY of each of the two workers (20)
  --port P           the nodes' AMQP ports P, P+1, P+2 (5701); distribution ports P+25000..
  --runtime R        the workers' runtime, deno (from the sources) or node (from dist/): deno
  --keep             keep the nodes' directories (data, logs) and the workers' logs
It starts three RabbitMQ nodes of its own (c1@localhost, c2@localhost, c3@localhost) and stops them
at the end; the machine's broker is not touched.`

export const parseArgs = (argv: ReadonlyArray<string>): ClusterOptions | string => {
  const args = [...argv]
  let tasks = 5000
  let faults: ReadonlyArray<FaultName> = DEFAULT_FAULTS
  let heartbeat: number | undefined
  let taskMs: readonly [number, number] = [250, 750]
  let concurrency = 20
  let keep = false
  let firstPort = 5701
  let runtime: Runtime = "deno"
  const whole = (flag: string, value: string | undefined) => {
    const n = Number(value)
    if (!Number.isInteger(n) || n < 1) throw new Error(`${flag} needs a positive whole number`)
    return n
  }
  try {
    while (args.length > 0) {
      const flag = args.shift()!
      if (flag === "--tasks") tasks = whole(flag, args.shift())
      else if (flag === "--heartbeat") heartbeat = whole(flag, args.shift())
      else if (flag === "--concurrency") concurrency = whole(flag, args.shift())
      else if (flag === "--port") firstPort = whole(flag, args.shift())
      else if (flag === "--keep") keep = true
      else if (flag === "--runtime") {
        const value = args.shift()
        if (value !== "deno" && value !== "node") throw new Error("--runtime is deno or node")
        runtime = value
      } else if (flag === "--help" || flag === "-h") return USAGE
      else if (flag === "--task-ms") {
        const m = /^(\d+)(?:\.\.|-)(\d+)$/.exec(args.shift() ?? "")
        if (m === null) throw new Error("--task-ms is A..B, in ms")
        taskMs = [Number(m[1]), Math.max(Number(m[1]), Number(m[2]))]
      } else if (flag === "--faults") {
        const list = (args.shift() ?? "").split(",").filter((f) => f !== "")
        const unknown = list.filter((f) => !(FAULTS as ReadonlyArray<string>).includes(f))
        if (list.length === 0 || unknown.length > 0) {
          throw new Error(`--faults takes some of ${FAULTS.join(", ")}; not ${unknown.join(", ")}`)
        }
        faults = list as Array<FaultName>
      } else throw new Error(`unknown option ${flag}`)
    }
  } catch (e) {
    throw new Error(`${(e as Error).message}\n${USAGE}`)
  }
  return { tasks, faults, heartbeat, taskMs, concurrency, keep, firstPort, runtime }
}

// ---------------------------------------------------------------------------------------------
// The platform's side: tasks published between faults, the output queue read throughout

/** A terminal message as the platform read it. */
interface Terminal {
  readonly taskId: string
  readonly messageId: string
  readonly type: "success" | "failure"
  /** The run's nonce (success), else the message's text. */
  readonly run: string
  readonly text: string
  readonly redelivered: boolean
  readonly receivedAt: number
  readonly pid: number | undefined
  readonly began: number | undefined
  readonly attempt: number | undefined
}

const parseTerminal = (m: amqp.ConsumeMessage): Terminal | undefined => {
  const type = m.properties.type
  if (type !== "success" && type !== "failure") return undefined
  const text = m.content.toString("utf8")
  const parsed = JSON.parse(text) as {
    task_id: string
    data: { response?: { run: string; pid: number; began: number; attempt: number } }
  }
  const response = parsed.data.response
  return {
    taskId: parsed.task_id,
    messageId: String(m.properties.messageId),
    type,
    run: response?.run ?? text,
    text,
    redelivered: m.fields.redelivered,
    receivedAt: Date.now(),
    pid: response?.pid,
    began: response?.began,
    attempt: response?.attempt,
  }
}

/**
 * The output queue, read throughout from one node, then the next when it goes: `moveOff` leaves
 * a node about to be faulted first, so that the platform's own reconnections (which read again
 * what it had not acked) stay out of the faults' figures.
 */
const outputReader = (
  cluster: Cluster,
  urlOf: (node: ClusterNode) => string,
  onTerminal: (t: Terminal) => void,
) => {
  let stopped = false
  let connection: amqp.ChannelModel | undefined
  let current: ClusterNode | undefined
  let avoid: string | undefined
  let next = 0
  let reconnections = -1
  const pick = () => {
    for (let k = 0; k < cluster.nodes.length; k++) {
      const node = cluster.nodes[(next + k) % cluster.nodes.length]!
      if (node.name !== avoid && cluster.isRunning(node)) {
        next = (next + k + 1) % cluster.nodes.length
        return node
      }
    }
    return cluster.nodes[next++ % cluster.nodes.length]!
  }
  const onMessage = (m: amqp.ConsumeMessage) => {
    const t = parseTerminal(m)
    if (t !== undefined) onTerminal(t)
  }
  const opened = (c: amqp.ChannelModel) => {
    connection = c
    reconnections++
  }
  const session = () => {
    current = pick()
    return readUntilClosed(urlOf(current), OUT_QUEUE, onMessage, opened)
  }
  const loop = (async () => {
    while (!stopped) {
      await session().catch(() => undefined)
      current = undefined
      if (!stopped) await sleep(200)
    }
  })()
  return {
    reconnections: () => Math.max(0, reconnections),
    moveOff: async (node: ClusterNode | undefined) => {
      avoid = node?.name
      if (node !== undefined && current?.name === node.name) {
        await connection?.close().catch(() => undefined)
        const deadline = Date.now() + 10_000
        while (current?.name === node.name && Date.now() < deadline) await sleep(50)
      }
    },
    stop: async () => {
      stopped = true
      await connection?.close().catch(() => undefined)
      await loop
    },
  }
}

// ---------------------------------------------------------------------------------------------
// The workers: each through its own proxies, its /ready polled

interface ClusterWorker {
  readonly label: string
  readonly process: WorkerProcess
  /** Its proxy to each node, in the nodes' order. */
  readonly proxies: ReadonlyArray<FaultProxy>
  /** Each change of its `/ready` status (200, 503, `no answer`), with when it was seen. */
  readonly readiness: Array<{ readonly at: number; readonly status: string }>
}

/** The node the worker is connected to now (its newest connection still open), if any. */
const nodeOfWorker = (cluster: Cluster, w: ClusterWorker): ClusterNode | undefined => {
  let best: { node: ClusterNode; at: number } | undefined
  w.proxies.forEach((p, i) => {
    const at = p.newestOpenedAt()
    if (at !== undefined && (best === undefined || at > best.at)) {
      best = { node: cluster.nodes[i]!, at }
    }
  })
  return best?.node
}

/** Polls the worker's `/ready` every 100 ms, keeping each change, until `stop`. */
const pollReadiness = (w: ClusterWorker) => {
  let stopped = false
  const loop = (async () => {
    while (!stopped) {
      const port = w.process.port()
      if (port !== undefined && w.process.running()) {
        const status = await fetch(`http://127.0.0.1:${port}/ready`, {
          signal: AbortSignal.timeout(1_000),
        }).then(async (r) => (await r.body?.cancel(), String(r.status)), () => "no answer")
        if (w.readiness.at(-1)?.status !== status) w.readiness.push({ at: Date.now(), status })
      }
      await sleep(100)
    }
  })()
  return async () => {
    stopped = true
    await loop
  }
}

// ---------------------------------------------------------------------------------------------
// The faults

/** One fault struck, and what it touched. */
interface Strike {
  readonly fault: FaultName
  /** The row's name: the fault's, or its step's. */
  readonly step: string
  /** The node or path it struck, for the table. */
  target: string
  /** When it struck (the signal sent, the path cut, the command issued). */
  at: number
  /** The workers on the node or path struck, and what each had in flight just before. */
  affected: Array<ClusterWorker>
  inFlight: Array<number | undefined>
  /** The tasks of its own backlog. */
  readonly ids: ReadonlyArray<string>
  notes: Array<string>
}

interface Context {
  readonly cluster: Cluster
  readonly workers: ReadonlyArray<ClusterWorker>
  readonly log: (line: string) => void
  /** The worker a fault aimed at one worker strikes: each in turn, once it is connected. */
  readonly pickWorker: () => Promise<ClusterWorker>
}

const label = (n: ClusterNode | undefined) => n?.label ?? "?"

/** The workers connected to `node` now. */
const workersOn = (ctx: Context, node: ClusterNode) =>
  ctx.workers.filter((w) => nodeOfWorker(ctx.cluster, w)?.name === node.name)

/** Waits until every node runs, each queue has a leader and its three members online, no partition. */
const awaitHealthy = async (ctx: Context, ms = 180_000) => {
  const deadline = Date.now() + ms
  let why = ""
  while (Date.now() < deadline) {
    try {
      const down = ctx.cluster.nodes.filter((n) => !ctx.cluster.isRunning(n))
      if (down.length > 0) why = `${down.map((n) => n.name)} not running`
      else {
        const states = [...(await queueStates(ctx.cluster, VHOST)).values()]
        const unwell = states.filter((q) => q.leader === undefined || q.online.length < 3)
        const partitions = await partitionsSeen(ctx.cluster, ctx.cluster.nodes[0]!)
        if (states.length < 2) why = "the queues are not there"
        else if (unwell.length > 0) why = `queues ${JSON.stringify(unwell)}`
        else if (partitions !== "") why = `partitions ${partitions}`
        else return
      }
    } catch (e) {
      why = (e as Error).message
    }
    await sleep(1_000)
  }
  throw new Error(`the cluster did not come back to health within ${ms / 1000} s: ${why}`)
}

/** The leader of `queue` now (undefined during an election). */
const leaderOf = async (ctx: Context, queue: string) =>
  (await queueStates(ctx.cluster, VHOST)).get(queue)?.leader

/**
 * Moves the leader of `queue` onto `target` (or off it, `away`): the leader's node is taken out of
 * the queue's members (`rabbitmq-queues delete_member`), which elects another, until it is where
 * it should be; then the members taken out are added back. 3.10 has no command to move a leader.
 */
const placeLeader = async (ctx: Context, queue: string, target: ClusterNode, away = false) => {
  const removed: Array<ClusterNode> = []
  const placed = (leader: string | undefined) =>
    leader !== undefined && (away ? leader !== target.name : leader === target.name)
  try {
    for (let tries = 0; tries < 4; tries++) {
      const leader = await leaderOf(ctx, queue)
      if (placed(leader)) return
      if (leader === undefined) {
        await sleep(500)
        continue
      }
      const node = ctx.cluster.nodeOf(leader)!
      await ctx.cluster.queues(node, "delete_member", "--vhost", VHOST, queue, leader)
      removed.push(node)
      const deadline = Date.now() + 20_000
      while (Date.now() < deadline) {
        const now = await leaderOf(ctx, queue)
        if (now !== undefined && now !== leader) break
        await sleep(300)
      }
    }
    throw new Error(`the leader of ${queue} could not be put ${away ? "off" : "on"} ${target.name}`)
  } finally {
    for (const node of removed) {
      await ctx.cluster.queues(
        ctx.cluster.nodes.find((n) => n !== node)!,
        "add_member",
        "--vhost",
        VHOST,
        queue,
        node.name,
      )
    }
  }
}

/** In flight in each worker, just before a fault (its gauge). */
const inFlightNow = (workers: ReadonlyArray<ClusterWorker>) =>
  Promise.all(workers.map((w) => inFlightOf(w.process)))

/** Kills `node` (SIGKILL) and starts it again: it rejoins from its data directory. */
const killAndRestart = async (ctx: Context, strike: Strike, node: ClusterNode) => {
  strike.at = Date.now()
  await ctx.cluster.kill(node)
  await ctx.cluster.restart(node)
}

/** Hangs `node` (SIGSTOP) for `seconds`, then lets it go on (SIGCONT). */
const hangFor = async (ctx: Context, strike: Strike, node: ClusterNode, seconds: number) => {
  strike.at = Date.now()
  ctx.cluster.pause(node)
  try {
    await sleep(seconds * 1000)
  } finally {
    ctx.cluster.resume(node)
  }
}

/**
 * What each fault does, on a backlog of its own: `aim` picks the node or path (and puts the
 * leaders where the fault needs them) before the tasks are published, `hit` strikes and waits
 * until it is over (a killed node started again, a path restored).
 */
interface FaultStep {
  readonly step: string
  readonly aim: (ctx: Context) => Promise<{ node?: ClusterNode; worker?: ClusterWorker }>
  readonly hit: (
    ctx: Context,
    strike: Strike,
    target: { node?: ClusterNode; worker?: ClusterWorker },
  ) => Promise<void>
}

/** A worker's node, with the leaders put on it (`input`) or both (`both`): the fault's target. */
const leadersOnWorkerNode = (which: "input" | "both") => async (ctx: Context) => {
  const worker = await ctx.pickWorker()
  const node = nodeOfWorker(ctx.cluster, worker)!
  await placeLeader(ctx, IN_QUEUE, node)
  await placeLeader(ctx, OUT_QUEUE, node, which === "input")
  return { node }
}

const STEPS: Record<FaultName, ReadonlyArray<FaultStep>> = {
  "kill-input-leader": [{
    step: "kill -9 input leader",
    aim: leadersOnWorkerNode("input"),
    hit: (ctx, strike, t) => killAndRestart(ctx, strike, t.node!),
  }],
  "kill-both-leader": [{
    step: "kill -9 both leaders",
    aim: leadersOnWorkerNode("both"),
    hit: (ctx, strike, t) => killAndRestart(ctx, strike, t.node!),
  }],
  "hang-both-leader": [{
    step: `both leaders hung ${HANG_S} s`,
    aim: leadersOnWorkerNode("both"),
    hit: (ctx, strike, t) => hangFor(ctx, strike, t.node!, HANG_S),
  }],
  "own-node-stopped": [{
    step: "own node stop_app",
    aim: async (ctx) => {
      const worker = await ctx.pickWorker()
      return { node: nodeOfWorker(ctx.cluster, worker)!, worker }
    },
    hit: async (ctx, strike, t) => {
      strike.at = Date.now()
      await ctx.cluster.ctl(t.node!, "stop_app")
      // The worker away on another node first: the node's return is not what brings it back.
      const deadline = Date.now() + 60_000
      while (Date.now() < deadline && nodeOfWorker(ctx.cluster, t.worker!)?.name === t.node!.name) {
        await sleep(100)
      }
      await sleep(5_000)
      await ctx.cluster.ctl(t.node!, "start_app")
    },
  }, {
    step: "then the other's node kill -9",
    aim: async (ctx) => {
      const worker = await ctx.pickWorker()
      return { node: nodeOfWorker(ctx.cluster, worker)!, worker }
    },
    hit: (ctx, strike, t) => killAndRestart(ctx, strike, t.node!),
  }],
  "proxy-drop": [{
    step: `path drops ${PARTITION_S} s`,
    aim: async (ctx) => ({ worker: await ctx.pickWorker() }),
    hit: (ctx, strike, t) => cutPath(ctx, strike, t.worker!, "drop"),
  }],
  "proxy-stall": [{
    step: `path stalls ${PARTITION_S} s`,
    aim: async (ctx) => ({ worker: await ctx.pickWorker() }),
    hit: (ctx, strike, t) => cutPath(ctx, strike, t.worker!, "stall"),
  }],
  "own-node-hung": [{
    step: `own node hung ${LONG_HANG_S} s`,
    aim: async (ctx) => {
      const worker = await ctx.pickWorker()
      return { node: nodeOfWorker(ctx.cluster, worker)!, worker }
    },
    hit: async (ctx, strike, t) => {
      await hangFor(ctx, strike, t.node!, LONG_HANG_S)
      await healPartition(ctx, t.node!)
    },
  }],
}

/**
 * After a hang past net_ticktime the others have dropped the node: a partition, which
 * pause_minority does not clear (the node waits, paused, "awaiting recovery"). Its application is
 * restarted, as an operator would, and killed and started again if that does not do.
 */
const healPartition = async (ctx: Context, node: ClusterNode) => {
  const witness = ctx.cluster.nodes.find((n) => n !== node)!
  const deadline = Date.now() + 20_000
  while (Date.now() < deadline) {
    if ((await partitionsSeen(ctx.cluster, witness).catch(() => "?")) === "") return
    await sleep(1_000)
  }
  ctx.log(`a partition after the hang of ${node.name}: restarting its application`)
  try {
    await ctx.cluster.ctl(node, "stop_app")
    await ctx.cluster.ctl(node, "start_app")
  } catch (e) {
    ctx.log(`${(e as Error).message.slice(0, 200)}: killing ${node.name} and starting it again`)
    await ctx.cluster.kill(node)
    await ctx.cluster.restart(node)
  }
}

/** Drops or stalls the path of `worker` to its node for PARTITION_S, then restores it. */
const cutPath = async (
  ctx: Context,
  strike: Strike,
  worker: ClusterWorker,
  how: "drop" | "stall",
) => {
  const node = nodeOfWorker(ctx.cluster, worker)
  const proxy = worker.proxies[ctx.cluster.nodes.findIndex((n) => n.name === node?.name)]
  if (proxy === undefined) throw new Error(`${worker.label} has no connection to cut`)
  strike.target = `${worker.label}→${label(node)}`
  strike.at = Date.now()
  if (how === "drop") proxy.drop()
  else proxy.stall()
  try {
    await sleep(PARTITION_S * 1000)
  } finally {
    proxy.pass()
  }
}

// ---------------------------------------------------------------------------------------------
// The run

export interface StrikeRow {
  readonly step: string
  readonly target: string
  readonly affected: ReadonlyArray<string>
  readonly inFlight: number
  readonly tasks: number
  readonly lost: number
  readonly runTwice: number
  /** Tasks concluded at a later attempt (their delivery was requeued: a run given up, or lost). */
  readonly redelivered: number
  readonly extraCopies: number
  /** Fault → the first task delivered after it and settled: by any worker, by one it touched. */
  readonly firstSettledS: number | undefined
  readonly firstSettledAffectedS: number | undefined
  /** The longest time, from the fault to its backlog's end, without a task of it concluded. */
  readonly longestGapS: number | undefined
  /** Fault → the touched worker's log says its connection was lost. */
  readonly givenUpS: number | undefined
  /**
   * Fault → the first task a touched worker took after it gave its connection up, settled by it:
   * consuming again, on a fresh connection (undefined: no touched worker gave one up).
   */
  readonly backS: number | undefined
  /**
   * How long a touched worker's `/ready` said 200 after the fault while its connection was dead:
   * to its first `/ready` not 200, or to its give-up if it was on a fresh connection before a poll
   * (every 100 ms) saw it (undefined: neither).
   */
  readonly readyLagS: number | undefined
  readonly notes: ReadonlyArray<string>
}

export interface ClusterReport {
  readonly rows: ReadonlyArray<StrikeRow>
  readonly tasks: number
  readonly lost: number
  readonly lostIds: ReadonlyArray<string>
  readonly runTwice: number
  readonly extraCopies: number
  readonly extraDetails: ReadonlyArray<string>
  readonly rereadByPlatform: number
  readonly workerWarnings: Readonly<Record<string, number>>
  /** Each worker's `/ready` changes, ms from the start: for report.json. */
  readonly readiness: Readonly<Record<string, ReadonlyArray<string>>>
  readonly notes: ReadonlyArray<string>
  readonly logDir: string
  readonly wallS: number
}

/** The tasks of each strike: the total shared out, in order. */
const shareTasks = (total: number, strikes: number, prefix: string) =>
  Array.from({ length: strikes }, (_, s) => {
    const from = Math.floor((total * s) / strikes)
    const to = Math.floor((total * (s + 1)) / strikes)
    return Array.from({ length: to - from }, (_, i) => `${prefix}-${s + 1}-${from + i}`)
  })

/** The workers' JSON log lines, parsed, with their time. */
const logLines = (w: ClusterWorker) => {
  let text = ""
  try {
    text = readFileSync(w.process.record.logFile, "utf8")
  } catch {
    return []
  }
  return text.split("\n").flatMap((line) => {
    try {
      const r = JSON.parse(line) as Record<string, unknown>
      return [{ at: Date.parse(String(r.ts)), level: String(r.level), msg: String(r.msg) }]
    } catch {
      return []
    }
  })
}

export const runCluster = async (
  options: ClusterOptions,
  log: (line: string) => void,
  onCluster: (cluster: Cluster, base: string) => void,
): Promise<ClusterReport> => {
  const t0 = Date.now()
  const base = mkdtempSync(join(tmpdir(), "async-task-cluster-"))
  const logDir = join(base, "workers")
  mkdirSync(logDir, { recursive: true })
  const cluster = makeCluster({ baseDir: join(base, "nodes"), firstPort: options.firstPort, log })
  onCluster(cluster, base)
  const notes: Array<string> = []
  const urlOf = (node: ClusterNode, port = node.amqpPort) =>
    `amqp://guest:guest@127.0.0.1:${port}/${encodeURIComponent(VHOST)}`

  await cluster.start()
  await cluster.ctl(cluster.nodes[0]!, "add_vhost", VHOST, "--default-queue-type", "quorum")
  await cluster.ctl(cluster.nodes[0]!, "set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*")
  {
    // The queues as the worker declares them (durable, no arguments: quorum on this vhost).
    const connection = await amqp.connect(urlOf(cluster.nodes[0]!))
    const channel = await connection.createChannel()
    await channel.assertQueue(IN_QUEUE, { durable: true })
    await channel.assertQueue(OUT_QUEUE, { durable: true })
    await connection.close()
  }
  const states = await queueStates(cluster, VHOST)
  log(
    `queues: ${
      [...states.values()].map((q) => `${q.name} leader ${q.leader} members ${q.members.join(" ")}`)
        .join("; ")
    }`,
  )

  // The platform's consumer of the output queue, throughout.
  const terminals: Array<Terminal> = []
  const concluded = new Set<string>()
  const reader = outputReader(cluster, (n) => urlOf(n), (t) => {
    terminals.push(t)
    concluded.add(t.taskId)
  })

  // Two workers, each through a proxy of its own to each node.
  const workers: Array<ClusterWorker> = []
  const stopPolls: Array<() => Promise<void>> = []
  for (const k of [1, 2]) {
    const proxies = await Promise.all(cluster.nodes.map((n) => startProxy(n.amqpPort)))
    const env: Record<string, string> = {
      BROKER_URL: proxies.map((p) => urlOf(cluster.nodes[0]!, p.port)).join(","),
      IN_QUEUE_NAME: IN_QUEUE,
      OUT_QUEUE_NAME: OUT_QUEUE,
      WORKER_CONCURRENCY: String(options.concurrency),
      WORKER_SHUTDOWN_GRACE_S: "5",
      LOG_LEVEL: "info",
      CHAOS_TASK_MIN_MS: String(options.taskMs[0]),
      CHAOS_TASK_MAX_MS: String(options.taskMs[1]),
      ...(options.heartbeat === undefined ? {} : { WORKER_HEARTBEAT_S: String(options.heartbeat) }),
    }
    const w: ClusterWorker = {
      label: `w${k}`,
      process: spawnWorker(`w${k}`, options.runtime, env, logDir),
      proxies,
      readiness: [],
    }
    workers.push(w)
  }
  const strikes: Array<Strike> = []
  try {
    await Promise.all(workers.map((w) => w.process.started))
    for (const w of workers) stopPolls.push(pollReadiness(w))
    log(
      `workers consuming: ${
        workers.map((w) => `${w.label} on ${label(nodeOfWorker(cluster, w))}`).join(", ")
      }`,
    )

    let turn = 0
    const ctx: Context = {
      cluster,
      workers,
      log,
      pickWorker: async () => {
        const deadline = Date.now() + 30_000
        for (;;) {
          const w = workers[turn % workers.length]!
          if (nodeOfWorker(cluster, w) !== undefined || Date.now() > deadline) {
            turn++
            return w
          }
          await sleep(100)
        }
      },
    }
    const plan = options.faults.flatMap((fault) => STEPS[fault].map((step) => ({ fault, step })))
    const shares = shareTasks(options.tasks, plan.length, `t${Date.now().toString(36)}`)
    for (const [index, { fault, step }] of plan.entries()) {
      await awaitHealthy(ctx)
      const target = await step.aim(ctx)
      // The members a leader's move took out are back before the tasks go in.
      await awaitHealthy(ctx)
      const ids = shares[index]!
      const strike: Strike = {
        fault,
        step: step.step,
        target: label(target.node),
        at: 0,
        affected: [],
        inFlight: [],
        ids,
        notes: [],
      }
      strikes.push(strike)
      await reader.moveOff(target.node)
      await publishBatch(cluster, urlOf, target.node, ids)
      // The fault strikes with the work in full flow: a tenth done, the target's slots busy.
      const deadline = Date.now() + 60_000
      const doneCount = () => ids.reduce((s, id) => s + (concluded.has(id) ? 1 : 0), 0)
      while (Date.now() < deadline && doneCount() < ids.length / 10) await sleep(20)
      // Those on the node struck, or the one whose path is cut.
      strike.affected = target.node === undefined ? [target.worker!] : workersOn(ctx, target.node)
      strike.inFlight = await inFlightNow(strike.affected)
      if (strike.affected.length === 0) strike.notes.push(`no worker on ${label(target.node)}`)
      const struck = target.node ?? nodeOfWorker(cluster, target.worker!)
      log(
        `fault ${index + 1}/${plan.length} ${step.step} on ${label(struck)}` +
          `${
            target.worker === undefined ? "" : ` (${target.worker.label})`
          } at ${doneCount()}/${ids.length}; ` +
          `touched ${strike.affected.map((w) => w.label).join("+") || "none"} in flight ${
            strike.inFlight.map((v) => v ?? "?").join("+")
          }`,
      )
      await step.hit(ctx, strike, target)
      log(`fault ${index + 1} over after ${((Date.now() - strike.at) / 1000).toFixed(1)} s`)
      await reader.moveOff(undefined)
      // Its backlog done, or given up after a minute without a task concluded.
      let last = doneCount()
      let lastAt = Date.now()
      while (doneCount() < ids.length && Date.now() - lastAt < 60_000) {
        await sleep(100)
        if (doneCount() !== last) (last = doneCount()), (lastAt = Date.now())
      }
      if (doneCount() < ids.length) {
        strike.notes.push(`${ids.length - doneCount()} tasks not concluded a minute after the last`)
      }
      log(`fault ${index + 1}: ${doneCount()}/${ids.length} concluded`)
    }
  } finally {
    await Promise.all(stopPolls.map((stop) => stop()))
    await stopWorkers(workers)
  }
  // What is still on its way to the platform, then the reader's end.
  await quiet(() => terminals.length, 2_000, 20_000)
  await reader.stop()
  for (const w of workers) for (const p of w.proxies) await p.close()
  return account(options, strikes, workers, terminals, reader.reconnections(), notes, logDir, t0)
}

/** Publishes `ids` on a node other than the one about to be faulted, with confirms. */
const publishBatch = async (
  cluster: Cluster,
  urlOf: (node: ClusterNode) => string,
  avoid: ClusterNode | undefined,
  ids: ReadonlyArray<string>,
) => {
  const node = cluster.nodes.find((n) => n.name !== avoid?.name && cluster.isRunning(n))!
  await publishTasks(urlOf(node), IN_QUEUE, ids.map((id) => envelope(id, { id })))
}

/** SIGTERM to each worker, SIGKILL past the shutdown bound. */
const stopWorkers = async (workers: ReadonlyArray<ClusterWorker>) => {
  await Promise.all(
    workers.filter((w) => w.process.running()).map(async (w) => {
      process.kill(w.process.record.pid!, "SIGTERM")
      const timer = setTimeout(() => {
        if (w.process.running()) process.kill(w.process.record.pid!, "SIGKILL")
      }, 45_000)
      await w.process.exited
      clearTimeout(timer)
    }),
  )
}

/** Resolves once `count` has not changed for `stillMs`, or after `maxMs`. */
const quiet = async (count: () => number, stillMs: number, maxMs: number) => {
  const start = Date.now()
  let last = count()
  let since = Date.now()
  while (Date.now() - since < stillMs && Date.now() - start < maxMs) {
    await sleep(100)
    if (count() !== last) (last = count()), (since = Date.now())
  }
}

// ---------------------------------------------------------------------------------------------
// The accounting

/**
 * Per task: its terminal messages by `message_id`. A copy read again by the platform after its
 * own reconnection (the same bytes, redelivered) is not the worker's; any other second message
 * with one id is an extra terminal copy. Different ids (deliveries), or one id with two runs'
 * nonces, are runs of the task.
 */
const tallyTask = (list: ReadonlyArray<Terminal>) => {
  const byId = new Map<string, Array<Terminal>>()
  let rereads = 0
  for (const t of list) {
    const same = byId.get(t.messageId) ?? []
    if (same.some((s) => s.text === t.text) && t.redelivered) {
      rereads++
      continue
    }
    same.push(t)
    byId.set(t.messageId, same)
  }
  const extra = [...byId.values()].reduce((s, l) => s + l.length - 1, 0)
  const runs = new Set(list.map((t) => `${t.messageId} ${t.run}`)).size
  // `<task_id>:<attempt>:<delivery_id>:<type>`: the attempt is the id's third field from the end.
  const later = list.some((t) => Number(t.messageId.split(":").at(-3)) > 1)
  return { byId, rereads, extra, runTwice: runs > 1, later }
}

const account = (
  options: ClusterOptions,
  strikes: ReadonlyArray<Strike>,
  workers: ReadonlyArray<ClusterWorker>,
  terminals: ReadonlyArray<Terminal>,
  readerReconnections: number,
  notes: Array<string>,
  logDir: string,
  t0: number,
): ClusterReport => {
  const byTask = new Map<string, Array<Terminal>>()
  for (const t of terminals) byTask.set(t.taskId, [...(byTask.get(t.taskId) ?? []), t])
  const labelOfPid = new Map(workers.map((w) => [w.process.record.pid, w.label]))
  const logs = new Map(workers.map((w) => [w.label, logLines(w)]))
  const extraDetails: Array<string> = []
  let rereadByPlatform = 0
  const lostIds: Array<string> = []
  const rows = strikes.map((s, i): StrikeRow => {
    const end = strikes[i + 1]?.at ?? Date.now()
    let lost = 0, runTwice = 0, redelivered = 0, extraCopies = 0
    for (const id of s.ids) {
      const list = byTask.get(id) ?? []
      if (list.length === 0) {
        lost++
        lostIds.push(id)
        continue
      }
      const tally = tallyTask(list)
      rereadByPlatform += tally.rereads
      if (tally.runTwice) runTwice++
      if (tally.later) redelivered++
      extraCopies += tally.extra
      if (tally.extra > 0) {
        for (const [mid, copies] of tally.byId) {
          if (copies.length > 1) {
            extraDetails.push(
              `${mid}: ${
                copies.map((c) => `run ${c.run.slice(0, 8)} by ${labelOfPid.get(c.pid) ?? c.pid}`)
                  .join(", ")
              }`,
            )
          }
        }
      }
    }
    const touched = new Set(s.affected.map((w) => w.label))
    const deliveredAfter = terminals.filter((t) => t.began !== undefined && t.began >= s.at)
    const firstOf = (list: ReadonlyArray<Terminal>) =>
      list.reduce<number | undefined>((m, t) => Math.min(m ?? Infinity, t.receivedAt), undefined)
    const affectedAfter = deliveredAfter.filter((t) => touched.has(labelOfPid.get(t.pid) ?? ""))
    const givenUpBy = new Map(s.affected.map((w) => [
      w.label,
      logs.get(w.label)!.find((l) =>
        l.at >= s.at && l.at < end && /connection to .* was lost/.test(l.msg)
      )?.at,
    ]))
    const givenUp = [...givenUpBy.values()].filter((v): v is number => v !== undefined)
    const back = affectedAfter.filter((t) => {
      const at = givenUpBy.get(labelOfPid.get(t.pid) ?? "")
      return at !== undefined && t.began! >= at
    })
    const notReady = s.affected.map((w) =>
      w.readiness.find((r) => r.at >= s.at && r.at < end && r.status !== "200")?.at
    )
      .filter((v): v is number => v !== undefined)
    const deadSaid = [...notReady, ...givenUp]
    const notes = [...s.notes]
    const times = s.ids.flatMap((id) => (byTask.get(id) ?? []).map((t) => t.receivedAt))
      .filter((at) => at >= s.at).sort((a, b) => a - b)
    const longestGap = times.reduce(
      (acc, at) => ({ max: Math.max(acc.max, at - acc.last), last: at }),
      { max: 0, last: s.at },
    ).max
    // A worker touched that settled nothing delivered after the fault, while its backlog lasted.
    for (const w of s.affected) {
      if (!affectedAfter.some((t) => labelOfPid.get(t.pid) === w.label)) {
        notes.push(`${w.label} settled no task delivered after the fault`)
      }
    }
    return {
      step: s.step,
      target: s.target,
      affected: [...touched],
      inFlight: s.inFlight.reduce<number>((sum, v) => sum + (v ?? options.concurrency), 0),
      tasks: s.ids.length,
      lost,
      runTwice,
      redelivered,
      extraCopies,
      firstSettledS: secondsSince(s.at, firstOf(deliveredAfter)),
      firstSettledAffectedS: secondsSince(s.at, firstOf(affectedAfter)),
      longestGapS: times.length === 0 ? undefined : longestGap / 1000,
      givenUpS: givenUp.length === 0 ? undefined : secondsSince(s.at, Math.min(...givenUp)),
      backS: secondsSince(s.at, firstOf(back)),
      readyLagS: deadSaid.length === 0 ? undefined : secondsSince(s.at, Math.min(...deadSaid)),
      notes,
    }
  })
  const workerWarnings: Record<string, number> = {}
  for (const lines of logs.values()) {
    for (const l of lines) {
      if (
        l.level === "WARN" || l.level === "WARNING" || l.level === "ERROR" || l.level === "FATAL"
      ) {
        const key = `${l.level}: ${l.msg.replace(/\d+/g, "N").slice(0, 140)}`
        workerWarnings[key] = (workerWarnings[key] ?? 0) + 1
      }
    }
  }
  if (readerReconnections > 0) {
    notes.push(`the platform's consumer reconnected ${readerReconnections} time(s)`)
  }
  const sum = (f: (r: StrikeRow) => number) => rows.reduce((s, r) => s + f(r), 0)
  return {
    rows,
    tasks: options.tasks,
    lost: sum((r) => r.lost),
    lostIds,
    runTwice: sum((r) => r.runTwice),
    extraCopies: sum((r) => r.extraCopies),
    extraDetails,
    rereadByPlatform,
    workerWarnings,
    readiness: Object.fromEntries(
      workers.map((w) => [w.label, w.readiness.map((r) => `${r.at - t0} ${r.status}`)]),
    ),
    notes,
    logDir,
    wallS: (Date.now() - t0) / 1000,
  }
}

// ---------------------------------------------------------------------------------------------
// The report

const s1 = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(1))

export const formatReport = (r: ClusterReport, options: ClusterOptions): string => {
  const header = [
    "#",
    "fault",
    "target",
    "touched",
    "in flight",
    "lost",
    "run twice",
    "redelivered",
    "extra copies",
    "→ settled (s)",
    "→ touched settled",
    "longest gap (s)",
    "given up (s)",
    "back (s)",
    "/ready lag (s)",
  ]
  const cells = r.rows.map((row, i) => [
    String(i + 1),
    row.step,
    row.target,
    row.affected.join("+") || "none",
    String(row.inFlight),
    String(row.lost),
    String(row.runTwice),
    String(row.redelivered),
    String(row.extraCopies),
    s1(row.firstSettledS),
    s1(row.firstSettledAffectedS),
    s1(row.longestGapS),
    s1(row.givenUpS),
    s1(row.backS),
    row.affected.length === 0 ? "-" : row.readyLagS === undefined ? "never" : s1(row.readyLagS),
  ])
  cells.push([
    "",
    "total",
    "",
    "",
    String(r.rows.reduce((s, x) => s + x.inFlight, 0)),
    String(r.lost),
    String(r.runTwice),
    String(r.rows.reduce((s, x) => s + x.redelivered, 0)),
    String(r.extraCopies),
    ...Array<string>(6).fill(""),
  ])
  const widths = header.map((h, c) => Math.max(h.length, ...cells.map((row) => row[c]!.length)))
  const line = (row: ReadonlyArray<string>) =>
    row.map((cell, c) => (c === 1 || c === 2 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!)))
      .join("  ")
  const lines = [
    `cluster chaos: ${r.tasks} tasks of ${options.taskMs[0]}..${
      options.taskMs[1]
    } ms, 2 workers at ` +
    `concurrency ${options.concurrency}, heartbeat ${options.heartbeat ?? "10 (default)"} s, ` +
    `3 nodes, quorum queues on all three`,
    "",
    line(header),
    ...cells.map(line),
    "",
    "in flight: the touched workers' worker_tasks_in_flight just before the fault; run twice: tasks " +
    "with terminal messages of two runs; redelivered: tasks concluded at a later attempt (a run " +
    "given up, its delivery requeued); extra copies: one message_id read twice (not a re-read " +
    "by the platform); → settled: fault → the first task delivered after it and settled (any " +
    "worker / a touched one); longest gap: the longest time without a task of its backlog " +
    "concluded, from the fault to the backlog's end (the cluster stalled); given up: → the " +
    "touched worker's 'connection ... was lost'; back: → the first task it took after that, " +
    "settled; /ready lag: how long its /ready said 200 with the connection dead, → its first " +
    "/ready not 200 or its give-up, whichever first (polled every 100 ms: a reconnection can be " +
    "quicker); 'never': /ready stayed 200 and no connection was given up",
  ]
  for (const [i, row] of r.rows.entries()) {
    for (const note of row.notes) lines.push(`note ${i + 1}: ${note}`)
  }
  for (const d of r.extraDetails.slice(0, 10)) lines.push(`extra copy  ${d}`)
  if (r.lost > 0) lines.push(`LOST ${r.lostIds.slice(0, 20).join(" ")}`)
  if (r.rereadByPlatform > 0) {
    lines.push(`platform re-read ${r.rereadByPlatform} messages after its own reconnections`)
  }
  const warnings = Object.entries(r.workerWarnings).sort((a, b) => b[1] - a[1]).slice(0, 12)
  for (const [k, v] of warnings) lines.push(`worker log  ${v} × ${k}`)
  for (const note of r.notes) lines.push(`note        ${note}`)
  lines.push(
    `wall time   ${r.wallS.toFixed(0)} s; workers' logs ${r.logDir}` +
      (options.keep ? "" : " (removed at the end: --keep keeps them)"),
  )
  return lines.join("\n")
}

// ---------------------------------------------------------------------------------------------
// The command

export const main = async (argv: ReadonlyArray<string>): Promise<number> => {
  let options: ClusterOptions
  try {
    const parsed = parseArgs(argv)
    if (typeof parsed === "string") {
      console.log(parsed)
      return 0
    }
    options = parsed
  } catch (e) {
    console.error((e as Error).message)
    return 2
  }
  const started = Date.now()
  const log = (line: string) =>
    console.log(`[${((Date.now() - started) / 1000).toFixed(1)} s] ${line}`)
  let cluster: Cluster | undefined
  let base: string | undefined
  // Whatever happens, the suite's nodes and workers end with it: SIGINT, SIGTERM, an error.
  const interrupted = () => {
    console.error("interrupted: killing the workers and the suite's nodes")
    killAllWorkers()
    cluster?.killAll()
    if (!options.keep && base !== undefined) rmSync(base, { recursive: true, force: true })
    process.exit(130)
  }
  process.on("SIGINT", interrupted)
  process.on("SIGTERM", interrupted)
  process.on("exit", () => {
    killAllWorkers()
    cluster?.killAll()
  })
  try {
    const report = await runCluster(options, log, (c, b) => ((cluster = c), (base = b)))
    writeFileSync(join(report.logDir, "report.json"), JSON.stringify(report, null, 2))
    console.log("")
    console.log(formatReport(report, options))
    const wrong = [
      ...(report.lost > 0 ? [`${report.lost} tasks lost`] : []),
      ...(report.extraCopies > 0 ? [`${report.extraCopies} extra terminal copies`] : []),
    ]
    console.log(wrong.length === 0 ? "RESULT: PASS" : `RESULT: FAIL: ${wrong.join("; ")}`)
    return wrong.length === 0 ? 0 : 1
  } catch (e) {
    console.error(e)
    return 1
  } finally {
    killAllWorkers()
    log("stopping the suite's nodes")
    await cluster?.stopAll()
    if (base === undefined) {
      // Nothing was made.
    } else if (options.keep) log(`kept ${base} (the nodes' data and logs, the workers' logs)`)
    else rmSync(base, { recursive: true, force: true })
  }
}

if ((import.meta as { main?: boolean }).main) {
  main(process.argv.slice(2)).then((code) => process.exit(code))
}
