/**
 * Heartbeats on the real RabbitMQ, through a TCP proxy of the test's own that can black-hole the
 * connections it carries (their sockets stay open, no byte goes through): the worker asks the
 * broker for its heartbeat, and a black-holed connection is given up within three of them, then
 * consuming resumes on a fresh one. Real time, bounded: a heartbeat is the broker's and the
 * socket's.
 */
import { createServer, type Server, type Socket } from "node:net"
import { execFileSync } from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Effect, Fiber, Layer, Logger, References, Schema } from "effect"
import * as AmqpTransport from "../../src/AmqpTransport.ts"
import * as Settings from "../../src/Settings.ts"
import * as Worker from "../../src/Worker.ts"
import { ensureVhosts, platform, QUORUM_VHOST, uniqueName } from "./broker.ts"

const TIMEOUT = 60_000

/** A proxy to the broker; `blackHole` silences the connections it carries now. */
const proxy = async () => {
  const pairs: Array<{ client: Socket; upstream: Socket; holed: boolean }> = []
  const server: Server = createServer((client) => {
    const upstream = new (client.constructor as typeof Socket)()
    const pair = { client, upstream, holed: false }
    pairs.push(pair)
    upstream.connect(5672, "127.0.0.1")
    client.on("data", (chunk) => pair.holed || upstream.write(chunk))
    upstream.on("data", (chunk) => pair.holed || client.write(chunk))
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      from.on("error", () => to.destroy())
      from.on("close", () => to.destroy())
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

const worker = (name: string) =>
  Worker.make({
    name,
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ n: Schema.Number }),
    timeout: "10 seconds",
    handler: (input) => Effect.succeed({ n: input.n }),
  })

/** Runs a worker on `url` until stopped; its log lines, each with when it came. */
const run = (name: string, url: string, overrides: Settings.SettingsOverrides = {}) => {
  const lines: Array<{ at: number; text: string }> = []
  const logger = Logger.make(({ message }) =>
    lines.push({
      at: Date.now(),
      text: Array.isArray(message) ? message.join(" ") : String(message),
    })
  )
  const definition = worker(name)
  const settings = Settings.layer({ name, timeout: definition.timeout }, {
    brokerUrl: url,
    ...overrides,
  })
  const fiber = Effect.runFork(
    Worker.serve(definition).pipe(
      Effect.provide(AmqpTransport.layer.pipe(Layer.provideMerge(settings))),
      Effect.provide(Logger.layer([logger])),
      Effect.provideService(References.MinimumLogLevel, "Info"),
    ),
  )
  const waitFor = async (pattern: RegExp, ms = 20_000) => {
    const deadline = Date.now() + ms
    for (;;) {
      const line = lines.find((l) => pattern.test(l.text))
      if (line !== undefined) return line
      if (Date.now() > deadline) throw new Error(`no line ${pattern}: ${lines.map((l) => l.text)}`)
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
  }
  return { lines, waitFor, stop: () => Effect.runPromise(Fiber.interrupt(fiber)) }
}

describe("heartbeats on RabbitMQ", () => {
  beforeAll(() => ensureVhosts())
  let broker: Awaited<ReturnType<typeof platform>>
  beforeAll(async () => (broker = await platform(QUORUM_VHOST)))
  afterAll(() => broker.close())

  it("asks the broker for 10 s by default, WORKER_HEARTBEAT_S otherwise", async () => {
    for (const [overrides, expected] of [[{}, 10], [{ heartbeat: 3 }, 3]] as const) {
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
        const lost = await running.waitFor(/was lost \(Heartbeat timeout\)/)
        // Three heartbeats, and some slack for a busy machine's timers.
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
})
