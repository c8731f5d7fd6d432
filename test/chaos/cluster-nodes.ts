/**
 * Three RabbitMQ nodes of the cluster fault suite's own (`c1@localhost`…), or as many as a test
 * asks with a config of its own (a single node whose consumer timeout is seconds), beside the
 * machine's broker and never touching it: each with its own ports, data and log directories,
 * config and env files, an empty plugins file, and a cookie of the suite's own (HOME is a
 * directory of the suite's, holding `.erlang.cookie`). `/usr/lib/rabbitmq/bin/rabbitmq-server`
 * is started directly: Debian's wrapper in /usr/sbin switches to the `rabbitmq` user, and so to
 * the main node's cookie.
 * Every signal the suite sends goes to a pid it started and checked to be one of its nodes.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import process from "node:process"
import { sleep } from "../support/waits.ts"

const BIN = "/usr/lib/rabbitmq/bin"

/** One node: its name, its AMQP port (127.0.0.1 only), its directory. */
export interface ClusterNode {
  /** `c1`, `c2`, `c3` (the prefix and the node's number). */
  readonly label: string
  /** The Erlang node name, `c1@localhost`. */
  readonly name: string
  readonly amqpPort: number
  readonly distPort: number
  readonly dir: string
}

export interface ClusterOptions {
  /** Where the nodes' directories go; removed by `remove()`. */
  readonly baseDir: string
  /** The first AMQP port: the nodes take it and the next ones (default 5701). */
  readonly firstPort?: number
  /** How many nodes (default 3); `start()` joins the others to the first. */
  readonly count?: number
  /** The nodes' names' prefix (default `c`: `c1@localhost`…). */
  readonly prefix?: string
  /** Lines added to each node's rabbitmq.conf. */
  readonly config?: ReadonlyArray<string>
  /** Each node's advanced.config (Erlang terms), for settings rabbitmq.conf has no key for. */
  readonly advanced?: string
  readonly log?: (line: string) => void
}

interface Running {
  /** The `rabbitmq-server` script the suite spawned (its process group leads the node's). */
  readonly script: ChildProcess
  /** The node's Erlang VM, once known (its pid file). */
  beam: number | undefined
  readonly exited: Promise<void>
}

/** The config of a node: pause_minority, as production's clusters, and `extra`. */
const configText = (extra: ReadonlyArray<string>) =>
  [
    "cluster_partition_handling = pause_minority",
    "log.file.level = info",
    "log.console = false",
    ...extra,
    "",
  ].join("\n")

/**
 * The environment of a node and of the CLI talking to it: nothing of the machine's RabbitMQ
 * setup (/etc/rabbitmq/rabbitmq-env.conf names the main node) and loopback only.
 */
const nodeEnv = (node: ClusterNode, home: string): Record<string, string> => ({
  PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin",
  LANG: "C.UTF-8",
  LC_ALL: "C.UTF-8",
  HOME: home,
  ERL_EPMD_ADDRESS: "127.0.0.1",
  RABBITMQ_NODENAME: node.name,
  RABBITMQ_NODE_IP_ADDRESS: "127.0.0.1",
  RABBITMQ_NODE_PORT: String(node.amqpPort),
  RABBITMQ_DIST_PORT: String(node.distPort),
  RABBITMQ_MNESIA_BASE: join(node.dir, "mnesia"),
  RABBITMQ_LOG_BASE: join(node.dir, "log"),
  RABBITMQ_CONFIG_FILE: join(node.dir, "rabbitmq.conf"),
  RABBITMQ_ADVANCED_CONFIG_FILE: join(node.dir, "advanced.config"),
  RABBITMQ_ENABLED_PLUGINS_FILE: join(node.dir, "enabled_plugins"),
  RABBITMQ_CONF_ENV_FILE: join(node.dir, "rabbitmq-env.conf"),
  RABBITMQ_PID_FILE: join(node.dir, "pid"),
  RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS: "-kernel inet_dist_use_interface {127,0,0,1}",
  // The CLI's own distribution ports, away from those the main node's CLI takes (35672..).
  RABBITMQ_CTL_DIST_PORT_MIN: String(node.distPort + 20_000),
  RABBITMQ_CTL_DIST_PORT_MAX: String(node.distPort + 20_030),
})

/**
 * Whether `pid` is the Erlang VM of `node`, checked before each signal: a beam whose environment
 * names the node and its directory (3.10 names its node from the environment, not the command line).
 */
const isBeamOf = (pid: number, node: ClusterNode): boolean => {
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8")
    const environ = readFileSync(`/proc/${pid}/environ`, "utf8").split("\0")
    return cmdline.includes("beam") &&
      environ.includes(`RABBITMQ_NODENAME=${node.name}`) &&
      environ.includes(`RABBITMQ_MNESIA_BASE=${join(node.dir, "mnesia")}`)
  } catch {
    return false
  }
}

export type Cluster = ReturnType<typeof makeCluster>

/** The nodes (three unless `count` says), not started: `start()` starts and joins them. */
export const makeCluster = (options: ClusterOptions) => {
  const log = options.log ?? (() => {})
  const first = options.firstPort ?? 5701
  const prefix = options.prefix ?? "c"
  const home = join(options.baseDir, "home")
  const nodes: Array<ClusterNode> = Array.from({ length: options.count ?? 3 }, (_, i) => i + 1)
    .map((n) => ({
      label: `${prefix}${n}`,
      name: `${prefix}${n}@localhost`,
      amqpPort: first + n - 1,
      distPort: 25_000 + first + n - 1,
      dir: join(options.baseDir, `${prefix}${n}`),
    }))
  const running = new Map<string, Running>()
  /** Nodes the suite stopped with SIGSTOP, to be sent SIGCONT whatever happens. */
  const paused = new Set<string>()

  const writeConfig = (node: ClusterNode, config: ReadonlyArray<string>) =>
    writeFileSync(join(node.dir, "rabbitmq.conf"), configText(config))

  const prepare = () => {
    mkdirSync(home, { recursive: true })
    const cookie = join(home, ".erlang.cookie")
    writeFileSync(cookie, randomBytes(20).toString("hex").toUpperCase())
    chmodSync(cookie, 0o600)
    for (const node of nodes) {
      mkdirSync(join(node.dir, "mnesia"), { recursive: true })
      mkdirSync(join(node.dir, "log"), { recursive: true })
      writeConfig(node, options.config ?? [])
      if (options.advanced !== undefined) {
        writeFileSync(join(node.dir, "advanced.config"), options.advanced)
      }
      writeFileSync(join(node.dir, "enabled_plugins"), "[].\n")
      writeFileSync(join(node.dir, "rabbitmq-env.conf"), "")
    }
  }

  /** A CLI tool of RabbitMQ (`rabbitmqctl`, `rabbitmq-queues`) against `node`. */
  const cli = (
    tool: string,
    node: ClusterNode,
    args: ReadonlyArray<string>,
    timeout = 60_000,
  ): Promise<string> =>
    new Promise((resolve, reject) => {
      execFile(
        join(BIN, tool),
        ["-n", node.name, "-q", ...args],
        { encoding: "utf8", timeout, env: nodeEnv(node, home) },
        (error, stdout, stderr) => {
          if (error) {
            reject(new Error(`${tool} -n ${node.name} ${args.join(" ")}: ${stderr || error}`))
          } else resolve(stdout)
        },
      )
    })
  const ctl = (node: ClusterNode, ...args: ReadonlyArray<string>) => cli("rabbitmqctl", node, args)
  const queues = (node: ClusterNode, ...args: ReadonlyArray<string>) =>
    cli("rabbitmq-queues", node, args)

  /** Spawns the node's server (or again, after a kill), and waits for it to boot. */
  const boot = async (node: ClusterNode) => {
    const script = spawn(join(BIN, "rabbitmq-server"), [], {
      env: nodeEnv(node, home),
      stdio: ["ignore", "ignore", "ignore"],
      detached: true,
    })
    const exited = new Promise<void>((r) => script.once("exit", () => r()))
    const state: Running = { script, beam: undefined, exited }
    running.set(node.name, state)
    exited.then(() => {
      if (running.get(node.name) === state) running.delete(node.name)
    })
    // await_startup fails at once until the node has registered with epmd: asked again.
    const deadline = Date.now() + 180_000
    let ended = false
    exited.then(() => (ended = true))
    for (;;) {
      try {
        await ctl(node, "await_startup", "--timeout", "120")
        break
      } catch (e) {
        if (ended) throw new Error(`${node.name} ended as it started; see ${node.dir}/log`)
        if (Date.now() > deadline) throw e
        await sleep(500)
      }
    }
    state.beam = await pidOf(node)
    if (!isBeamOf(state.beam, node)) {
      throw new Error(`pid ${state.beam} of ${node.name}'s pid file is not its Erlang VM`)
    }
  }

  /** The VM's pid: its pid file, else the node's own answer. */
  const pidOf = async (node: ClusterNode): Promise<number> => {
    try {
      return Number(readFileSync(join(node.dir, "pid"), "utf8").trim())
    } catch {
      return Number((await ctl(node, "eval", "os:getpid().")).replace(/[^0-9]/g, ""))
    }
  }

  /** The node's Erlang VM, checked to be it. */
  const beamOf = (node: ClusterNode): number => {
    const pid = running.get(node.name)?.beam
    if (pid === undefined || !isBeamOf(pid, node)) throw new Error(`${node.name} is not running`)
    return pid
  }

  const signal = (node: ClusterNode, sig: NodeJS.Signals) => process.kill(beamOf(node), sig)

  /** SIGKILL of the node's VM and script if still running: synchronous, for an exit handler too. */
  const killNode = (node: ClusterNode) => {
    const state = running.get(node.name)
    if (state === undefined) return
    if (state.beam !== undefined && isBeamOf(state.beam, node)) {
      try {
        process.kill(state.beam, "SIGKILL")
      } catch {
        // Gone.
      }
    }
    try {
      if (state.script.pid !== undefined) process.kill(-state.script.pid, "SIGKILL")
    } catch {
      // Gone.
    }
    running.delete(node.name)
  }

  /** SIGKILL of every node VM and script still running: synchronous, for an exit handler too. */
  const killAllNodes = () => nodes.forEach(killNode)

  /** `rabbitmqctl stop` of a running node (bounded), then SIGKILL of what is left of it. */
  const stopNode = async (node: ClusterNode) => {
    const state = running.get(node.name)
    if (state === undefined) return
    await Promise.race([
      cli("rabbitmqctl", node, ["stop"], 30_000).catch(() => {}),
      sleep(30_000),
    ])
    await Promise.race([state.exited, sleep(5_000)])
    killNode(node)
  }

  return {
    nodes,
    home,
    ctl,
    queues,
    nodeOf: (name: string) => nodes.find((n) => n.name === name),
    isRunning: (node: ClusterNode) => running.has(node.name),

    /** Starts the nodes, then joins the others (c2 and c3) to the first (c1). */
    start: async () => {
      prepare()
      await Promise.all(nodes.map(boot))
      log(`nodes ${nodes.map((n) => `${n.name}:${n.amqpPort}`).join(", ")} up`)
      if (nodes.length === 1) return
      for (const node of nodes.slice(1)) {
        await ctl(node, "stop_app")
        await ctl(node, "join_cluster", nodes[0]!.name)
        await ctl(node, "start_app")
      }
      await ctl(nodes[0]!, "await_online_nodes", String(nodes.length))
      log(`joined: ${nodes.slice(1).map((n) => n.label).join(" and ")} to ${nodes[0]!.label}`)
    },

    /**
     * Starts a node again after a kill or a stop: it rejoins its cluster from its data directory,
     * with `config` in its rabbitmq.conf in place of the options' lines if given.
     */
    restart: (node: ClusterNode, config?: ReadonlyArray<string>) => {
      if (config !== undefined) writeConfig(node, config)
      return boot(node)
    },

    /** Stops the node as `stopAll` does (not paused): its data kept for a restart. */
    stop: stopNode,

    /** SIGKILL of the node's VM: a crash. Resolves once its script has ended too. */
    kill: async (node: ClusterNode) => {
      const state = running.get(node.name)
      paused.delete(node.name)
      signal(node, "SIGKILL")
      await state?.exited
    },

    /** SIGSTOP of the node's VM: it hangs, its sockets open. */
    pause: (node: ClusterNode) => {
      signal(node, "SIGSTOP")
      paused.add(node.name)
    },
    resume: (node: ClusterNode) => {
      paused.delete(node.name)
      signal(node, "SIGCONT")
    },

    /**
     * Stops every node, whatever state it is in: SIGCONT to a paused one, `rabbitmqctl stop`
     * (bounded), then SIGKILL of what is left of each, its process group with it. epmd is the
     * machine's (the main broker's too): it is left alone.
     */
    stopAll: async () => {
      for (const name of [...paused]) {
        const node = nodes.find((n) => n.name === name)!
        try {
          signal(node, "SIGCONT")
        } catch {
          // Gone.
        }
      }
      paused.clear()
      await Promise.all(nodes.map(stopNode))
      killAllNodes()
    },

    /** SIGKILL of every node still running, at once: for an interrupted run. */
    killAll: killAllNodes,

    /** Removes the nodes' directories (data, logs, cookie). */
    remove: () => rmSync(options.baseDir, { recursive: true, force: true }),
  }
}

/** A quorum queue as the cluster sees it. */
export interface QueueState {
  readonly name: string
  readonly leader: string | undefined
  readonly members: ReadonlyArray<string>
  readonly online: ReadonlyArray<string>
}

/** The quorum queues of `vhost`, as the first node that answers sees them. */
export const queueStates = async (
  cluster: Cluster,
  vhost: string,
  avoid: ReadonlyArray<string> = [],
): Promise<Map<string, QueueState>> => {
  let last: unknown
  for (const node of cluster.nodes.filter((n) => cluster.isRunning(n) && !avoid.includes(n.name))) {
    try {
      const out = await cluster.ctl(
        node,
        "list_queues",
        "-p",
        vhost,
        "name",
        "leader",
        "members",
        "online",
        "--formatter",
        "json",
        "--timeout",
        "10",
      )
      const rows = JSON.parse(out) as Array<Record<string, unknown>>
      const list = (v: unknown) => (Array.isArray(v) ? v.map(String) : [])
      return new Map(rows.map((r) => [String(r.name), {
        name: String(r.name),
        leader: typeof r.leader === "string" && r.leader !== "" ? r.leader : undefined,
        members: list(r.members),
        online: list(r.online),
      }]))
    } catch (e) {
      last = e
    }
  }
  throw new Error(`no node listed the queues: ${(last as Error | undefined)?.message}`)
}

/** The cluster's partitions, as `node` sees them (none: an empty list). */
export const partitionsSeen = async (cluster: Cluster, node: ClusterNode): Promise<string> => {
  const status = JSON.parse(await cluster.ctl(node, "cluster_status", "--formatter", "json"))
  const partitions = status.partitions ?? {}
  return Object.keys(partitions).length === 0 ? "" : JSON.stringify(partitions)
}
