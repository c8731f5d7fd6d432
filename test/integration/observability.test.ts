/**
 * Issue 5, end to end on RabbitMQ: a worker process (in this process, with the SDK's JSON log
 * lines captured) taken through success, failure, retry, poison, timeout, a broker outage and
 * shutdown; its `/metrics` read with a real Prometheus parser, `/ready` and `/health` followed,
 * each task's story read back from the logs by its id, and every line scanned for the password
 * and for a payload marker.
 */
import net from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Fiber, Logger, References, Schema } from "effect"
import * as Lifecycle from "../../src/Lifecycle.ts"
import * as Process from "../../src/Process.ts"
import * as Prometheus from "../../src/Prometheus.ts"
import * as Worker from "../../src/Worker.ts"
import { FatalError, RetryableError } from "../../src/WorkerError.ts"
import * as WorkerLogger from "../../src/WorkerLogger.ts"
import { parse, value } from "../support/prometheus.ts"
import { ensureVhosts, platform, QUORUM_VHOST, rabbitmqctl, uniqueName } from "./broker.ts"
import { pollUntil } from "../support/waits.ts"

const USER = "async-task-worker-observability"
const PASSWORD = "pw-Zq8-never-logged"
const MARKER = "payload-marker-7f3a"

/** A TCP proxy to the broker that the test can cut, as if the broker had stopped. */
const makeProxy = async () => {
  const sockets = new Set<net.Socket>()
  let cut = false
  const server = net.createServer((client) => {
    if (cut) return void client.destroy()
    const upstream = net.connect(5672, "127.0.0.1")
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on("error", () => {})
      socket.on("close", () => {
        sockets.delete(socket)
        client.destroy()
        upstream.destroy()
      })
    }
    client.pipe(upstream)
    upstream.pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    port: (server.address() as net.AddressInfo).port,
    cut: () => {
      cut = true
      for (const socket of sockets) socket.destroy()
    },
    restore: () => void (cut = false),
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy()
        server.close(() => resolve())
      }),
  }
}

const Input = Schema.Struct({
  mode: Schema.Literals(["ok", "fatal", "retry", "hang", "slow"]),
  marker: Schema.String,
})

const worker = Worker.make({
  name: "observability",
  input: Input,
  output: Schema.Struct({ ok: Schema.Boolean }),
  timeout: "3 seconds",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      yield* Effect.logInfo("handling the task")
      switch (input.mode) {
        case "ok":
          return { ok: true }
        case "fatal":
          return yield* new FatalError({ code: "NOT_ALLOWED", message: "Not allowed." })
        case "retry":
          if (ctx.attempt === 1) return yield* new RetryableError({ message: "later" })
          return { ok: true }
        case "hang":
          return yield* Effect.never
        case "slow":
          yield* Effect.sleep("30 seconds")
          return { ok: true }
      }
    }),
})

const get = async (port: number, path: string) => {
  const response = await fetch(`http://127.0.0.1:${port}${path}`)
  return { status: response.status, text: await response.text() }
}

describe("observability on RabbitMQ", () => {
  // Each rabbitmqctl call starts an Erlang VM: seconds apiece on a busy machine, more under Deno.
  beforeAll(() => {
    ensureVhosts()
    const users = rabbitmqctl("list_users").split("\n").map((l) => l.split("\t")[0])
    if (users.includes(USER)) rabbitmqctl("change_password", USER, PASSWORD)
    else rabbitmqctl("add_user", USER, PASSWORD)
    rabbitmqctl("set_permissions", "-p", QUORUM_VHOST, USER, ".*", ".*", ".*")
  }, 120_000)
  afterAll(() => void rabbitmqctl("delete_user", USER), 60_000)

  it(
    "metrics, probes and logs tell each task's story, and never a password or a payload",
    async () => {
      const name = uniqueName("observability")
      const inQueue = `${name}_queue_in`
      const outQueue = `${name}_queue_out`
      const proxy = await makeProxy()
      const client = await platform(QUORUM_VHOST)
      const lines: Array<string> = []
      const proc = Effect.runSync(Process.makeTest())
      const brokerUrl = `amqp://${USER}:${PASSWORD}@127.0.0.1:${proxy.port}/${QUORUM_VHOST}`
      const fiber = Effect.runFork(
        Lifecycle.run(worker, {
          settings: {
            brokerUrl,
            inQueue,
            outQueue,
            concurrency: 4,
            deliveryLimit: 3,
            retryBackoffBase: 0,
            retryBackoffMax: 0,
            shutdownGrace: "1 second",
            healthCheckHost: "127.0.0.1",
            healthCheckPort: 0,
          },
        }).pipe(
          Effect.provideService(Process.Process, proc.process),
          Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} })),
          // The JSON lines without the lifecycle's redactions: no password may reach a line even
          // before `***` would replace it.
          Effect.provide(
            Logger.layer([
              Logger.make((options) =>
                void lines.push(WorkerLogger.format({
                  ...options,
                  annotations: options.fiber.getRef(References.CurrentLogAnnotations),
                }))
              ),
            ]),
          ),
        ),
      )
      try {
        const records = () => lines.map((line) => JSON.parse(line) as Record<string, unknown>)
        const port = await pollUntil("the probe server listens", () => {
          const line = records().find((r) => String(r.msg).startsWith("Probes on "))
          return line === undefined ? undefined : Number(/:(\d+) /.exec(String(line.msg))![1])
        }, { ms: 20_000 })
        await pollUntil("ready", async () => (await get(port, "/ready")).status === 200, {
          ms: 20_000,
        })
        const before = parse((await get(port, "/metrics")).text)
        // Before any task, the SDK's series are there, at zero, as a scraper expects them.
        for (const status of ["success", "failure", "retry", "poison", "shutdown_requeued"]) {
          expect(value(before, "worker_tasks_total", { status })).toBe(0)
        }
        for (const message_type of ["started", "progress", "success", "failure"]) {
          expect(value(before, "worker_messages_published_total", { message_type })).toBe(0)
          expect(value(before, "worker_publish_failures_total", { message_type })).toBe(0)
        }
        expect(value(before, "worker_poison_messages_total", { reason: "not_json" })).toBe(0)
        const count = (metric: string, labels: Record<string, string> = {}) => {
          try {
            return value(before, metric, labels)
          } catch {
            return 0
          }
        }

        await client.waitForQueues(name)
        for (
          const [taskId, mode] of [["t-ok", "ok"], ["t-fatal", "fatal"], ["t-retry", "retry"], [
            "t-hang",
            "hang",
          ]] as const
        ) {
          await client.publish(inQueue, client.envelope(taskId, { mode, marker: MARKER }))
        }
        await client.publish(inQueue, `{"not json ${MARKER}`)
        await client.confirmed()
        const out = await client.readUntil(
          outQueue,
          (all) => all.filter((m) => m.type === "success" || m.type === "failure").length === 4,
        )
        const terminal = out.filter((m) => m.type === "success" || m.type === "failure").map((m) =>
          JSON.parse(m.text)
        )
        expect(terminal.map((m) => [m.task_id, m.data.message_type]).sort()).toEqual([
          ["t-fatal", "failure"],
          ["t-hang", "failure"],
          ["t-ok", "success"],
          ["t-retry", "success"],
        ])
        expect((await get(port, "/health")).status).toBe(200)

        // The broker goes away: not ready, still healthy; it comes back: ready again.
        proxy.cut()
        const down = await pollUntil("/ready fails", async () => {
          const r = await get(port, "/ready")
          return r.status === 503 ? JSON.parse(r.text) : undefined
        }, { ms: 20_000 })
        expect(down.error.code).toBe("DEPENDENCIES_NOT_READY")
        expect(down.error.components.broker.status).toBe("error")
        expect(down.error.components.draining).toEqual({ status: "ok" })
        expect((await get(port, "/health")).status).toBe(200)
        proxy.restore()
        await pollUntil(
          "ready again",
          async () => (await get(port, "/ready")).status === 200,
          { ms: 20_000 },
        )

        const after = parse((await get(port, "/metrics")).text)
        const delta = (metric: string, labels: Record<string, string> = {}) =>
          value(after, metric, labels) - count(metric, labels)
        expect(delta("worker_tasks_total", { status: "success" })).toBe(2)
        expect(delta("worker_tasks_total", { status: "failure" })).toBe(2)
        expect(delta("worker_tasks_total", { status: "retry" })).toBe(1)
        expect(delta("worker_tasks_total", { status: "poison" })).toBe(1)
        expect(delta("worker_task_failures_total", { code: "NOT_ALLOWED" })).toBe(1)
        expect(delta("worker_task_failures_total", { code: "TASK_TIMEOUT" })).toBe(1)
        expect(delta("worker_task_retries_total")).toBe(1)
        expect(delta("worker_poison_messages_total", { reason: "not_json" })).toBe(1)
        expect(delta("worker_messages_published_total", { message_type: "started" })).toBe(5)
        expect(delta("worker_messages_published_total", { message_type: "success" })).toBe(2)
        expect(delta("worker_messages_published_total", { message_type: "failure" })).toBe(2)
        expect(value(after, "worker_tasks_in_flight")).toBe(0)
        // Counters of what did not happen: nothing failed to publish, to ack, or was dropped.
        expect(delta("worker_ack_failures_total")).toBe(0)
        expect(delta("worker_shutdown_requeued_total")).toBe(0)
        for (const name of ["worker_publish_failures_total", "worker_progress_dropped_total"]) {
          expect(after.find((f) => f.name === name)?.metrics ?? []).toEqual(
            before.find((f) => f.name === name)?.metrics ?? [],
          )
        }
        for (const family of after) {
          for (const sample of family.metrics) {
            expect(Object.keys(sample.labels ?? {})).not.toContain("task_id")
            expect(Object.keys(sample.labels ?? {})).not.toContain("service")
          }
        }

        // Shutdown with a task that outlives the grace: draining is not ready, the task requeued.
        await client.publish(inQueue, client.envelope("t-slow", { mode: "slow", marker: MARKER }))
        await client.confirmed()
        await pollUntil(
          "t-slow runs",
          () => records().some((r) => r.task_id === "t-slow" && r.msg === "handling the task"),
          { ms: 20_000 },
        )
        Effect.runSync(proc.signal("SIGTERM"))
        const draining = await pollUntil("/ready says draining", async () => {
          const r = await get(port, "/ready")
          return r.status === 503 ? JSON.parse(r.text) : undefined
        }, { ms: 20_000 })
        expect(draining.error.components.draining.status).toBe("error")
        expect(await Effect.runPromise(Fiber.join(fiber))).toBe(0)
        // The broker may count the requeued message a moment after the worker has gone.
        expect(
          await pollUntil(
            "t-slow is requeued",
            async () => (await client.count(inQueue)) || undefined,
            { ms: 5_000 },
          ),
        ).toBe(1)
        // The server is gone with the process's life: the same registry, read in this process.
        const final = parse(await Effect.runPromise(Prometheus.exposition))
        expect(
          value(final, "worker_shutdown_requeued_total") - count("worker_shutdown_requeued_total"),
        )
          .toBe(1)
        expect(
          value(final, "worker_tasks_total", { status: "shutdown_requeued" }) -
            count("worker_tasks_total", { status: "shutdown_requeued" }),
        ).toBe(1)
        expect(value(final, "worker_tasks_in_flight")).toBe(0)

        // Every task's story, by its id, ends with its one decision line per delivery.
        const story = (taskId: string) =>
          records().filter((r) => JSON.stringify(r).includes(taskId))
        for (
          const [taskId, decisions] of [
            ["t-ok", ["success"]],
            ["t-fatal", ["failure"]],
            ["t-retry", ["retry", "success"]],
            ["t-hang", ["failure"]],
            ["t-slow", ["shutdown_requeued"]],
          ] as const
        ) {
          const lines = story(taskId)
          const settled = lines.filter((r) => String(r.msg).startsWith("Delivery settled:"))
          expect(settled.map((r) => r.outcome)).toEqual(decisions)
          expect(lines.at(-1)).toBe(settled.at(-1))
          for (const line of settled) {
            expect(Object.keys(line)).toEqual(expect.arrayContaining([
              "ts",
              "level",
              "logger",
              "msg",
              "task_id",
              "service",
              "attempt",
              "delivery_limit",
              "outcome",
              "action",
            ]))
            expect(line.level).toBe("INFO")
          }
          for (const line of lines.filter((r) => r.msg === "handling the task")) {
            expect(line).toMatchObject({ task_id: taskId, service: "observability" })
          }
        }
        expect(story("t-fatal").at(-1)).toMatchObject({ code: "NOT_ALLOWED", attempt: 1 })
        expect(story("t-hang").at(-1)).toMatchObject({ code: "TASK_TIMEOUT" })

        // The whole run, reconnects included: no password, no payload.
        expect(records().some((r) => /reconnect|lost/i.test(String(r.msg)))).toBe(true)
        for (const line of [...lines, ...Effect.runSync(proc.err), ...Effect.runSync(proc.out)]) {
          expect(line).not.toContain(PASSWORD)
          expect(line).not.toContain(MARKER)
        }
      } finally {
        await Effect.runPromise(Fiber.interrupt(fiber))
        await client.remove(inQueue, outQueue)
        await client.close()
        await proxy.close()
      }
    },
    60_000,
  )
})
