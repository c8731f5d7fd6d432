/**
 * The `async-task-worker` CLI as a real process on the real RabbitMQ (issue 4): signals, the
 * bounded drain, exit codes and job mode. `cliSuite` defines the cases for one runtime; the
 * files `cli.node.test.ts` and `cli.deno.test.ts` call it, so that vitest runs the two runtimes
 * in parallel. Workers are the fixtures in `test/fixtures/cli/`, which import the SDK from
 * `WORKER_SDK` so that the CLI and the worker share one copy of it.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, readdirSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import process from "node:process"
import { afterAll, beforeAll, describe, it, type TestContext } from "vitest"
import {
  baseEnv,
  checkBuild,
  denoBinary,
  ROOT,
  type Runtime,
  runtimeSpec,
} from "../support/runtimes.ts"
import {
  declaredQueues,
  ensureVhosts,
  platform,
  QUORUM_VHOST,
  uniqueName,
  urlFor,
} from "./broker.ts"
import { sleep } from "../support/waits.ts"

const FIXTURES = join(ROOT, "test/fixtures/cli")
const WORKERS = join(FIXTURES, "workers.mjs")

interface Exited {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  /** `Date.now()` when the process ended. */
  readonly at: number
}

/** A CLI process: what it printed so far, its end, and ways to wait on either. */
interface CliProcess {
  readonly child: ChildProcess
  readonly stdout: () => string
  readonly stderr: () => string
  readonly exited: Promise<Exited>
  /** Whether it has not ended yet. */
  readonly running: () => boolean
  /** Sends `signal`; returns `Date.now()` at the moment it was sent. */
  readonly kill: (signal?: NodeJS.Signals) => number
  /** Waits until `pattern` is in standard output or error, within `ms`. */
  readonly waitFor: (pattern: string | RegExp, ms?: number) => Promise<void>
  /** Waits for the end, within `ms`: fails (and kills the process) past it. */
  readonly waitExit: (ms: number) => Promise<Exited>
}

const live = new Set<ChildProcess>()

/** A port on 127.0.0.1 where nothing listens (bound, then released). */
const deadPort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resolve(port))
    })
  })

const start = (
  runtime: Runtime,
  target: string,
  env: Record<string, string>,
): CliProcess => {
  const spec = runtimeSpec(runtime)
  const child = spawn(spec.command, [...spec.args, "run", target], {
    cwd: ROOT,
    env: {
      ...baseEnv(),
      WORKER_SDK: spec.sdk,
      HOSTNAME: "cli-test-host",
      HEALTH_CHECK_HOST: "127.0.0.1",
      HEALTH_CHECK_PORT: "0",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  })
  live.add(child)
  let stdout = ""
  let stderr = ""
  const listeners = new Set<() => void>()
  const changed = () => listeners.forEach((f) => f())
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk
    changed()
  })
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk
    changed()
  })
  const exited = new Promise<Exited>((resolve, reject) => {
    child.once("error", reject)
    // `close`, not `exit`: the output has been read to its end.
    child.once("close", (code, signal) => {
      live.delete(child)
      resolve({ code, signal, at: Date.now() })
      changed()
    })
  })
  exited.catch(() => undefined)
  const output = () =>
    `\n--- stdout ---\n${stdout.slice(-4000)}\n--- stderr ---\n${stderr.slice(-4000)}`
  const waitFor = (pattern: string | RegExp, ms = 30_000) =>
    new Promise<void>((resolve, reject) => {
      const check = () => {
        const text = stdout + stderr
        if (typeof pattern === "string" ? text.includes(pattern) : pattern.test(text)) {
          done()
          resolve()
        } else if (!live.has(child)) {
          done()
          reject(new Error(`the worker ended before printing ${String(pattern)}${output()}`))
        }
      }
      const timer = setTimeout(() => {
        done()
        reject(new Error(`the worker did not print ${String(pattern)} within ${ms} ms${output()}`))
      }, ms)
      const done = () => {
        clearTimeout(timer)
        listeners.delete(check)
      }
      listeners.add(check)
      check()
    })
  const waitExit = async (ms: number) => {
    let timer: ReturnType<typeof setTimeout> | undefined
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        child.kill("SIGKILL")
        reject(new Error(`the worker did not exit within ${ms} ms${output()}`))
      }, ms)
    })
    try {
      return await Promise.race([exited, late])
    } finally {
      clearTimeout(timer)
    }
  }
  return {
    child,
    stdout: () => stdout,
    stderr: () => stderr,
    exited,
    running: () => live.has(child),
    kill: (signal = "SIGTERM") => {
      const at = Date.now()
      // `process.kill`, not `child.kill`: under Deno (the suite run by vitest on Deno), a child
      // sent a signal with `child.kill` is reported ended by that signal, whatever its exit code.
      if (live.has(child) && child.pid !== undefined) process.kill(child.pid, signal)
      return at
    },
    waitFor,
    waitExit,
  }
}

/** One test's queues on the quorum vhost, declared as the worker declares them, and removed after. */
const queues = async () => {
  const broker = await platform(QUORUM_VHOST)
  // Declared now: the job cases publish before the worker starts.
  const { inQueue, outQueue } = await declaredQueues(broker, "cli")
  return {
    broker,
    inQueue,
    outQueue,
    env: {
      BROKER_URL: urlFor(QUORUM_VHOST),
      IN_QUEUE_NAME: inQueue,
      OUT_QUEUE_NAME: outQueue,
    } as Record<string, string>,
    /** The input queue's ready messages once the broker has let go of the worker. */
    settledCount: () => broker.leftover(inQueue),
    publish: async (taskId: string, text: string) => {
      broker.publish(inQueue, broker.envelope(taskId, { text }))
      await broker.confirmed()
    },
    cleanup: async () => {
      await broker.remove(inQueue, outQueue)
      await broker.close()
    },
  }
}

type Queues = Awaited<ReturnType<typeof queues>>

const typeOf = (text: string): string | undefined =>
  (JSON.parse(text) as { data?: { message_type?: string } }).data?.message_type

/** Standard output as the JSON lines it must be, one object per line. */
const records = (stdout: string): Array<Record<string, unknown>> =>
  stdout.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line))

/** The decision lines of one task. */
const settled = (stdout: string, taskId: string) =>
  records(stdout).filter((r) =>
    r.task_id === taskId && String(r.msg).startsWith("Delivery settled:")
  )

const STARTED = /Worker cli-fixture started in (service|job) mode/
/** Before it is connected: where it connects, the password left out. */
const CONNECTING =
  /Worker cli-fixture connecting to (amqp:\/\/guest:\*\*\*@[^ ]+|the embedded broker) \((service|job) mode/

/** Stops `worker` if it still runs: SIGKILL, then its end, within 5 s. */
const stop = async (worker: CliProcess): Promise<void> => {
  if (!live.has(worker.child)) return
  worker.child.kill("SIGKILL")
  await Promise.race([worker.exited.catch(() => undefined), sleep(5_000)])
}

/**
 * Defines every case for `runtime`. The cases run concurrently (most of their time is spent
 * waiting on a process): each has its own queues and processes, released when it finishes.
 */
export const cliSuite = (runtime: Runtime): void => {
  describe.concurrent(`async-task-worker on ${runtime}`, () => suite(runtime))
}

const suite = (runtime: Runtime): void => {
  /** A test's means, cleaned up when it finishes, whether it passed or not. */
  const using = ({ onTestFinished }: TestContext) => ({
    run: (target: string, env: Record<string, string>): CliProcess => {
      const worker = start(runtime, target.startsWith("/") ? target : `${WORKERS}:${target}`, env)
      onTestFinished(() => stop(worker))
      return worker
    },
    queues: async (): Promise<Queues> => {
      const q = await queues()
      onTestFinished(() => q.cleanup().catch(() => undefined))
      return q
    },
  })

  /** The `timed` worker with one task in flight (its `started` published), as a signal finds it. */
  const taskInFlight = async (
    ctx: TestContext,
    taskId: string,
    text: string,
    env: Record<string, string>,
  ) => {
    const { queues: withQueues, run } = using(ctx)
    const q = await withQueues()
    const worker = run("timed", { ...q.env, ...env })
    await worker.waitFor(STARTED)
    await q.publish(taskId, text)
    const started = await q.broker.readUntil(q.outQueue, (all) => all.length >= 1)
    return { q, worker, started }
  }

  beforeAll(() => {
    if (runtime === "node") checkBuild()
    else denoBinary()
    ensureVhosts()
  }, 60_000)

  afterAll(async () => {
    for (const child of live) child.kill("SIGKILL")
    const deadline = Date.now() + 5_000
    while (live.size > 0 && Date.now() < deadline) await sleep(20)
  })

  describe("shutdown", () => {
    it("exits 0 on SIGTERM while idle", async (ctx) => {
      const { expect } = ctx
      const { queues: withQueues, run } = using(ctx)
      const q = await withQueues()
      const worker = run("quick", q.env)
      await worker.waitFor(STARTED)
      // Where it consumes is said, connecting then connected, the password left out.
      const lines = worker.stdout().split("\n").filter((l) => /connecting to|started in/.test(l))
      expect(lines, worker.stdout()).toHaveLength(2)
      expect(lines[0]).toMatch(CONNECTING)
      expect(lines[1]).toMatch(
        /started in service mode on \S+, at amqp:\/\/guest:\*\*\*@127\.0\.0\.1/,
      )
      expect(worker.stdout()).not.toContain("guest:guest")
      const sent = worker.kill("SIGTERM")
      const exited = await worker.waitExit(15_000)
      expect(exited.code, worker.stdout()).toBe(0)
      expect(exited.at - sent, "ms from the signal to the exit").toBeLessThan(10_000)
      expect(worker.stdout()).toContain("SIGTERM received: shutting down")
    }, 60_000)

    it(
      "lets a task in flight finish within the grace period: success published, message acked, exit 0",
      async (ctx) => {
        const { expect } = ctx
        const { q, worker, started } = await taskInFlight(ctx, "t-finishes", "one two three", {
          FIXTURE_TASK_MS: "3000",
          WORKER_SHUTDOWN_GRACE_S: "20",
        })
        expect(started.map((m) => m.text)).toEqual([
          '{"task_id":"t-finishes","data":{"message_type":"started","hostname":"cli-test-host"}}',
        ])
        const sent = worker.kill("SIGTERM")
        const exited = await worker.waitExit(30_000)
        expect(exited.code, worker.stdout()).toBe(0)
        // It waited for the task (3 s), not for the whole grace period (20 s).
        expect(exited.at - sent, "ms from the signal to the exit").toBeLessThan(15_000)
        expect((await q.broker.drain(q.outQueue)).map((m) => m.text)).toEqual([
          '{"task_id":"t-finishes","data":{"message_type":"success","response":{"words":3}}}',
        ])
        expect(await q.settledCount()).toBe(0)
        expect(settled(worker.stdout(), "t-finishes")).toMatchObject([
          { outcome: "success", action: "conclude" },
        ])
      },
      60_000,
    )

    it("requeues a task that does not finish within the grace period and exits 0", async (ctx) => {
      const { expect } = ctx
      const { q, worker } = await taskInFlight(ctx, "t-requeued", "never finishes", {
        FIXTURE_TASK_MS: "120000",
        WORKER_SHUTDOWN_GRACE_S: "1",
      })
      const sent = worker.kill("SIGTERM")
      const exited = await worker.waitExit(30_000)
      expect(exited.code, worker.stdout()).toBe(0)
      expect(exited.at - sent, "ms from the signal to the exit").toBeLessThan(15_000)
      expect(settled(worker.stdout(), "t-requeued")).toMatchObject([
        { outcome: "shutdown_requeued", action: "nack-requeue" },
      ])
      // Nothing terminal was published, and the message is back on the input queue.
      expect(await q.broker.drain(q.outQueue)).toEqual([])
      expect(await q.settledCount()).toBe(1)
    }, 60_000)

    it("skips the rest of a long grace period on a second SIGTERM", async (ctx) => {
      const { expect } = ctx
      const { q, worker } = await taskInFlight(ctx, "t-second-signal", "never finishes", {
        FIXTURE_TASK_MS: "120000",
        WORKER_SHUTDOWN_GRACE_S: "60",
      })
      const sent = worker.kill("SIGTERM")
      await worker.waitFor("SIGTERM received: shutting down", 10_000)
      await sleep(500)
      worker.kill("SIGTERM")
      const exited = await worker.waitExit(30_000)
      expect(exited.code, worker.stdout()).toBe(0)
      // Well before the 60 s grace period (and its 77 s bound).
      expect(exited.at - sent, "ms from the signal to the exit").toBeLessThan(15_000)
      expect(worker.stdout()).toContain("received again: skipping the rest of the grace period")
      expect(settled(worker.stdout(), "t-second-signal")).toMatchObject([
        { outcome: "shutdown_requeued" },
      ])
      expect(await q.settledCount()).toBe(1)
    }, 60_000)

    it(
      "exits 1 at the bound when an async handler ignores its AbortSignal, naming the task",
      async (ctx) => {
        const { expect } = ctx
        const { queues: withQueues, run } = using(ctx)
        const q = await withQueues()
        const worker = run("stubborn", { ...q.env, WORKER_SHUTDOWN_GRACE_S: "0" })
        await worker.waitFor(STARTED)
        await q.publish("t-stubborn", "ignores the signal")
        await worker.waitFor("FIXTURE stubborn t-stubborn")
        const sent = worker.kill("SIGTERM")
        // The bound is max(0, 5) + 17 = 22 s after the signal.
        const exited = await worker.waitExit(40_000)
        const elapsed = exited.at - sent
        expect(exited.code, worker.stdout()).toBe(1)
        expect(elapsed).toBeGreaterThanOrEqual(21_000)
        expect(elapsed).toBeLessThanOrEqual(23_500)
        expect(worker.stdout()).toContain(
          "The handler of task t-stubborn ignored its AbortSignal and is still running",
        )
        expect(worker.stdout()).toContain("The shutdown did not end within 22s")
        expect(await q.settledCount()).toBe(1)
      },
      60_000,
    )
  })

  describe("startup", () => {
    it("exits 0 on SIGTERM while a startup hook waits", async (ctx) => {
      const { expect } = ctx
      const { queues: withQueues, run } = using(ctx)
      const q = await withQueues()
      const worker = run("hangingStartup", q.env)
      await worker.waitFor("FIXTURE startup hook waiting")
      const sent = worker.kill("SIGTERM")
      const exited = await worker.waitExit(15_000)
      expect(exited.code, worker.stdout()).toBe(0)
      expect(exited.at - sent, "ms from the signal to the exit").toBeLessThan(10_000)
      expect(worker.stdout()).toContain("SIGTERM received: shutting down")
      // It never got as far as consuming.
      expect(worker.stdout()).not.toMatch(STARTED)
    }, 60_000)

    it(
      "stays up until SIGTERM while a startup hook awaits a Promise that holds nothing, then exits 0",
      async (ctx) => {
        const { expect } = ctx
        const { queues: withQueues, run } = using(ctx)
        const q = await withQueues()
        const worker = run("foreverStartup", q.env)
        await worker.waitFor("FIXTURE startup hook waiting")
        // Nothing keeps the event loop busy but the lifecycle itself: the process must not end
        // on its own (with 0, having run no shutdown).
        await sleep(1_000)
        expect(worker.running(), `ended on its own${worker.stdout()}`).toBe(true)
        const sent = worker.kill("SIGTERM")
        const exited = await worker.waitExit(15_000)
        expect(exited.code, worker.stdout()).toBe(0)
        expect(exited.at - sent, "ms from the signal to the exit").toBeLessThan(10_000)
        expect(worker.stdout()).toContain("SIGTERM received: shutting down")
      },
      60_000,
    )

    it("exits 0 on SIGTERM while the broker cannot be reached", async (ctx) => {
      const { expect } = ctx
      const { run } = using(ctx)
      const port = await deadPort()
      const worker = run("quick", {
        BROKER_URL: `amqp://guest:guest@127.0.0.1:${port}/`,
        IN_QUEUE_NAME: "cli-unreachable_in",
        OUT_QUEUE_NAME: "cli-unreachable_out",
      })
      await worker.waitFor("Broker connection attempt failed")
      const sent = worker.kill("SIGTERM")
      const exited = await worker.waitExit(20_000)
      expect(exited.code, worker.stdout()).toBe(0)
      expect(exited.at - sent, "ms from the signal to the exit").toBeLessThan(15_000)
    }, 60_000)
  })

  describe("configuration errors exit 2", () => {
    /** Runs `target` to its end and expects exit 2; `oneLine` is its only line on stderr. */
    const configError = async (
      ctx: TestContext,
      target: string,
      env: Record<string, string>,
    ) => {
      const started = Date.now()
      const worker = using(ctx).run(target, env)
      const exited = await worker.waitExit(30_000)
      const output = worker.stdout() + worker.stderr()
      ctx.expect(exited.code, output).toBe(2)
      const lines = worker.stderr().split("\n").filter((l) => l.trim() !== "")
      return {
        output,
        took: exited.at - started,
        oneLine: () => (ctx.expect(lines, output).toHaveLength(1), lines[0]!),
        /** The one ERROR record the transport logs, without a stack: it is not a bug to debug. */
        oneError: () => {
          const errors = records(worker.stdout()).filter((r) => r.level === "ERROR")
          ctx.expect(errors, output).toHaveLength(1)
          ctx.expect(errors[0], output).not.toHaveProperty("error_stack")
          return String(errors[0]!.msg)
        },
      }
    }
    const env = () => {
      const name = uniqueName("cli-config")
      return {
        BROKER_URL: urlFor(QUORUM_VHOST),
        IN_QUEUE_NAME: `${name}_in`,
        OUT_QUEUE_NAME: `${name}_out`,
      }
    }

    it("invalid settings (WORKER_CONCURRENCY=abc): one line on stderr", async (ctx) => {
      const { oneLine } = await configError(ctx, "quick", { ...env(), WORKER_CONCURRENCY: "abc" })
      ctx.expect(oneLine()).toContain("WORKER_CONCURRENCY")
    }, 60_000)

    it("a variable set to nothing (IN_QUEUE_NAME=) is a problem, not the default", async (ctx) => {
      const { oneLine } = await configError(ctx, "quick", { ...env(), IN_QUEUE_NAME: "" })
      ctx.expect(oneLine()).toContain("inQueue (IN_QUEUE_NAME) must not be empty")
    }, 60_000)

    it("a module that cannot be found: one line on stderr", async (ctx) => {
      const { oneLine } = await configError(ctx, join(FIXTURES, "does-not-exist.mjs"), env())
      ctx.expect(oneLine()).toContain("does-not-exist.mjs")
    }, 60_000)

    it.runIf(runtime === "node")(
      "keeps Node's compile cache in the temporary directory, unasked",
      async (ctx) => {
        const tmp = mkdtempSync(join(tmpdir(), "cli-compile-cache-"))
        ctx.onTestFinished(() => rmSync(tmp, { recursive: true, force: true }))
        await configError(ctx, join(FIXTURES, "does-not-exist.mjs"), { ...env(), TMPDIR: tmp })
        // Node keeps a directory of compiled modules per version: the SDK's and Effect's.
        const [cache] = readdirSync(join(tmp, "node-compile-cache"))
        ctx.expect(readdirSync(join(tmp, "node-compile-cache", cache!)).length).toBeGreaterThan(100)
      },
      60_000,
    )

    it("an export that is missing: one line on stderr", async (ctx) => {
      const { oneLine } = await configError(ctx, "nope", env())
      ctx.expect(oneLine()).toContain('no export named "nope"')
    }, 60_000)

    it("a module whose Worker.make throws: one line on stderr", async (ctx) => {
      const { oneLine } = await configError(ctx, join(FIXTURES, "broken.mjs"), env())
      ctx.expect(oneLine()).toContain("The worker needs a name")
    }, 60_000)

    it("BROKER_URL not set: one line on stderr", async (ctx) => {
      const { BROKER_URL: _, ...withoutUrl } = env()
      const { oneLine } = await configError(ctx, "quick", withoutUrl)
      ctx.expect(oneLine()).toContain("BROKER_URL is not set")
    }, 60_000)

    it("credentials the broker refuses, without printing the password", async (ctx) => {
      const password = "wrong-cli-secret"
      const { output, oneError } = await configError(ctx, "quick", {
        ...env(),
        BROKER_URL: urlFor(QUORUM_VHOST, password),
      })
      ctx.expect(output).toContain("The broker refused the credentials")
      ctx.expect(output).not.toContain(password)
      // The broker's reason, quoted as the vhost's is.
      ctx.expect(oneError()).toMatch(
        /The broker refused the credentials of amqp:\/\/guest:\*\*\*@[^ ]+: ACCESS_REFUSED - Login was refused/,
      )
    }, 60_000)

    it("a BROKER_URL that does not parse: one line on stderr, within 10 s", async (ctx) => {
      const { oneLine, took } = await configError(ctx, "quick", {
        ...env(),
        BROKER_URL: "not-a-url",
      })
      ctx.expect(oneLine()).toContain("brokerUrl (BROKER_URL) does not parse")
      ctx.expect(took).toBeLessThan(10_000)
    }, 60_000)

    it("a BROKER_URL that cannot work, without printing the password", async (ctx) => {
      const password = "cli-url-secret"
      const { output, oneLine } = await configError(ctx, "quick", {
        ...env(),
        BROKER_URL: `amqp://guest:${password}@127.0.0.1:0/${QUORUM_VHOST}`,
      })
      ctx.expect(oneLine()).toContain("brokerUrl (BROKER_URL) has port 0")
      ctx.expect(output).not.toContain(password)
    }, 60_000)

    it("a vhost the broker does not know: its reason, within 10 s", async (ctx) => {
      const vhost = uniqueName("no-such-vhost")
      const { oneError, took } = await configError(ctx, "quick", {
        ...env(),
        BROKER_URL: urlFor(vhost),
      })
      ctx.expect(oneError()).toBe(
        `The broker refused the vhost of amqp://guest:***@127.0.0.1:5672/${vhost}: NOT_ALLOWED - vhost ${vhost} not found`,
      )
      ctx.expect(took).toBeLessThan(10_000)
    }, 60_000)
  })

  describe("job mode", () => {
    it("takes WORKER_JOB_MAX_TASKS deliveries, leaves the rest queued, exits 0", async (ctx) => {
      const { expect } = ctx
      const { queues: withQueues, run } = using(ctx)
      const q = await withQueues()
      for (const id of ["t-job-1", "t-job-2", "t-job-3"]) await q.publish(id, "a b")
      const worker = run("quick", {
        ...q.env,
        WORKER_MODE: "job",
        WORKER_JOB_MAX_TASKS: "2",
        WORKER_JOB_IDLE_TIMEOUT_S: "30",
      })
      const exited = await worker.waitExit(30_000)
      expect(exited.code, worker.stdout()).toBe(0)
      const out = await q.broker.drain(q.outQueue)
      expect(out.filter((m) => typeOf(m.text) === "success").map((m) => m.text)).toEqual([
        '{"task_id":"t-job-1","data":{"message_type":"success","response":{"words":2}}}',
        '{"task_id":"t-job-2","data":{"message_type":"success","response":{"words":2}}}',
      ])
      expect(await q.settledCount()).toBe(1)
      expect(q.broker.envelope("t-job-3", { text: "a b" })).toBe(
        (await q.broker.drain(q.inQueue))[0]?.text,
      )
    }, 60_000)

    it("exits 0 when its task failed", async (ctx) => {
      const { expect } = ctx
      const { queues: withQueues, run } = using(ctx)
      const q = await withQueues()
      await q.publish("t-job-failed", "   ")
      const worker = run("quick", { ...q.env, WORKER_MODE: "job", WORKER_JOB_MAX_TASKS: "1" })
      const exited = await worker.waitExit(30_000)
      expect(exited.code, worker.stdout()).toBe(0)
      const out = await q.broker.drain(q.outQueue)
      expect(out.map((m) => m.text).at(-1)).toBe(
        '{"task_id":"t-job-failed","data":{"message_type":"failure","error_message":{"code":"EMPTY_TEXT","message":"There is nothing to count."}}}',
      )
      expect(await q.settledCount()).toBe(0)
    }, 60_000)

    it("exits 0 once idle for WORKER_JOB_IDLE_TIMEOUT_S", async (ctx) => {
      const { expect } = ctx
      const { queues: withQueues, run } = using(ctx)
      const q = await withQueues()
      const worker = run("quick", {
        ...q.env,
        WORKER_MODE: "job",
        WORKER_JOB_MAX_TASKS: "5",
        WORKER_JOB_IDLE_TIMEOUT_S: "1",
      })
      await worker.waitFor(STARTED)
      const since = Date.now()
      const exited = await worker.waitExit(20_000)
      expect(exited.code, worker.stdout()).toBe(0)
      expect(exited.at - since, "ms from start to the exit").toBeLessThan(10_000)
      expect(worker.stdout()).toContain("the job is done")
    }, 60_000)

    // 4 s, above the reconnection backoff's cap (3 s): each failed attempt used to restart the
    // count, so that a job gave up only with a timeout below it.
    it(
      "exits 1 when the broker stays unreachable for WORKER_JOB_CONNECT_TIMEOUT_S",
      async (ctx) => {
        const { expect } = ctx
        const { run } = using(ctx)
        const port = await deadPort()
        const worker = run("quick", {
          BROKER_URL: `amqp://guest:guest@127.0.0.1:${port}/`,
          IN_QUEUE_NAME: "cli-unreachable_in",
          OUT_QUEUE_NAME: "cli-unreachable_out",
          WORKER_MODE: "job",
          WORKER_JOB_CONNECT_TIMEOUT_S: "4",
          WORKER_JOB_IDLE_TIMEOUT_S: "1",
        })
        await worker.waitFor(CONNECTING)
        const since = Date.now()
        const exited = await worker.waitExit(20_000)
        expect(exited.code, worker.stdout()).toBe(1)
        // Within the timeout and 3 s, the bound.
        expect(exited.at - since, "ms from connecting to the exit").toBeLessThan(7_000)
        expect(worker.stdout()).toContain("The broker stayed unreachable for 4s")
      },
      60_000,
    )
  })

  describe("a handler's services", () => {
    it(
      "a service the worker was not given: no terminal message, the task still queued, exit 2 naming it",
      async (ctx) => {
        const { expect } = ctx
        const { queues: withQueues, run } = using(ctx)
        const q = await withQueues()
        const worker = run("needy", q.env)
        await worker.waitFor(STARTED)
        await q.publish("t-needy", "a b")
        const exited = await worker.waitExit(30_000)
        expect(exited.code, worker.stdout()).toBe(2)
        expect(worker.stdout()).toContain(
          'The handler needs the service \\"app/Database\\", which this worker was not given',
        )
        // `started` only: nothing that concludes the task, which is back in the queue.
        expect((await q.broker.drain(q.outQueue)).map((m) => m.type)).toEqual(["started"])
        expect(await q.settledCount()).toBe(1)
      },
      60_000,
    )
  })
}
