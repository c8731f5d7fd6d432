/**
 * Heartbeats on the real RabbitMQ, through a TCP proxy of the test's own that can black-hole the
 * connections it carries (their sockets stay open, no byte goes through): the worker asks the
 * broker for its heartbeat, and a black-holed connection is stalled once one is overdue (its log
 * says so; readiness fails on it, test/Lifecycle.test.ts), given up within three of them, then
 * consuming resumes on a fresh one. Real time, bounded: a heartbeat is the broker's and the
 * socket's.
 */
import { createServer, type Server, type Socket } from "node:net"
import { execFileSync } from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Effect, Logger, Schema } from "effect"
import * as Settings from "../../src/Settings.ts"
import * as Worker from "../../src/Worker.ts"
import { ensureVhosts, type OutMessage, platform, QUORUM_VHOST, uniqueName } from "./broker.ts"
import { serveInProcess } from "./worker.ts"
import { pollUntil, sleep } from "../support/waits.ts"

const TIMEOUT = 60_000

/** One connection through the proxy: its two sockets, and what it does to their bytes. */
interface Pair {
  readonly client: Socket
  readonly upstream: Socket
  holed: boolean
  /** Whether it was ever stalled. */
  wasStalled: boolean
  /** Held while stalled, in order: the bytes each way, and the ends. */
  stalled: Array<() => void> | undefined
}

/**
 * A proxy to the broker; `blackHole` silences the connections it carries now, `stall` holds
 * their bytes (and their ends) until `resume`, as a path that stalls and then delivers.
 */
const proxy = async () => {
  const pairs: Array<Pair> = []
  const server: Server = createServer((client) => {
    const upstream = new (client.constructor as typeof Socket)()
    const pair: Pair = { client, upstream, holed: false, wasStalled: false, stalled: undefined }
    pairs.push(pair)
    upstream.connect(5672, "127.0.0.1")
    const carry = (step: () => void) =>
      pair.holed ? undefined : pair.stalled ? pair.stalled.push(step) : step()
    client.on("data", (chunk) => carry(() => upstream.write(chunk)))
    upstream.on("data", (chunk) => carry(() => client.write(chunk)))
    // A black hole keeps the worker's socket open even when the broker gives up its side (its own
    // heartbeat timeout races the worker's): only the worker can find the connection dead.
    const silenced = (to: Socket) => pair.holed && to === client
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      from.on("error", () => silenced(to) || to.destroy())
      from.on("close", () => silenced(to) || (pair.holed ? to.destroy() : carry(() => to.end())))
    }
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as { port: number }).port
  return {
    url: `amqp://guest:guest@127.0.0.1:${port}/${encodeURIComponent(QUORUM_VHOST)}`,
    /** The local ports of the broker's side of each connection carried: its peer ports. */
    upstreamPorts: () =>
      pairs.filter((p) => !p.upstream.destroyed).map((p) => p.upstream.localPort),
    blackHole: () => {
      for (const pair of pairs) pair.holed = true
    },
    stall: () => {
      for (const pair of pairs) {
        pair.stalled ??= []
        pair.wasStalled = true
      }
    },
    /** Whether every connection ever stalled has ended, on the broker's side too. */
    stalledEnded: () => pairs.every((p) => !p.wasStalled || p.upstream.destroyed),
    resume: () => {
      for (const pair of pairs) {
        const held = pair.stalled ?? []
        pair.stalled = undefined
        for (const step of held) step()
      }
    },
    close: () => {
      for (const { client, upstream } of pairs) client.destroy(), upstream.destroy()
      return new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

/** The heartbeat the broker agreed for the connection from `peerPort`, in seconds. */
const agreedHeartbeat = (peerPort: number): number | undefined => {
  const rows = execFileSync("rabbitmqctl", ["-q", "list_connections", "peer_port", "timeout"], {
    encoding: "utf8",
    timeout: 30_000,
  })
  const row = rows.split("\n").map((l) => l.trim().split(/\s+/)).find(([port]) =>
    port === String(peerPort)
  )
  return row === undefined ? undefined : Number(row[1])
}

/** Runs of the handler, by task id. */
type Runs = Map<string, number>

const worker = (name: string, runs: Runs) =>
  Worker.make({
    name,
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ n: Schema.Number }),
    timeout: "10 seconds",
    handler: (input, ctx) =>
      Effect.suspend(() => {
        runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1)
        return Effect.as(Effect.sleep("200 millis"), { n: input.n })
      }),
  })

/** Runs a worker on `url` until stopped; its log lines, each with when it came. */
const run = (
  name: string,
  url: string,
  overrides: Settings.SettingsOverrides = {},
  runs: Runs = new Map(),
) => {
  const lines: Array<{ at: number; text: string }> = []
  const logger = Logger.make(({ message }) =>
    lines.push({
      at: Date.now(),
      text: Array.isArray(message) ? message.join(" ") : String(message),
    })
  )
  const definition = worker(name, runs)
  const settings = Settings.layer({ name, timeout: definition.timeout }, {
    brokerUrl: url,
    ...overrides,
  })
  const { stop } = serveInProcess(definition, settings, { logger, level: "Info" })
  const waitFor = (pattern: RegExp, ms = 20_000) =>
    pollUntil(`a line ${pattern}`, () => lines.find((l) => pattern.test(l.text)), {
      ms,
      every: 20,
      said: () => `: ${lines.map((l) => l.text)}`,
    })
  return { lines, waitFor, stop }
}

describe("heartbeats on RabbitMQ", () => {
  beforeAll(() => ensureVhosts())
  let broker: Awaited<ReturnType<typeof platform>>
  beforeAll(async () => (broker = await platform(QUORUM_VHOST)))
  afterAll(() => broker.close())

  it("asks the broker for 60 s by default (its own), WORKER_HEARTBEAT_S otherwise", async () => {
    for (const [overrides, expected] of [[{}, 60], [{ heartbeat: 3 }, 3]] as const) {
      const through = await proxy()
      const name = uniqueName("heartbeat")
      const running = run(name, through.url, overrides)
      try {
        await running.waitFor(/started in service mode/)
        const [port] = through.upstreamPorts()
        expect(agreedHeartbeat(port!)).toBe(expected)
      } finally {
        await running.stop()
        await through.close()
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      }
    }
  }, TIMEOUT)

  it(
    "a black-holed connection is given up within 3 heartbeats, and consuming resumes on a fresh one",
    async () => {
      const through = await proxy()
      const name = uniqueName("blackhole")
      const heartbeat = 2
      const running = run(name, through.url, { heartbeat })
      try {
        await running.waitFor(/started in service mode/)
        const holedAt = Date.now()
        through.blackHole()
        // Stalled, for readiness, once a whole heartbeat is overdue: read a quarter of one
        // apart, so within one and a half after the last byte.
        const stalled = await running.waitFor(/a heartbeat is overdue/)
        const lost = await running.waitFor(/was lost \(Heartbeat timeout\)/)
        // Slack for a busy machine's timers; given up within three heartbeats.
        expect(stalled.at - holedAt).toBeLessThan(1.5 * heartbeat * 1000 + 1500)
        expect(stalled.at).toBeLessThanOrEqual(lost.at)
        expect(lost.at - holedAt).toBeLessThan(3 * heartbeat * 1000 + 1500)
        await running.waitFor(/Connected to the broker again/)
        broker.publish(`${name}_queue_in`, broker.envelope("after-the-hole", { n: 7 }))
        const out = await broker.readUntil(
          `${name}_queue_out`,
          (all) => all.some((m) => m.type === "success"),
        )
        expect(out.map((m) => m.type)).toEqual(["started", "success"])
      } finally {
        await running.stop()
        await through.close()
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      }
    },
    TIMEOUT,
  )

  it(
    "a path stalled past the confirm timeout, then delivering: the connection is given up, and no task gets more terminal messages than runs",
    async () => {
      const through = await proxy()
      const name = uniqueName("stall")
      const runs: Runs = new Map()
      // No heartbeat: the overdue confirm alone finds the stall (10 s), before the path delivers
      // what it held (12 s), the first attempts' results among it.
      const running = run(name, through.url, { heartbeat: 0, concurrency: 5 }, runs)
      const tasks = Array.from({ length: 40 }, (_, i) => `t-${i}`)
      try {
        await running.waitFor(/started in service mode/)
        for (const [i, id] of tasks.entries()) {
          broker.publish(`${name}_queue_in`, broker.envelope(id, { n: i }))
        }
        const out = await broker.readUntil(
          `${name}_queue_out`,
          (all) => all.filter((m) => m.type === "success").length >= 5,
        )
        through.stall()
        await running.waitFor(/was lost \(a publish's confirm was overdue/, 15_000)
        await sleep(12_000 - 10_000)
        through.resume()
        const concluded = () => new Set(out.filter((m) => m.type === "success").map(taskOf))
        out.push(
          ...await broker.readUntil(
            `${name}_queue_out`,
            (more) =>
              tasks.every((id) =>
                concluded().has(id) || more.some((m) => taskOf(m) === id && m.type === "success")
              ),
            30_000,
          ),
        )
        // What the stalled path held reaches the broker before the end it held last: once that
        // has closed the broker's side, every late copy is on the queue (confirmed by then:
        // the broker confirms a quorum queue's publish once it holds it).
        const deadline = Date.now() + 20_000
        while (!through.stalledEnded() && Date.now() < deadline) {
          await sleep(50)
        }
        expect(through.stalledEnded()).toBe(true)
        await sleep(500)
        out.push(...await broker.drain(`${name}_queue_out`))
        const terminal = out.filter((m) => m.type === "success" || m.type === "failure")
        const ids = terminal.map((m) => m.messageId)
        console.log(
          `stall: ${terminal.length} terminal messages for ${tasks.length} tasks, ${
            [...runs.values()].reduce((a, b) => a + b, 0)
          } runs; ${tasks.filter((id) => (runs.get(id) ?? 0) > 1).length} tasks run twice`,
        )
        expect(new Set(ids).size).toBe(ids.length)
        for (const id of tasks) {
          const copies = terminal.filter((m) => taskOf(m) === id).length
          expect(copies, id).toBeGreaterThanOrEqual(1)
          expect(copies, id).toBeLessThanOrEqual(runs.get(id) ?? 0)
        }
      } finally {
        through.resume()
        await running.stop()
        await through.close()
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      }
    },
    TIMEOUT,
  )
})

/** The task id of a message on the output queue. */
const taskOf = (message: OutMessage): string => JSON.parse(message.text).task_id
