import net from "node:net"
import { describe, expect, it } from "@effect/vitest"
import {
  Clock,
  ConfigProvider,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Metric,
  Option,
  Schema,
  Scope,
  Stream,
  SubscriptionRef,
} from "effect"
import { TestClock } from "effect/testing"
import * as Lifecycle from "../src/Lifecycle.ts"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as Process from "../src/Process.ts"
import type { WireMessage } from "../src/Protocol.ts"
import * as Settings from "../src/Settings.ts"
import { type ConnectionStatus, Transport } from "../src/Transport.ts"
import * as Worker from "../src/Worker.ts"
import { FatalError, ProbeError, RetryableError, TransportError } from "../src/WorkerError.ts"
import { publishedTypes } from "./support/environment.ts"
import { captureLogs, isDone, settle, waitUntil } from "./support/logs.ts"
import { envelope } from "./support/builders.ts"

// ---------------------------------------------------------------------------------------------
// Workers

const Seconds = Schema.Struct({ seconds: Schema.Number })
const Slept = Schema.Struct({ slept: Schema.Number })

interface Seen {
  /** Tasks whose handler started, in order. */
  readonly entered: Array<string>
  /** Tasks whose handler was interrupted, in order. */
  readonly interrupted: Array<string>
  /** What happened, in order, across handlers and hooks. */
  readonly events: Array<string>
}

const newSeen = (): Seen => ({ entered: [], interrupted: [], events: [] })

/** Tasks sleep for as long as their input says. */
const sleeper = (
  seen: Seen,
  hooks: Pick<
    Worker.WorkerDefinition<any, any, any, never>,
    "onStartup" | "onShutdown" | "readiness"
  > = {},
) =>
  Worker.make({
    name: "sleeper",
    input: Seconds,
    output: Slept,
    timeout: "5 minutes",
    concurrency: 4,
    handler: ({ seconds }, ctx) =>
      Effect.sync(() => {
        seen.entered.push(ctx.taskId)
        seen.events.push(`handler ${ctx.taskId}`)
      }).pipe(
        Effect.andThen(Effect.sleep(Duration.seconds(seconds))),
        Effect.as({ slept: seconds }),
        Effect.onInterrupt(() => Effect.sync(() => seen.interrupted.push(ctx.taskId))),
      ),
    ...hooks,
  })

// ---------------------------------------------------------------------------------------------
// Helpers

/** Effect.never, but released when the test ends so that nothing is left running. */
const neverUntilTheEnd = Effect.acquireRelease(
  Deferred.make<void>(),
  (never) => Deferred.succeed(never, undefined),
)

/** A worker whose handler never ends and refuses to be interrupted; `entered` lists its tasks. */
const refusing = (
  name: string,
  timeout: Duration.Input,
  never: Deferred.Deferred<void>,
) => {
  const entered: Array<string> = []
  const worker = Worker.make({
    name,
    input: Seconds,
    output: Slept,
    timeout,
    handler: (_, ctx) =>
      Effect.uninterruptible(
        Effect.sync(() => entered.push(ctx.taskId)).pipe(
          Effect.andThen(Deferred.await(never)),
          Effect.as({ slept: 0 }),
        ),
      ),
  })
  return { worker, entered }
}

/** A transport on `broker` whose connection never closes (its scope's close waits on `never`). */
const neverClosing = (
  never: Deferred.Deferred<void>,
  change: (inner: Transport["Service"]) => Transport["Service"] = (inner) => inner,
) =>
(broker: MemoryBroker.MemoryBroker["Service"]) =>
  Layer.effect(
    Transport,
    Effect.gen(function* () {
      const s = yield* Settings.Settings
      yield* Effect.addFinalizer(() => Deferred.await(never))
      const inner = yield* broker.transport({
        inQueue: s.inQueue,
        outQueue: s.outQueue,
        capacity: s.concurrency,
      })
      return change(inner)
    }),
  )

/**
 * The environment the settings are read from: only these variables. Each run's probe server
 * listens on an ephemeral port of the loopback.
 */
const environment = (vars: Record<string, string> = {}) =>
  Effect.provideService(
    ConfigProvider.ConfigProvider,
    ConfigProvider.fromEnv({
      env: { HEALTH_CHECK_HOST: "127.0.0.1", HEALTH_CHECK_PORT: "0", ...vars },
    }),
  )

/**
 * A transport on `broker`, configured by the worker's settings, as `options.transport`; `change`
 * alters what it does.
 */
const memoryTransport = (
  broker: MemoryBroker.MemoryBroker["Service"],
  change: (inner: Transport["Service"]) => Transport["Service"] = (inner) => inner,
): Layer.Layer<Transport, never, Settings.Settings> =>
  Layer.effect(
    Transport,
    Effect.flatMap(Settings.Settings, (s) =>
      Effect.map(
        broker.transport({ inQueue: s.inQueue, outQueue: s.outQueue, capacity: s.concurrency }),
        change,
      )),
  )

/** A transport whose intake fails with `error` once `broken` completes. */
const breaksOn =
  (broken: Deferred.Deferred<void>, error: TransportError) =>
  (inner: Transport["Service"]): Transport["Service"] => ({
    ...inner,
    take: Effect.andThen(Deferred.await(broken), Effect.fail(error)),
  })

interface LaunchOptions {
  readonly settings?: Settings.SettingsOverrides
  readonly env?: Record<string, string>
  /** The transport; by default one on the test's MemoryBroker. */
  readonly transport?: (
    broker: MemoryBroker.MemoryBroker["Service"],
  ) => Layer.Layer<Transport, TransportError, Settings.Settings>
  readonly stdinLines?: Stream.Stream<string>
}

/**
 * Runs `worker` as a process (signals, output and environment simulated) on a MemoryBroker,
 * with a 10 s shutdown grace unless told otherwise.
 */
const launch = (worker: Worker.Worker<any, any, any, never>, options: LaunchOptions = {}) =>
  Effect.gen(function* () {
    const broker = yield* MemoryBroker.make({ reapInterval: "1 hour" })
    const proc = yield* Process.makeTest({
      ...(options.stdinLines ? { stdinLines: options.stdinLines } : {}),
    })
    const logs = captureLogs()
    const inQueue = `${worker.name}_queue_in`
    const outQueue = `${worker.name}_queue_out`
    const run = yield* Lifecycle.run(worker, {
      settings: { shutdownGrace: "10 seconds", ...options.settings },
      transport: (options.transport ?? memoryTransport)(broker),
    }).pipe(
      Effect.provideService(Process.Process, proc.process),
      environment(options.env),
      Effect.provide(logs.layer),
      Effect.forkChild,
    )
    const submit = (taskId: string, seconds: number) =>
      broker.publish(inQueue, envelope(taskId, { seconds })).pipe(Effect.orDie)
    /** The message types published for a task. */
    const published = (taskId: string) => publishedTypes(broker, outQueue, taskId)
    const started = waitUntil(
      () => logs.lines.some((l) => l.message.includes("started in")),
      "the worker has started",
    )
    /** The worker consuming, its transport not connected yet. */
    const connecting = waitUntil(
      () => logs.lines.some((l) => l.message.includes("connecting to")),
      "the worker is connecting",
    )
    /** Sends a stop signal (SIGTERM by default), and lets the process take it. */
    const signal = (sent?: Process.Signal) => Effect.andThen(proc.signal(sent), settle(5))
    return {
      broker,
      proc,
      signal,
      logs,
      run,
      submit,
      published,
      started,
      connecting,
      ready: broker.ready(inQueue),
      unacked: broker.unacked(inQueue),
    }
  })

const errors = (logs: ReturnType<typeof captureLogs>) =>
  logs.lines.filter((l) => l.level === "Error").map((l) => l.message)

// ---------------------------------------------------------------------------------------------

describe("Lifecycle", () => {
  it("shutdownBound is max(grace, 5 s) + 17 s", () => {
    const bound = (grace: Duration.Input) =>
      Duration.toMillis(Lifecycle.shutdownBound(Duration.fromInputUnsafe(grace)))
    expect(bound("25 seconds")).toBe(42_000)
    expect(bound("10 seconds")).toBe(27_000)
    expect(bound("5 seconds")).toBe(22_000)
    expect(bound("1 second")).toBe(22_000)
    expect(bound(0)).toBe(22_000)
  })

  describe("probes", () => {
    const probePort = (logs: ReturnType<typeof captureLogs>) => {
      const line = logs.lines.find((l) => l.message.startsWith("Probes on "))
      return Number(/:(\d+) /.exec(line!.message)![1])
    }
    const get = (port: number, path: string) =>
      Effect.promise(async () => {
        const response = await fetch(`http://127.0.0.1:${port}${path}`)
        return { status: response.status, body: await response.json() }
      })

    it.effect("a probe port already taken: exit 2, with one line naming the settings", () =>
      Effect.gen(function* () {
        const taken = yield* Effect.acquireRelease(
          Effect.promise(() =>
            new Promise<net.Server>((resolve) => {
              const server = net.createServer()
              server.listen(0, "127.0.0.1", () => resolve(server))
            })
          ),
          (server) => Effect.promise(() => new Promise<void>((r) => server.close(() => r()))),
        )
        const port = (taken.address() as net.AddressInfo).port
        const w = yield* launch(sleeper(newSeen()), { env: { HEALTH_CHECK_PORT: String(port) } })
        expect(yield* Fiber.join(w.run)).toBe(2)
        const err = yield* w.proc.err
        expect(err).toHaveLength(1)
        expect(err[0]).toContain(`127.0.0.1:${port}`)
        expect(err[0]).toContain("HEALTH_CHECK_PORT")
      }))

    it.effect("/health fails with TASK_OVERRUN once a handler runs the overrun grace past its deadline", () =>
      Effect.gen(function* () {
        const never = yield* neverUntilTheEnd
        const { entered, worker: stuck } = refusing("stuck", "10 seconds", never)
        const w = yield* launch(stuck, { env: { WORKER_TASK_OVERRUN_GRACE_S: "30" } })
        yield* w.started
        const port = probePort(w.logs)
        yield* w.submit("t-stuck", 1)
        yield* waitUntil(() => entered.length === 1, "the task runs")
        yield* TestClock.adjust("39 seconds")
        expect((yield* get(port, "/health")).status).toBe(200)
        yield* TestClock.adjust("1001 millis")
        const health = yield* get(port, "/health")
        expect(health.status).toBe(503)
        expect(health.body.error.code).toBe("TASK_OVERRUN")
        expect(health.body.error.message).toContain("t-stuck")
      }))

    it.effect("/ready names the broker's node while connected, and says why not while the connection is blocked, stalled or lost; the connection's metrics follow", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connected")
        const node = "amqp://guest:***@node-2:5672/v"
        // A registry of its own: the file's other workers (one whose handler refuses to end
        // among them) count their connections in the global one.
        const registry: Metric.MetricRegistry = new Map()
        const w = yield* launch(sleeper(newSeen()), {
          transport: (broker) =>
            memoryTransport(broker, (inner) => ({ ...inner, status, node: Effect.succeed(node) })),
        }).pipe(Effect.provideService(Metric.MetricRegistry, registry))
        yield* w.started
        const port = probePort(w.logs)
        const metrics = Effect.promise(async () =>
          (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
        )
        const sample = (text: string, series: string) =>
          Number(text.split("\n").find((l) => l.startsWith(`${series} `))?.split(" ")[1])
        const broker = Effect.map(
          get(port, "/ready"),
          (r) => r.status === 200 ? r.body.components.broker : r.body.error.components.broker,
        )
        expect(yield* broker).toEqual({ status: "ok", detail: node })
        expect(sample(yield* metrics, "worker_broker_reconnects_total")).toBe(0)
        const said = {
          blocked: `the broker connection to ${node} is blocked by a resource alarm of the broker`,
          stalled: `the broker connection to ${node} is stalled: a heartbeat is overdue`,
          disconnected: `the broker connection to ${node} is lost: reconnecting`,
        } as const
        // Each state in turn, the reconnects counted so far after it: a connection up again after a
        // loss is one, whatever its state; a stall or an alarm that ends is none.
        const steps = [
          ["blocked", 0],
          ["connected", 0],
          ["stalled", 0],
          ["connected", 0],
          ["disconnected", 0],
          ["blocked", 1],
          ["stalled", 1],
          ["disconnected", 1],
          ["connected", 2],
        ] as const
        for (const [state, counted] of steps) {
          yield* SubscriptionRef.set(status, state)
          yield* settle(5)
          expect(yield* broker).toEqual(
            state === "connected"
              ? { status: "ok", detail: node }
              : { status: "error", message: said[state] },
          )
          const text = yield* metrics
          for (const other of ["connected", "blocked", "stalled", "disconnected"]) {
            expect(sample(text, `worker_broker_connection{state="${other}"}`), other).toBe(
              other === state ? 1 : 0,
            )
          }
          expect(sample(text, "worker_broker_reconnects_total")).toBe(counted)
        }
        yield* w.signal()
        expect(yield* Fiber.join(w.run)).toBe(0)
      }))

    it.effect("/ready lists the worker's own probes beside broker and draining, and fails while draining", () =>
      Effect.gen(function* () {
        let databaseUp = true
        const seen = newSeen()
        const worker = sleeper(seen, {
          readiness: {
            database: () => {
              if (!databaseUp) throw new ProbeError({ message: "the database is down" })
            },
          },
        })
        const w = yield* launch(worker)
        yield* w.started
        const port = probePort(w.logs)
        const ready = yield* get(port, "/ready")
        expect(ready).toEqual({
          status: 200,
          body: {
            status: "ok",
            components: {
              broker: { status: "ok" },
              draining: { status: "ok" },
              database: { status: "ok" },
            },
          },
        })
        databaseUp = false
        const down = yield* get(port, "/ready")
        expect(down.status).toBe(503)
        expect(down.body.error.code).toBe("DEPENDENCIES_NOT_READY")
        expect(down.body.error.components.database).toEqual({
          status: "error",
          message: "the database is down",
        })
        databaseUp = true
        yield* w.submit("t-long", 5)
        yield* waitUntil(() => seen.entered.includes("t-long"), "the task runs")
        yield* w.signal()
        yield* waitUntil(
          () => w.logs.lines.some((l) => l.message.includes("received: shutting down")),
          "the drain begins",
        )
        const draining = yield* get(port, "/ready")
        expect(draining.status).toBe(503)
        expect(draining.body.error.components.draining.status).toBe("error")
        expect((yield* get(port, "/health")).status).toBe(200)
        yield* TestClock.adjust("5 seconds")
        expect(yield* Fiber.join(w.run)).toBe(0)
      }))
  })

  describe("settings", () => {
    it.effect("invalid settings: exit 2 and one line on stderr listing every problem", () =>
      Effect.gen(function* () {
        const w = yield* launch(sleeper(newSeen()), {
          env: {
            WORKER_CONCURRENCY: "many",
            WORKER_MODE: "batch",
            WORKER_JOB_MAX_TASKS: "0",
            WORKER_SHUTDOWN_GRACE_S: "-1",
          },
          settings: { shutdownGrace: undefined },
        })
        expect(yield* Fiber.join(w.run)).toBe(2)
        const err = yield* w.proc.err
        expect(err).toHaveLength(1)
        expect(err[0]).not.toContain("\n")
        expect(err[0]!.startsWith("Invalid worker settings: ")).toBe(true)
        for (
          const key of [
            "WORKER_CONCURRENCY",
            "WORKER_MODE",
            "WORKER_JOB_MAX_TASKS",
            "WORKER_SHUTDOWN_GRACE_S",
          ]
        ) {
          expect(err[0]).toContain(key)
        }
        expect(yield* w.proc.out).toEqual([])
      }))

    it.effect("amqp without BROKER_URL: exit 2, saying so", () =>
      Effect.gen(function* () {
        const proc = yield* Process.makeTest()
        const code = yield* Lifecycle.run(sleeper(newSeen())).pipe(
          Effect.provideService(Process.Process, proc.process),
          environment({}),
        )
        expect(code).toBe(2)
        const err = yield* proc.err
        expect(err).toHaveLength(1)
        expect(err[0]).toContain("BROKER_URL is not set")
        expect(err[0]).not.toContain("\n")
        // A script takes no --memory, only the CLI does.
        expect(err[0]).toMatch(/or run on the embedded broker with WORKER_TRANSPORT=memory$/)
        expect(err[0]).not.toContain("--memory")
      }).pipe(Effect.scoped))

    it.effect("job mode runs one task at a time, whatever the concurrency", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const w = yield* launch(sleeper(seen), {
          env: { WORKER_MODE: "job", WORKER_CONCURRENCY: "4", WORKER_JOB_MAX_TASKS: "2" },
        })
        yield* w.submit("t-1", 10)
        yield* w.submit("t-2", 10)
        yield* waitUntil(() => seen.entered.length === 1, "the first task runs")
        // One in hand, the other still waiting in the queue: the prefetch is 1.
        expect(yield* w.unacked).toBe(1)
        expect(yield* w.ready).toBe(1)
        yield* TestClock.adjust("10 seconds")
        yield* waitUntil(() => seen.entered.length === 2, "the second task runs")
        expect(seen.entered).toEqual(["t-1", "t-2"])
        yield* TestClock.adjust("10 seconds")
        expect(yield* Fiber.join(w.run)).toBe(0)
      }))
  })

  describe("SIGTERM", () => {
    it.effect("with nothing in flight: exit 0 at once", () =>
      Effect.gen(function* () {
        const w = yield* launch(sleeper(newSeen()))
        yield* w.started
        yield* w.signal("SIGTERM")
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(w.logs.lines.some((l) => l.message === "SIGTERM received: shutting down")).toBe(
          true,
        )
      }))

    it.effect("each change of the worker's state is logged at DEBUG, in order", () =>
      Effect.gen(function* () {
        const w = yield* launch(sleeper(newSeen()), { settings: { logLevel: "Debug" } })
        yield* w.started
        yield* w.signal("SIGTERM")
        expect(yield* Fiber.join(w.run)).toBe(0)
        const moves = w.logs.lines.filter((l) => l.message.startsWith("The worker's state: "))
        expect(moves.map((l) => [l.level, l.message])).toEqual([
          ["Debug", "The worker's state: Starting → Running"],
          ["Debug", "The worker's state: Running → Draining"],
        ])
      }))

    it.effect("SIGINT stops the worker the same way", () =>
      Effect.gen(function* () {
        const w = yield* launch(sleeper(newSeen()))
        yield* w.started
        yield* w.signal("SIGINT")
        expect(yield* Fiber.join(w.run)).toBe(0)
      }))

    it.effect("a task that finishes within the grace: its success published, acked, exit 0", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const w = yield* launch(sleeper(seen))
        yield* w.started
        yield* w.submit("t-1", 4)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* w.signal()
        yield* TestClock.adjust("3999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(yield* w.published("t-1")).toEqual(["started", "success"])
        expect(seen.interrupted).toEqual([])
        expect(yield* w.unacked).toBe(0)
        expect(yield* w.ready).toBe(0)
        expect(w.logs.settled("t-1").map((l) => l.annotations.outcome)).toEqual(["success"])
      }))

    it.effect("a task that does not finish within the grace is requeued, exit 0", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const w = yield* launch(sleeper(seen))
        yield* w.started
        yield* w.submit("t-slow", 60)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* w.signal()
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        expect(seen.interrupted).toEqual([])
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(seen.interrupted).toEqual(["t-slow"])
        expect(yield* w.published("t-slow")).toEqual(["started"])
        expect(w.logs.settled("t-slow").map((l) => l.annotations.outcome)).toEqual([
          "shutdown_requeued",
        ])
        // Back in the queue for another worker.
        expect(yield* w.ready).toBe(1)
        expect(yield* w.unacked).toBe(0)
      }))

    it.effect("a second signal skips the rest of the grace", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const w = yield* launch(sleeper(seen))
        yield* w.started
        yield* w.submit("t-slow", 60)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* w.signal("SIGTERM")
        yield* TestClock.adjust("3 seconds")
        expect(yield* isDone(w.run)).toBe(false)
        yield* w.signal("SIGINT")
        // No more time passes: the second signal alone ends the grace.
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(seen.interrupted).toEqual(["t-slow"])
        expect(yield* w.ready).toBe(1)
        expect(
          w.logs.lines.some((l) =>
            l.level === "Warn" && l.message.startsWith("SIGINT received again")
          ),
        ).toBe(true)
      }))
  })

  describe("the shutdown bound", () => {
    it.effect(
      "a handler that refuses to be interrupted and a transport that never closes: exit 1 at the bound, not before",
      () =>
        Effect.gen(function* () {
          const never = yield* neverUntilTheEnd
          const { entered, worker: stubborn } = refusing("stubborn", "5 minutes", never)
          const w = yield* launch(stubborn, {
            transport: neverClosing(never, (inner) =>
              Transport.of({
                ...inner,
                stopIntake: Effect.uninterruptible(Deferred.await(never)),
              })),
          })
          yield* w.started
          yield* w.submit("t-stuck", 1)
          yield* waitUntil(() => entered.length === 1, "the task runs")
          yield* w.signal()
          // grace 10 s: the bound is 27 s after the signal.
          yield* TestClock.adjust("26999 millis")
          expect(yield* isDone(w.run)).toBe(false)
          yield* TestClock.adjust("1 millis")
          expect(yield* Fiber.join(w.run)).toBe(1)
          expect(errors(w.logs).some((m) => m.includes("did not end within 27s"))).toBe(true)
        }),
    )

    it.effect("a connection that never closes: the hooks have run, exit 1 at the bound", () =>
      Effect.gen(function* () {
        const never = yield* neverUntilTheEnd
        const seen = newSeen()
        const w = yield* launch(
          sleeper(seen, { onShutdown: () => void seen.events.push("shutdown") }),
          { settings: { shutdownGrace: "2 seconds" }, transport: neverClosing(never) },
        )
        yield* w.started
        yield* w.submit("t-1", 1)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* w.signal()
        yield* TestClock.adjust("1 second")
        yield* waitUntil(() => seen.events.includes("shutdown"), "the shutdown hook runs")
        expect(yield* w.published("t-1")).toEqual(["started", "success"])
        // A grace under 5 s: the bound is 5 + 17 = 22 s.
        yield* TestClock.adjust("20999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(1)
      }))

    it.effect("a handler that refuses to be interrupted, alone: exit 1 at the bound", () =>
      Effect.gen(function* () {
        const never = yield* neverUntilTheEnd
        const { entered, worker: stubborn } = refusing("stubborn", "5 minutes", never)
        const w = yield* launch(stubborn, { settings: { shutdownGrace: "30 seconds" } })
        yield* w.started
        yield* w.submit("t-stuck", 1)
        yield* waitUntil(() => entered.length === 1, "the task runs")
        yield* w.signal()
        yield* TestClock.adjust("46999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(1)
      }))

    const ignoring = (release: { resolve?: () => void }) =>
      Worker.make({
        name: "ignoring",
        input: Seconds,
        output: Slept,
        timeout: "5 minutes",
        // Never looks at ctx.signal.
        handler: () =>
          new Promise<{ slept: number }>((resolve) => {
            release.resolve = () => resolve({ slept: 0 })
          }),
      })

    it.effect(
      "an async handler that ignores its AbortSignal: an ERROR line names its task, exit 1 at the bound",
      () =>
        Effect.gen(function* () {
          const release: { resolve?: () => void } = {}
          yield* Effect.addFinalizer(() => Effect.sync(() => release.resolve?.()))
          const w = yield* launch(ignoring(release))
          yield* w.started
          yield* w.submit("t-deaf", 1)
          yield* waitUntil(() => release.resolve !== undefined, "the handler runs")
          yield* w.signal()
          yield* TestClock.adjust("10 seconds")
          // The grace is over: the task is requeued, but its Promise is still pending.
          yield* waitUntil(
            () => w.logs.lines.some((l) => l.level === "Error" && l.message.includes("t-deaf")),
            "the handler is reported",
          )
          const line = w.logs.lines.find((l) =>
            l.level === "Error" && l.message.includes("t-deaf")
          )!
          expect(line.message).toContain("ignored its AbortSignal")
          expect(line.annotations.task_id).toBe("t-deaf")
          expect(w.logs.settled("t-deaf").map((l) => l.annotations.outcome)).toEqual([
            "shutdown_requeued",
          ])
          expect(yield* w.ready).toBe(1)
          yield* TestClock.adjust("16999 millis")
          expect(yield* isDone(w.run)).toBe(false)
          yield* TestClock.adjust("1 millis")
          expect(yield* Fiber.join(w.run)).toBe(1)
        }),
    )

    it.effect("an async handler that settles late, but before the bound: exit 0", () =>
      Effect.gen(function* () {
        const release: { resolve?: () => void } = {}
        const w = yield* launch(ignoring(release))
        yield* w.started
        yield* w.submit("t-late", 1)
        yield* waitUntil(() => release.resolve !== undefined, "the handler runs")
        yield* w.signal()
        yield* TestClock.adjust("20 seconds")
        yield* waitUntil(
          () => w.logs.lines.some((l) => l.level === "Error" && l.message.includes("t-late")),
          "the handler is reported",
        )
        expect(yield* isDone(w.run)).toBe(false)
        release.resolve!()
        expect(yield* Fiber.join(w.run)).toBe(0)
        // Requeued all the same: its result came after the task was given back.
        expect(yield* w.published("t-late")).toEqual(["started"])
      }))
  })

  describe("the transport", () => {
    const failing = (reason: TransportError["reason"]) => () =>
      Layer.effect(
        Transport,
        Effect.fail(new TransportError({ reason, message: `The broker said no (${reason}).` })),
      )

    it.effect("refused credentials or a conflicting queue: exit 2, no restart mends it", () =>
      Effect.gen(function* () {
        for (const reason of ["access_refused", "precondition_failed"] as const) {
          const w = yield* launch(sleeper(newSeen()), { transport: failing(reason) })
          expect(yield* Fiber.join(w.run)).toBe(2)
        }
      }))

    it.effect("any other failure to start consuming: exit 1", () =>
      Effect.gen(function* () {
        const w = yield* launch(sleeper(newSeen()), { transport: failing("consume") })
        expect(yield* Fiber.join(w.run)).toBe(1)
      }))

    it.effect("a transport that dies while the worker runs: still a shutdown, exit 1", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const broken = yield* Deferred.make<void>()
        const worker = sleeper(seen, { onShutdown: () => void seen.events.push("shutdown") })
        const w = yield* launch(worker, {
          transport: () =>
            Layer.succeed(
              Transport,
              Transport.of({
                take: Effect.andThen(Deferred.await(broken), Effect.die(new Error("a bug"))),
                publish: () => Effect.void,
                setCapacity: () => Effect.void,
                stopIntake: Effect.void,
                status: Effect.runSync(SubscriptionRef.make<ConnectionStatus>("connected")),
              }),
            ),
        })
        yield* w.started
        yield* Deferred.succeed(broken, undefined)
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(seen.events).toEqual(["shutdown"])
      }))

    it.effect("a transport that fails while the worker runs: exit 1", () =>
      Effect.gen(function* () {
        const broken = yield* Deferred.make<void>()
        const w = yield* launch(sleeper(newSeen()), {
          transport: (broker) =>
            memoryTransport(
              broker,
              breaksOn(broken, new TransportError({ reason: "closed", message: "Gone." })),
            ),
        })
        yield* w.started
        yield* Deferred.succeed(broken, undefined)
        expect(yield* Fiber.join(w.run)).toBe(1)
      }))
  })

  describe("startup hooks", () => {
    it.effect("run in order before the first delivery is taken", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const gate = yield* Deferred.make<void>()
        const worker = sleeper(seen, {
          onStartup: [
            Effect.sync(() => seen.events.push("startup 1")).pipe(
              Effect.andThen(Deferred.await(gate)),
            ),
            async () => {
              await Promise.resolve()
              seen.events.push("startup 2")
            },
          ],
        })
        const w = yield* launch(worker)
        yield* w.submit("t-1", 1)
        yield* waitUntil(() => seen.events.length === 1, "the first hook runs")
        // The broker has not been consumed from yet.
        expect(yield* w.ready).toBe(1)
        expect(yield* w.unacked).toBe(0)
        yield* Deferred.succeed(gate, undefined)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        expect(seen.events).toEqual(["startup 1", "startup 2", "handler t-1"])
        yield* TestClock.adjust("1 second")
        yield* w.signal()
        expect(yield* Fiber.join(w.run)).toBe(0)
      }))

    it.effect("a failing startup hook: exit 1, the later hooks and the worker never run", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const worker = sleeper(seen, {
          onStartup: [
            () => {
              throw new Error("the database is down")
            },
            () => void seen.events.push("startup 2"),
          ],
          onShutdown: () => void seen.events.push("shutdown"),
        })
        const w = yield* launch(worker)
        yield* w.submit("t-1", 1)
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(seen.events).toEqual([])
        expect(yield* w.ready).toBe(1)
        expect(errors(w.logs)).toEqual(["A startup hook failed: Error: the database is down"])
      }))

    it.effect("an Effect startup hook that fails: exit 1", () =>
      Effect.gen(function* () {
        const worker = sleeper(newSeen(), {
          onStartup: Effect.fail(new FatalError({ code: "NO_MODEL", message: "No model." })),
        })
        const w = yield* launch(worker)
        expect(yield* Fiber.join(w.run)).toBe(1)
      }))

    it.effect("a startup hook that dies (throws inside an Effect): exit 1", () =>
      Effect.gen(function* () {
        const worker = sleeper(newSeen(), {
          onStartup: Effect.sync(() => {
            throw new Error("a bug")
          }),
        })
        const w = yield* launch(worker)
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(errors(w.logs)).toEqual(["A startup hook failed: Error: a bug"])
      }))

    it.effect(
      "a signal during startup interrupts the hook (its AbortSignal fires), skips the shutdown hooks, exit 0",
      () =>
        Effect.gen(function* () {
          const seen = newSeen()
          let hookSignal: AbortSignal | undefined
          const worker = sleeper(seen, {
            // Waits forever, unless it is told to stop.
            onStartup: (signal) =>
              new Promise<void>((resolve) => {
                hookSignal = signal
                signal.addEventListener("abort", () => resolve())
              }),
            onShutdown: () => void seen.events.push("shutdown"),
          })
          const w = yield* launch(worker)
          yield* w.submit("t-1", 1)
          yield* waitUntil(() => hookSignal !== undefined, "the startup hook runs")
          expect(hookSignal!.aborted).toBe(false)
          yield* w.signal()
          expect(yield* Fiber.join(w.run)).toBe(0)
          expect(hookSignal!.aborted).toBe(true)
          expect(seen.events).toEqual([])
          expect(seen.entered).toEqual([])
          expect(yield* w.ready).toBe(1)
        }),
    )

    it.effect("a signal during an Effect startup hook interrupts it", () =>
      Effect.gen(function* () {
        let started = false
        let interrupted = false
        const worker = sleeper(newSeen(), {
          onStartup: Effect.sync(() => (started = true)).pipe(
            Effect.andThen(Effect.never),
            Effect.onInterrupt(() => Effect.sync(() => (interrupted = true))),
          ),
        })
        const w = yield* launch(worker)
        yield* waitUntil(() => started, "the startup hook runs")
        yield* w.signal()
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(interrupted).toBe(true)
      }))
  })

  describe("shutdown hooks", () => {
    it.effect("run after the drain, in order, exit 0", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const outcomes: Array<ReadonlyArray<string>> = []
        const launched: { w?: Effect.Success<ReturnType<typeof launch>> } = {}
        const worker = sleeper(seen, {
          onShutdown: [
            Effect.gen(function* () {
              outcomes.push(yield* launched.w!.published("t-1"))
              seen.events.push("shutdown 1")
            }),
            async () => {
              await Promise.resolve()
              seen.events.push("shutdown 2")
            },
          ],
        })
        const w = yield* launch(worker)
        launched.w = w
        yield* w.started
        yield* w.submit("t-1", 3)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* w.signal()
        yield* waitUntil(
          () => w.logs.lines.some((l) => l.message.includes("SIGTERM")),
          "the signal is received",
        )
        expect(seen.events).toEqual(["handler t-1"])
        yield* TestClock.adjust("3 seconds")
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(seen.events).toEqual(["handler t-1", "shutdown 1", "shutdown 2"])
        // The first hook ran once the task had concluded.
        expect(outcomes).toEqual([["started", "success"]])
      }))

    it.effect("share one budget: a slow hook is cut when it is spent, the next still runs, exit 1", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const at = (what: string) =>
          Effect.flatMap(
            Clock.currentTimeMillis,
            (now) => Effect.sync(() => seen.events.push(`${what} at ${now}`)),
          )
        const worker = sleeper(seen, {
          onShutdown: [
            at("1 starts").pipe(
              Effect.andThen(Effect.sleep("3 seconds")),
              Effect.andThen(at("1 ends")),
            ),
            at("2 starts").pipe(
              Effect.andThen(Effect.sleep("1 hour")),
              Effect.onInterrupt(() => at("2 is cut")),
            ),
            at("3 starts"),
          ],
        })
        const w = yield* launch(worker, { settings: { shutdownHooksTimeout: "5 seconds" } })
        yield* w.started
        yield* w.signal()
        yield* TestClock.adjust("4999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(seen.events).toEqual([
          "1 starts at 0",
          "1 ends at 3000",
          "2 starts at 3000",
          "2 is cut at 5000",
          "3 starts at 5000",
        ])
        expect(errors(w.logs)).toEqual([
          "Shutdown hook 2 did not finish within the shutdown hooks' time (5s)",
        ])
      }))

    it.effect("a first hook that never ends is cut at the budget, the next one still runs, exit 1", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        let hookSignal: AbortSignal | undefined
        const worker = sleeper(seen, {
          onShutdown: [
            (signal) =>
              new Promise<void>(() => {
                hookSignal = signal
              }),
            () => void seen.events.push("shutdown 2"),
          ],
        })
        const w = yield* launch(worker, { settings: { shutdownHooksTimeout: "2 seconds" } })
        yield* w.started
        yield* w.signal()
        yield* waitUntil(() => hookSignal !== undefined, "the first hook runs")
        yield* TestClock.adjust("1999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        expect(hookSignal!.aborted).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(hookSignal!.aborted).toBe(true)
        expect(seen.events).toEqual(["shutdown 2"])
      }))

    it.effect("a hook that refuses to be interrupted is left behind at the budget, exit 1", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const never = yield* neverUntilTheEnd
        const worker = sleeper(seen, {
          onShutdown: [
            Effect.uninterruptible(Deferred.await(never)),
            () => void seen.events.push("shutdown 2"),
          ],
        })
        const w = yield* launch(worker, { settings: { shutdownHooksTimeout: "5 seconds" } })
        yield* w.started
        yield* w.signal()
        yield* TestClock.adjust("4999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        // Not at the shutdown bound (27 s): the next hook ran when the budget was spent.
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(seen.events).toEqual(["shutdown 2"])
      }))

    it.effect("a hook that dies: the next still runs, the worker is closed, exit 1", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const worker = sleeper(seen, {
          onShutdown: [
            Effect.sync(() => {
              throw new Error("a bug")
            }),
            () => void seen.events.push("shutdown 2"),
          ],
        })
        const w = yield* launch(worker)
        yield* w.started
        yield* w.submit("t-1", 1)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* w.signal()
        yield* TestClock.adjust("1 second")
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(seen.events).toEqual(["handler t-1", "shutdown 2"])
        expect(errors(w.logs)).toEqual(["Shutdown hook 1 failed: Error: a bug"])
        expect(yield* w.published("t-1")).toEqual(["started", "success"])
      }))

    it.effect("a failing hook: the next still runs, exit 1", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const worker = sleeper(seen, {
          onShutdown: [
            () => Promise.reject(new Error("flush failed")),
            () => void seen.events.push("shutdown 2"),
          ],
        })
        const w = yield* launch(worker)
        yield* w.started
        yield* w.signal()
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(seen.events).toEqual(["shutdown 2"])
        expect(errors(w.logs)).toEqual(["Shutdown hook 1 failed: Error: flush failed"])
      }))
  })

  describe("job mode", () => {
    const job = (env: Record<string, string> = {}) => ({
      env: { WORKER_MODE: "job", ...env },
    })

    it.effect(
      "stops intake after WORKER_JOB_MAX_TASKS deliveries (a poison message counts), finishes them, exit 0",
      () =>
        Effect.gen(function* () {
          const seen = newSeen()
          const w = yield* launch(sleeper(seen), job({ WORKER_JOB_MAX_TASKS: "2" }))
          yield* w.submit("t-1", 5)
          yield* w.broker.publish("sleeper_queue_in", "not json").pipe(Effect.orDie)
          yield* w.submit("t-3", 5)
          yield* w.submit("t-4", 5)
          yield* waitUntil(() => seen.entered.length === 1, "the first task runs")
          yield* TestClock.adjust("5 seconds")
          expect(yield* Fiber.join(w.run)).toBe(0)
          expect(seen.entered).toEqual(["t-1"])
          expect(yield* w.published("t-1")).toEqual(["started", "success"])
          expect(w.logs.lines.filter((l) => l.annotations.outcome === "poison")).toHaveLength(1)
          // The rest stay queued for the next job.
          expect(yield* w.ready).toBe(2)
          expect(yield* w.unacked).toBe(0)
        }),
    )

    it.effect("exits 0 after WORKER_JOB_IDLE_TIMEOUT_S with nothing in hand", () =>
      Effect.gen(function* () {
        const w = yield* launch(sleeper(newSeen()), job({ WORKER_JOB_IDLE_TIMEOUT_S: "10" }))
        yield* w.started
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(0)
      }))

    it.effect("is not idle while a task runs: the idle time counts from its end", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        const w = yield* launch(
          sleeper(seen),
          job({ WORKER_JOB_IDLE_TIMEOUT_S: "10", WORKER_JOB_MAX_TASKS: "5" }),
        )
        yield* w.started
        yield* w.submit("t-long", 20)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* TestClock.adjust("20 seconds")
        yield* waitUntil(
          () => Effect.map(w.published("t-long"), (types) => types.includes("success")),
          "the task concludes",
        )
        // Idle since 20 s: not done before 30 s.
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("251 millis")
        expect(yield* Fiber.join(w.run)).toBe(0)
      }))

    /** A transport that is never (or not for long) connected; intake ends when it is stopped. */
    const unreachable = (status: SubscriptionRef.SubscriptionRef<ConnectionStatus>) =>
      Layer.effect(
        Transport,
        Effect.gen(function* () {
          const stopped = yield* Deferred.make<void>()
          return Transport.of({
            take: Effect.as(Deferred.await(stopped), Option.none()),
            publish: () => Effect.never,
            setCapacity: () => Effect.void,
            stopIntake: Deferred.succeed(stopped, undefined),
            status,
          })
        }),
      )

    it.effect("a broker never reached: exit 1 after WORKER_JOB_CONNECT_TIMEOUT_S", () =>
      Effect.gen(function* () {
        const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
        const w = yield* launch(sleeper(newSeen()), {
          ...job({ WORKER_JOB_CONNECT_TIMEOUT_S: "10" }),
          transport: () => unreachable(status),
        })
        yield* w.connecting
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(errors(w.logs)).toEqual(["The broker stayed unreachable for 10s: giving up"])
      }))

    /** A job on a transport whose status the test sets, connecting, out of reach after 10 s. */
    const reaching = Effect.gen(function* () {
      const status = yield* SubscriptionRef.make<ConnectionStatus>("connecting")
      const w = yield* launch(sleeper(newSeen()), {
        ...job({ WORKER_JOB_CONNECT_TIMEOUT_S: "10", WORKER_JOB_IDLE_TIMEOUT_S: "600" }),
        transport: () => unreachable(status),
      })
      yield* w.connecting
      return { status, w }
    })

    it.effect("a connection within the timeout resets it", () =>
      Effect.gen(function* () {
        const { status, w } = yield* reaching
        yield* TestClock.adjust("6 seconds")
        yield* SubscriptionRef.set(status, "connected")
        yield* TestClock.adjust("2 seconds")
        yield* SubscriptionRef.set(status, "disconnected")
        // Out of reach again since 8 s: the timeout counts from there.
        yield* TestClock.adjust("9999 millis")
        expect(yield* isDone(w.run)).toBe(false)
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(w.run)).toBe(1)
      }))

    it.effect("a resource alarm or a stall past the timeout is no broker out of reach: the job goes on", () =>
      Effect.gen(function* () {
        const { status, w } = yield* reaching
        // Blocked before the first "connected": the connection is up, and the worker starts.
        yield* SubscriptionRef.set(status, "blocked")
        yield* w.started
        yield* TestClock.adjust("11 seconds")
        yield* SubscriptionRef.set(status, "stalled")
        yield* TestClock.adjust("11 seconds")
        expect(yield* isDone(w.run)).toBe(false)
        yield* SubscriptionRef.set(status, "disconnected")
        yield* TestClock.adjust("10 seconds")
        expect(yield* Fiber.join(w.run)).toBe(1)
      }))

    it.effect("a task that fails still ends the job with exit 0", () =>
      Effect.gen(function* () {
        const failing = Worker.make({
          name: "failing",
          input: Seconds,
          output: Slept,
          timeout: "1 minute",
          handler: () => Effect.fail(new FatalError({ code: "NOPE", message: "No." })),
        })
        const w = yield* launch(failing, job())
        yield* w.submit("t-1", 0)
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(yield* w.published("t-1")).toEqual(["started", "failure"])
        expect(yield* w.ready).toBe(0)
      }))

    it.effect("a task the broker takes back before the job settles it ends the job with exit 1", () =>
      Effect.gen(function* () {
        const seen = newSeen()
        // The job's connection, which the test loses while the task runs.
        const connection = yield* Scope.make()
        const w = yield* launch(sleeper(seen), {
          ...job(),
          transport: (broker) =>
            Layer.effect(
              Transport,
              Effect.flatMap(Settings.Settings, (s) =>
                broker.transport({ inQueue: s.inQueue, outQueue: s.outQueue, capacity: 1 }).pipe(
                  Scope.provide(connection),
                )),
            ),
        })
        yield* w.submit("t-1", 60)
        yield* waitUntil(() => seen.entered.length === 1, "the task runs")
        yield* Scope.close(connection, Exit.void)
        expect(yield* Fiber.join(w.run)).toBe(1)
        expect(seen.interrupted).toEqual(["t-1"])
        expect(yield* w.published("t-1")).toEqual(["started"])
        expect(w.logs.settled("t-1").map((l) => l.annotations.outcome)).toEqual(["cancelled"])
        expect(errors(w.logs)).toEqual([
          "The broker took back 1 task of this job before it settled it (a connection or lease " +
          "lost): its result was thrown away, and it runs again",
        ])
        // Back in the queue, for another job.
        expect(yield* w.ready).toBe(1)
      }))

    it.effect("a task requeued for a retry still ends the job with exit 0", () =>
      Effect.gen(function* () {
        const retrying = Worker.make({
          name: "retrying",
          input: Seconds,
          output: Slept,
          timeout: "1 minute",
          handler: () => Effect.fail(new RetryableError({ code: "LATER", message: "Later." })),
        })
        const w = yield* launch(retrying, {
          ...job(),
          settings: { retryBackoffBase: 0, retryBackoffMax: 0 },
        })
        yield* w.submit("t-1", 0)
        expect(yield* Fiber.join(w.run)).toBe(0)
        expect(w.logs.settled("t-1").map((l) => l.annotations.outcome)).toEqual(["retry"])
        expect(yield* w.ready).toBe(1)
      }))
  })

  describe("start", () => {
    it.effect("its state: Running once started, Draining once its scope closes", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make({ reapInterval: "1 hour" })
        const scope = yield* Scope.make()
        const started = yield* Lifecycle.make(sleeper(newSeen()), {
          transport: memoryTransport(broker),
        }).pipe(Scope.provide(scope), environment())
        expect(yield* started.state).toEqual(Lifecycle.LifecycleState.Running())
        yield* Scope.close(scope, Exit.void)
        expect(yield* started.state).toEqual(Lifecycle.LifecycleState.Draining())
      }))

    it.effect("a transport that fails after the start: said, and the state Failed with its error", () =>
      Effect.gen(function* () {
        const broker = yield* MemoryBroker.make({ reapInterval: "1 hour" })
        const broken = yield* Deferred.make<void>()
        const gone = new TransportError({ reason: "closed", message: "Gone." })
        const logs = captureLogs()
        const started = yield* Lifecycle.make(sleeper(newSeen()), {
          transport: memoryTransport(broker, breaksOn(broken, gone)),
        }).pipe(environment(), Effect.provide(logs.layer))
        yield* Deferred.succeed(broken, undefined)
        yield* waitUntil(
          () => Effect.map(started.state, (state) => state._tag === "Failed"),
          "the worker fails",
        )
        expect(yield* started.state).toEqual(Lifecycle.LifecycleState.Failed({ error: gone }))
        // One line: the failure is data, reported once by the life (no stack: it is not a bug).
        expect(errors(logs)).toEqual(["The worker stopped: Gone."])
      }))
  })

  describe("the embedded broker (WORKER_TRANSPORT=memory)", () => {
    it.effect("runs each line of standard input as a task, prints what is published, exit 0", () =>
      Effect.gen(function* () {
        const proc = yield* Process.makeTest({
          stdinLines: Stream.make(
            '{"seconds":0}',
            "",
            '{"task_id":"t-2","data":{"body":{"seconds":0}}}',
          ),
        })
        const run = yield* Lifecycle.run(sleeper(newSeen()), { settings: { transport: "memory" } })
          .pipe(
            Effect.provideService(Process.Process, proc.process),
            environment({}),
            Effect.forkChild,
          )
        for (let i = 0; i < 50 && !(yield* isDone(run)); i++) {
          yield* TestClock.adjust("20 millis")
        }
        expect(yield* Fiber.join(run)).toBe(0)
        const out = (yield* proc.out).map((line) => JSON.parse(line) as WireMessage)
        expect(out.map((m) => `${m.task_id} ${m.data.message_type}`)).toEqual([
          "local-1 started",
          "local-1 success",
          "t-2 started",
          "t-2 success",
        ])
      }))
  })
})
