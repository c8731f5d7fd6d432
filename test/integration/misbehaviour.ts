/**
 * The misbehaviour matrix (issue 15): whatever a handler returns, throws or passes, the delivery
 * settles with exactly one decision line, one terminal message with the right code, and the
 * worker keeps consuming. The worker is `test/fixtures/misbehaviour/worker.mjs`, run by the
 * `async-task-worker` CLI as a real process, on the embedded broker (`--memory`: tasks written
 * on its standard input, messages read from its standard output) and on RabbitMQ (a quorum
 * vhost). One process per mode runs every kind, one after the other: each kind's task, then an
 * `ok` task that must succeed, with the process still running; at the end the process stops
 * (stdin closed, or SIGTERM) and exits 0, and every task has exactly one terminal message and one
 * decision line per delivery. `misbehaviourSuite` defines the cases for one runtime; the files
 * `misbehaviour.node.test.ts` and `misbehaviour.deno.test.ts` call it.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { join } from "node:path"
import process from "node:process"
import { afterAll, beforeAll, describe, it } from "vitest"
import { declaredQueues, ensureVhosts, platform, QUORUM_VHOST, urlFor } from "./broker.ts"
import {
  baseEnv,
  checkBuild,
  denoBinary,
  ROOT,
  type Runtime,
  runtimeSpec,
} from "../support/runtimes.ts"
import { envelope } from "../support/builders.ts"
import { pollUntil, sleep } from "../support/waits.ts"

const WORKER = join(ROOT, "test/fixtures/misbehaviour/worker.mjs")

/** The spec's INTERNAL_ERROR message: a fixed sentence, never the exception's text. */
const INTERNAL_MESSAGE = "The worker failed while running the task."
const CODE = /^[A-Z][A-Z0-9_]{0,63}$/
const DELIVERY_LIMIT = 5
const STARTED = /Worker misbehaviour-fixture started in service mode/

/** What a kind's task must come to. */
interface Kind {
  readonly kind: string
  /** `success`, or the failure's code. */
  readonly expected: "success" | string
  /** Its deliveries: one, or the delivery limit for a task retried to the end. */
  readonly deliveries: number
  /** A RetryableError whose delay is invalid: a WARNING about it at each retry. */
  readonly delayWarning?: boolean
}

const once = (kind: string, expected: string): Kind => ({ kind, expected, deliveries: 1 })
const retried = (kind: string, expected: string, delayWarning: boolean): Kind => ({
  kind,
  expected,
  deliveries: DELIVERY_LIMIT,
  delayWarning,
})

/** Every kind of the fixture (see its handlers), and what the spec says it comes to. */
export const KINDS: ReadonlyArray<Kind> = [
  // An invalid retry delay is an ordinary retry with the computed backoff, and a warning.
  retried("retry-delay-nonsense", "RETRY_EXHAUSTED", true),
  retried("retry-delay-negative", "RETRY_EXHAUSTED", true),
  retried("retry-delay-nan", "RETRY_EXHAUSTED", true),
  retried("retry-delay-object", "RETRY_EXHAUSTED", true),
  // Retried, then concluded with its own code at the last attempt: 123 is not a valid code.
  retried("retry-code-number", "INTERNAL_ERROR", false),
  once("fatal-lowercase-code", "INTERNAL_ERROR"),
  once("fatal-object-message", "BAD"),
  once("throw-string", "INTERNAL_ERROR"),
  once("throw-null", "INTERNAL_ERROR"),
  once("throw-undefined", "INTERNAL_ERROR"),
  once("throw-proxy", "INTERNAL_ERROR"),
  once("throw-number", "INTERNAL_ERROR"),
  once("sync-throw", "INTERNAL_ERROR"),
  once("sync-throw-proxy", "INTERNAL_ERROR"),
  once("return-undefined", "INVALID_OUTPUT"),
  once("return-text", "INVALID_OUTPUT"),
  once("return-number", "INVALID_OUTPUT"),
  once("return-circular", "INVALID_OUTPUT"),
  once("return-bigint", "INVALID_OUTPUT"),
  once("return-bigint-extra", "INVALID_OUTPUT"),
  once("return-proxy", "INVALID_OUTPUT"),
  once("effect-return-proxy", "INVALID_OUTPUT"),
  once("sync-return-proxy", "INVALID_OUTPUT"),
  once("sync-return-bad-thenable", "INTERNAL_ERROR"),
  once("async-return-bad-thenable", "INTERNAL_ERROR"),
  once("sync-reject-non-error", "INTERNAL_ERROR"),
  once("effect-interrupt", "INTERNAL_ERROR"),
  once("effect-die", "INTERNAL_ERROR"),
  once("effect-fail-string", "INTERNAL_ERROR"),
  once("effect-finalizer-dies", "success"),
  once("progress-misuse", "success"),
  once("ignore-signal", "TASK_TIMEOUT"),
  once("block-sync", "TASK_TIMEOUT"),
  once("block-async", "TASK_TIMEOUT"),
  once("block-effect", "TASK_TIMEOUT"),
]

type Mode = "memory" | "rabbitmq"

/** A message the worker published, as the platform reads it. */
interface Published {
  readonly text: string
  readonly taskId: string | undefined
  readonly type: string | undefined
  readonly data: Record<string, unknown>
}

const toPublished = (text: string): Published => {
  const parsed = JSON.parse(text) as { task_id?: unknown; data?: Record<string, unknown> }
  const data = parsed.data ?? {}
  return {
    text,
    taskId: typeof parsed.task_id === "string" ? parsed.task_id : undefined,
    type: typeof data.message_type === "string" ? data.message_type : undefined,
    data,
  }
}

const isTerminal = (m: Published) => m.type === "success" || m.type === "failure"

type Log = Record<string, unknown>

/** The worker process in one mode, and what it published and logged so far. */
interface Session {
  readonly mode: Mode
  readonly send: (taskId: string, body: unknown) => Promise<void>
  /** Reads what is new (the output queue, on RabbitMQ). */
  readonly poll: () => Promise<void>
  readonly published: () => ReadonlyArray<Published>
  readonly logs: () => ReadonlyArray<Log>
  /** Standard output lines that are neither a published message nor a JSON log line. */
  readonly garbage: () => ReadonlyArray<string>
  readonly running: () => boolean
  /** Ends the process as the mode does (stdin closed, or SIGTERM) and returns its exit code. */
  readonly stop: () => Promise<number | null>
  /** The input queue's messages left after the stop (RabbitMQ), or 0. */
  readonly leftover: () => Promise<number>
  readonly kill: () => Promise<void>
  readonly cleanup: () => Promise<void>
  /** The tail of the process's output, for failure messages. */
  readonly tail: () => string
  readonly stderr: () => string
}

interface Child {
  readonly child: ChildProcess
  readonly stdout: () => string
  readonly stderr: () => string
  readonly running: () => boolean
  readonly exited: Promise<number | null>
}

const spawnWorker = (runtime: Runtime, memory: boolean, env: Record<string, string>): Child => {
  const spec = runtimeSpec(runtime)
  const child = spawn(
    spec.command,
    [...spec.args, "run", WORKER, ...(memory ? ["--memory"] : [])],
    {
      cwd: ROOT,
      env: {
        ...baseEnv(),
        WORKER_SDK: spec.sdk,
        HOSTNAME: "misbehaviour-host",
        HEALTH_CHECK_HOST: "127.0.0.1",
        HEALTH_CHECK_PORT: "0",
        WORKER_CONCURRENCY: "1",
        WORKER_RETRY_BACKOFF_BASE_S: "0.01",
        WORKER_RETRY_BACKOFF_MAX_S: "0.05",
        ...env,
      },
      stdio: [memory ? "pipe" : "ignore", "pipe", "pipe"],
    },
  )
  let stdout = ""
  let stderr = ""
  let alive = true
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => void (stdout += chunk))
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => void (stderr += chunk))
  const exited = new Promise<number | null>((resolve, reject) => {
    child.once("error", reject)
    // `close`, not `exit`: the output has been read to its end.
    child.once("close", (code) => {
      alive = false
      resolve(code)
    })
  })
  exited.catch(() => undefined)
  return { child, stdout: () => stdout, stderr: () => stderr, running: () => alive, exited }
}

/** Standard output split into what the worker published (memory mode) and its log lines. */
const parseStdout = (stdout: string) => {
  const published: Array<Published> = []
  const logs: Array<Log> = []
  const garbage: Array<string> = []
  // Only whole lines: the last piece may still be written.
  for (const line of stdout.split("\n").slice(0, -1)) {
    if (line === "") continue
    let parsed: unknown
    try {
      parsed = JSON.parse(line)
    } catch {
      garbage.push(line)
      continue
    }
    const record = parsed as Log
    if (typeof record.level === "string" && typeof record.msg === "string") logs.push(record)
    else if (typeof record.task_id === "string" && typeof record.data === "object") {
      published.push(toPublished(line))
    } else garbage.push(line)
  }
  return { published, logs, garbage }
}

const waitExit = async (child: Child, ms: number): Promise<number | null> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      child.child.kill("SIGKILL")
      reject(new Error(`the worker did not exit within ${ms} ms`))
    }, ms)
  })
  try {
    return await Promise.race([child.exited, late])
  } finally {
    clearTimeout(timer)
  }
}

const tailOf = (child: Child) => () =>
  `\n--- stdout ---\n${child.stdout().slice(-6000)}\n--- stderr ---\n${child.stderr().slice(-2000)}`

const killChild = async (child: Child) => {
  if (!child.running()) return
  child.child.kill("SIGKILL")
  await Promise.race([child.exited.catch(() => undefined), sleep(5_000)])
}

const memorySession = async (runtime: Runtime): Promise<Session> => {
  const child = spawnWorker(runtime, true, {})
  const parsed = () => parseStdout(child.stdout())
  const session: Session = {
    mode: "memory",
    send: async (taskId, body) => {
      const stdin = child.child.stdin!
      await new Promise<void>((resolve, reject) =>
        stdin.write(`${envelope(taskId, body)}\n`, (e) => (e ? reject(e) : resolve()))
      )
    },
    poll: async () => {},
    published: () => parsed().published,
    logs: () => parsed().logs,
    garbage: () => parsed().garbage,
    running: child.running,
    stop: async () => {
      // Input has ended: the process exits once every task is settled.
      child.child.stdin!.end()
      return await waitExit(child, 30_000)
    },
    leftover: () => Promise.resolve(0),
    kill: () => killChild(child),
    cleanup: () => Promise.resolve(),
    tail: tailOf(child),
    stderr: child.stderr,
  }
  await sessionUntil(session, () => STARTED.test(child.stdout()), 30_000, "the worker's start")
  return session
}

const rabbitSession = async (runtime: Runtime): Promise<Session> => {
  const broker = await platform(QUORUM_VHOST)
  const { inQueue, outQueue } = await declaredQueues(broker, "misbehaviour")
  const child = spawnWorker(runtime, false, {
    BROKER_URL: urlFor(QUORUM_VHOST),
    IN_QUEUE_NAME: inQueue,
    OUT_QUEUE_NAME: outQueue,
  })
  const out: Array<Published> = []
  const poll = async () => {
    for (const message of await broker.drain(outQueue)) out.push(toPublished(message.text))
  }
  const session: Session = {
    mode: "rabbitmq",
    send: async (taskId, body) => {
      broker.publish(inQueue, broker.envelope(taskId, body))
      await broker.confirmed()
    },
    poll,
    published: () => out,
    logs: () => parseStdout(child.stdout()).logs,
    garbage: () => parseStdout(child.stdout()).garbage,
    running: child.running,
    stop: async () => {
      // `process.kill`, not `child.kill`: under Deno, a child sent a signal with `child.kill`
      // is reported ended by that signal, whatever its exit code.
      if (child.running() && child.child.pid !== undefined) {
        process.kill(child.child.pid, "SIGTERM")
      }
      const code = await waitExit(child, 40_000)
      await poll()
      return code
    },
    leftover: () => broker.leftover(inQueue),
    kill: () => killChild(child),
    cleanup: async () => {
      await broker.remove(inQueue, outQueue)
      await broker.close()
    },
    tail: tailOf(child),
    stderr: child.stderr,
  }
  await sessionUntil(session, () => STARTED.test(child.stdout()), 30_000, "the worker's start")
  return session
}

/**
 * Polls `session` until `done` holds, within `ms`; fails naming `what`, with the output, and at
 * once if the worker ends.
 */
const sessionUntil = (session: Session, done: () => boolean, ms: number, what: string) =>
  pollUntil(what, async () => {
    await session.poll()
    if (done()) return true
    if (!session.running()) {
      throw new Error(`the worker ended while waiting for ${what}${session.tail()}`)
    }
    return false
  }, { ms, every: 20, said: session.tail })

const ofTask = (session: Session, taskId: string) =>
  session.published().filter((m) => m.taskId === taskId)

const decisionsOf = (session: Session, taskId: string) =>
  session.logs().filter((r) =>
    r.task_id === taskId && typeof r.msg === "string" && r.msg.startsWith("Delivery settled:")
  )

/** A task's story, for failure messages: what was published for it and what was logged. */
const story = (session: Session, taskId: string): string =>
  [
    `--- published for ${taskId} ---`,
    ...ofTask(session, taskId).map((m) => m.text),
    `--- logged for ${taskId} ---`,
    ...session.logs().filter((r) => r.task_id === taskId).map((r) => JSON.stringify(r)),
  ].join("\n")

/** The decision lines a task's deliveries must log, in order of attempts. */
const expectedDecisions = (kind: Kind) =>
  Array.from({ length: kind.deliveries }, (_, i) => {
    const attempt = i + 1
    if (attempt < kind.deliveries) {
      return { attempt, delivery_limit: DELIVERY_LIMIT, outcome: "retry", action: "reject-requeue" }
    }
    return kind.expected === "success"
      ? { attempt, delivery_limit: DELIVERY_LIMIT, outcome: "success", action: "conclude" }
      : {
        attempt,
        delivery_limit: DELIVERY_LIMIT,
        outcome: "failure",
        action: "conclude",
        code: kind.expected,
      }
  })

const okSuccess = (taskId: string) =>
  `{"task_id":"${taskId}","data":{"message_type":"success","response":{"ok":true}}}`

/**
 * Defines the matrix for `runtime`: one process per mode, every kind in it one after the other
 * (a test per kind), then the stop.
 */
export const misbehaviourSuite = (runtime: Runtime): void => {
  describe(`handler misbehaviour on ${runtime}`, () => {
    beforeAll(() => {
      if (runtime === "node") checkBuild()
      else denoBinary()
    })
    for (const mode of ["memory", "rabbitmq"] as const) modeSuite(runtime, mode)
  })
}

const modeSuite = (runtime: Runtime, mode: Mode): void => {
  // One process per mode runs every kind in turn: its tests must not run concurrently.
  describe(
    mode === "memory" ? "on the embedded broker (--memory)" : "on RabbitMQ",
    { concurrent: false },
    () => {
      let session: Session | undefined
      /** Every task sent, with its kind (`ok` for the task that follows each). */
      const sent: Array<{ readonly taskId: string; readonly kind: Kind }> = []
      const ok: Kind = once("ok", "success")

      const current = (): Session => {
        if (session === undefined) throw new Error("the worker process did not start")
        return session
      }

      beforeAll(async () => {
        if (mode === "rabbitmq") ensureVhosts()
        session = mode === "memory" ? await memorySession(runtime) : await rabbitSession(runtime)
      }, 60_000)

      afterAll(async () => {
        await session?.kill()
        await session?.cleanup().catch(() => undefined)
      })

      for (const kind of KINDS) {
        it(`${kind.kind}: ${kind.expected}, then the next task succeeds`, async ({ expect }) => {
          const s = current()
          expect(s.running(), `the worker is not running${s.tail()}`).toBe(true)
          const taskId = `${runtime}-${mode}-${kind.kind}`
          const nextId = `${taskId}--next`
          sent.push({ taskId, kind })
          await s.send(taskId, { kind: kind.kind })
          await sessionUntil(
            s,
            () => ofTask(s, taskId).some(isTerminal),
            20_000,
            `the terminal message of ${taskId}\n${story(s, taskId)}`,
          )
          const terminal = ofTask(s, taskId).find(isTerminal)!
          const why = story(s, taskId)
          if (kind.expected === "success") {
            expect.soft(terminal.text, why).toBe(okSuccess(taskId))
          } else {
            expect.soft(terminal.type, why).toBe("failure")
            const error = terminal.data.error_message as { code?: unknown; message?: unknown }
            expect.soft(error?.code, why).toBe(kind.expected)
            expect.soft(String(error?.code), why).toMatch(CODE)
            expect.soft(typeof error?.message, why).toBe("string")
            if (kind.expected === "INTERNAL_ERROR") {
              expect.soft(error?.message, why).toBe(INTERNAL_MESSAGE)
            }
            // What the handler threw or returned never reaches the message.
            expect.soft(terminal.text, why).not.toContain("SECRET")
          }
          if (kind.kind === "sync-throw") {
            // ...but the worker's own log says it, with its stack, at ERROR, for its author.
            const told = s.logs().find((r) =>
              r.task_id === taskId && r.level === "ERROR" &&
              r.error_type === "Error" && r.error_message === "SECRET-sync"
            )
            expect.soft(told, `an ERROR line with the error's message\n${why}`).toBeDefined()
            expect.soft(String(told?.error_stack), why).toMatch(/SECRET-sync\n\s+at /)
          }

          // The worker keeps consuming: the next task succeeds.
          sent.push({ taskId: nextId, kind: ok })
          await s.send(nextId, { kind: "ok" })
          await sessionUntil(
            s,
            () => ofTask(s, nextId).some(isTerminal),
            20_000,
            `the success of ${nextId}, after ${taskId}\n${story(s, taskId)}`,
          )
          expect.soft(ofTask(s, nextId).find(isTerminal)!.text).toBe(okSuccess(nextId))
          expect(s.running(), `the worker ended${s.tail()}`).toBe(true)

          // One terminal message; a `started` and a decision line per delivery.
          await sessionUntil(
            s,
            () =>
              decisionsOf(s, taskId).length >= kind.deliveries &&
              decisionsOf(s, nextId).length >= 1,
            5_000,
            `the decision lines of ${taskId} and ${nextId}\n${why}`,
          ).catch(() => undefined)
          const now = story(s, taskId)
          expect.soft(ofTask(s, taskId).filter(isTerminal).length, now).toBe(1)
          expect.soft(ofTask(s, taskId).filter((m) => m.type === "started").length, now).toBe(
            kind.deliveries,
          )
          const decisions = decisionsOf(s, taskId).map((r) => ({
            attempt: r.attempt,
            delivery_limit: r.delivery_limit,
            outcome: r.outcome,
            action: r.action,
            ...(r.code === undefined || r.outcome === "retry" ? {} : { code: r.code }),
          }))
          expect.soft(decisions, now).toEqual(expectedDecisions(kind))
          // Progress sent for it, if any, is well-formed: a fraction in [0, 1), an object payload.
          for (const m of ofTask(s, taskId).filter((m) => m.type === "progress")) {
            const fraction = m.data.progress
            expect.soft(typeof fraction === "number" && fraction >= 0 && fraction < 1, now)
              .toBe(true)
            if ("response" in m.data) {
              expect.soft(typeof m.data.response === "object" && m.data.response !== null, now)
                .toBe(true)
            }
          }
          if (kind.delayWarning === true) {
            // A warning about the delay at each retry (attempts 1 to 4).
            const warned = s.logs().filter((r) =>
              r.task_id === taskId && r.level === "WARNING" && /delay/i.test(String(r.msg))
            ).map((r) => r.attempt)
            for (let attempt = 1; attempt < kind.deliveries; attempt++) {
              expect.soft(warned, now).toContain(attempt)
            }
          }
        }, 60_000)
      }

      it(
        "stops cleanly; exactly one terminal message per task, one decision line per delivery",
        async ({ expect }) => {
          const s = current()
          const started = Date.now()
          const code = await s.stop()
          const elapsed = Date.now() - started
          expect.soft(code, `exit code${s.tail()}`).toBe(0)
          expect.soft(elapsed, "ms from the stop to the exit").toBeLessThan(15_000)
          expect.soft(await s.leftover(), "tasks left on the input queue").toBe(0)
          expect.soft(s.garbage(), "standard output lines that are not JSON").toEqual([])
          const ids = new Set(sent.map((t) => t.taskId))
          expect.soft(
            s.published().filter((m) => m.taskId === undefined || !ids.has(m.taskId)).map((m) =>
              m.text
            ),
            "messages for tasks never sent",
          ).toEqual([])
          let deliveries = 0
          for (const { kind, taskId } of sent) {
            deliveries += kind.deliveries
            const why = story(s, taskId)
            expect.soft(ofTask(s, taskId).filter(isTerminal).length, why).toBe(1)
            expect.soft(decisionsOf(s, taskId).length, why).toBe(kind.deliveries)
          }
          const all = s.logs().filter((r) =>
            typeof r.msg === "string" && r.msg.startsWith("Delivery settled:")
          )
          expect.soft(all.length, "decision lines in all").toBe(deliveries)
          // A handler's error text is the worker's own log's, for its author (only at ERROR,
          // in the error fields): never in a message the platform receives, nor on stderr.
          const secret = s.logs().filter((r) => JSON.stringify(r).includes("SECRET"))
          for (const line of secret) {
            expect.soft(line.level, JSON.stringify(line)).toBe("ERROR")
            expect.soft(String(line.msg), JSON.stringify(line)).not.toContain("SECRET")
          }
          expect.soft(s.stderr(), "standard error").not.toContain("SECRET")
        },
        60_000,
      )
    },
  )
}
