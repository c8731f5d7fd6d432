/**
 * `Worker.launch`: an app's layer (its own `Journal` service, the worker as `Worker.layer` over
 * it: `test/fixtures/launch/app.mjs`) run as a real process on RabbitMQ, on the runtime running
 * the test (Node: the SDK built into `dist/`; Deno: its sources). SIGTERM drains the task in
 * flight, then the shutdown hooks run, then the app's own service is released, exit 0; a second
 * SIGTERM cuts a long grace short; a layer that cannot start says why in one line (exit 2); the
 * shutdown is bounded; `options.stop` stops it. And the launcher's exit: the process that started
 * the app killed (as `npx` is, which passes no signal on) leaves an orphan, which drains as on
 * SIGTERM and exits 0 within its shutdown bound, on Node and on Deno alike.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { join } from "node:path"
import process from "node:process"
import { pathToFileURL } from "node:url"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ensureVhosts, platform, QUORUM_VHOST, uniqueName, urlFor } from "./broker.ts"
import { supportedNode } from "../support/nodes.ts"
import { baseEnv, checkBuild, denoBinary, ROOT } from "../support/runtimes.ts"
import { pollUntil, sleep } from "../support/waits.ts"

const APP = join(ROOT, "test/fixtures/launch/app.mjs")
const onDeno = process.versions.deno !== undefined

/** The app's command on the runtime running the test, and the SDK it imports. */
const command: ReadonlyArray<string> = onDeno
  ? [denoBinary(), "run", "-A", APP]
  : [supportedNode(), APP]
const sdk = pathToFileURL(join(ROOT, onDeno ? "src/index.ts" : "dist/index.js")).href

/**
 * `process.kill`, not `child.kill`: under Deno (the suite run by vitest on Deno), a child sent a
 * signal with `child.kill` is reported ended by that signal, whatever its exit code.
 */
const signal = (child: ChildProcess, name: NodeJS.Signals) => process.kill(child.pid!, name)

/** A process whose output is read as it comes, with its events and its exit. */
const watch = (child: ChildProcess) => {
  let stdout = ""
  let stderr = ""
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => void (stdout += chunk))
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => void (stderr += chunk))
  const closed = new Promise<number | null>((resolve) => child.once("close", resolve))
  const events = () =>
    stdout.split("\n").filter((line) => line.startsWith("EVENT ")).map((line) =>
      line.slice("EVENT ".length)
    )
  const said = () =>
    `--- stdout ---\n${stdout.slice(-4000)}\n--- stderr ---\n${stderr.slice(-2000)}`
  const waitFor = (what: string, found: () => boolean, ms = 30_000) =>
    pollUntil(`the app to ${what}`, found, { ms, every: 20, said: () => `:\n${said()}` })
  /** The exit code, or "late" past `ms`. */
  const exit = (ms: number) => Promise.race([closed, sleep(ms).then(() => "late" as const)])
  return {
    events,
    said,
    waitFor,
    exit,
    stdout: () => stdout,
    stderr: () => stderr,
    logged: (msg: string) => stdout.includes(`"msg":${JSON.stringify(msg)}`),
  }
}

describe("Worker.launch", () => {
  const running: Array<ChildProcess> = []
  const apps: Array<ReturnType<typeof watch>> = []
  let broker: Awaited<ReturnType<typeof platform>>
  const queues: Array<string> = []

  beforeAll(async () => {
    if (!onDeno) checkBuild()
    ensureVhosts()
    broker = await platform(QUORUM_VHOST)
  })
  afterAll(async () => {
    for (const child of running) if (child.exitCode === null) child.kill("SIGKILL")
    // An orphan is not the test's child: its own line gives its pid.
    for (const app of apps) {
      const pid = app.events().find((event) => event.startsWith("pid "))?.slice("pid ".length)
      if (pid !== undefined && !app.events().some((event) => event.startsWith("exit "))) {
        try {
          process.kill(Number(pid), "SIGKILL")
        } catch {
          // gone already
        }
      }
    }
    await broker?.remove(...queues)
    await broker?.close()
  })

  /** The app on RabbitMQ, on fresh queues, with `env` on top. */
  const launch = (env: Record<string, string> = {}, launcher?: ReadonlyArray<string>) => {
    const name = uniqueName("launch")
    const [inQueue, outQueue] = [`${name}_in`, `${name}_out`]
    queues.push(inQueue, outQueue)
    const [file, ...args] = [...(launcher ?? []), ...command]
    const child = spawn(file!, args, {
      cwd: ROOT,
      env: {
        ...baseEnv(),
        WORKER_SDK: sdk,
        BROKER_URL: urlFor(QUORUM_VHOST),
        IN_QUEUE_NAME: inQueue,
        OUT_QUEUE_NAME: outQueue,
        HEALTH_CHECK_PORT: "0",
        ...env,
      },
      stdio: ["ignore", "pipe", "pipe"],
    })
    running.push(child)
    const app = watch(child)
    apps.push(app)
    const started = () =>
      app.waitFor("start", () => app.stdout().includes("Worker launched started"))
    return { child, app, inQueue, outQueue, started }
  }

  it(
    "SIGTERM with a task in flight: the task finishes, then the shutdown hook, then the app's service; exit 0",
    async () => {
      const { child, app, inQueue, outQueue, started } = launch({ WORKER_SHUTDOWN_GRACE_S: "20" })
      await started()
      expect(app.events().slice(1)).toEqual(["journal opened", "startup hook"])
      broker.publish(inQueue, broker.envelope("t-a", { id: "a", millis: 1500 }))
      await broker.confirmed()
      await app.waitFor("start the task", () => app.events().includes("task a started"))
      signal(child, "SIGTERM")
      expect(await app.exit(20_000), app.said()).toBe(0)
      expect(app.logged("SIGTERM received: shutting down"), app.said()).toBe(true)
      // The drain, then the worker's shutdown hook, and only then the app's own service.
      expect(app.events().slice(-4)).toEqual([
        "task a done",
        "shutdown hook",
        "journal closed",
        "exit 0",
      ])
      const out = await broker.readUntil(outQueue, (all) => all.some((m) => m.type === "success"))
      expect(out.filter((m) => m.type === "success").map((m) => JSON.parse(m.text).task_id))
        .toEqual(["t-a"])
    },
    60_000,
  )

  it(
    "a second SIGTERM during a long grace skips the rest of it: the task is requeued, exit 0 at once",
    async () => {
      const { child, app, inQueue, started } = launch({ WORKER_SHUTDOWN_GRACE_S: "60" })
      await started()
      broker.publish(inQueue, broker.envelope("t-long", { id: "long", millis: 60_000 }))
      await broker.confirmed()
      await app.waitFor("start the task", () => app.events().includes("task long started"))
      signal(child, "SIGTERM")
      await app.waitFor(
        "begin the drain",
        () => app.logged("SIGTERM received: shutting down"),
      )
      await sleep(300)
      const second = Date.now()
      signal(child, "SIGTERM")
      expect(await app.exit(15_000), app.said()).toBe(0)
      expect(Date.now() - second).toBeLessThan(10_000)
      expect(
        app.logged("SIGTERM received again: skipping the rest of the grace period"),
        app.said(),
      )
        .toBe(true)
      const events = app.events()
      expect(events).not.toContain("task long done")
      expect(events.slice(-3)).toEqual(["shutdown hook", "journal closed", "exit 0"])
      // Requeued, not concluded: it waits in the queue for a worker (a quorum queue's count
      // follows the nack and the connection's close a moment later).
      let waiting = await broker.count(inQueue)
      for (const deadline = Date.now() + 5_000; waiting !== 1 && Date.now() < deadline;) {
        await sleep(100)
        waiting = await broker.count(inQueue)
      }
      expect(waiting).toBe(1)
    },
    60_000,
  )

  it.each([
    [
      "invalid settings",
      { WORKER_CONCURRENCY: "x" },
      'Invalid worker settings: WORKER_CONCURRENCY: Expected an integer value but received "x"',
      ["journal opened", "journal closed", "exit 2"],
    ],
    // The startup hooks run before the transport is built.
    [
      "no BROKER_URL",
      { BROKER_URL: "" },
      "BROKER_URL is not set",
      ["journal opened", "startup hook", "journal closed", "exit 2"],
    ],
  ])(
    "a layer that cannot start on %s: exit 2, one line saying why, the app's service released",
    async (_, env, line, events) => {
      const { app } = launch(env)
      expect(await app.exit(30_000), app.said()).toBe(2)
      expect(app.stderr().split("\n").filter((l) => l.trim() !== ""), app.said()).toEqual([line])
      // Nothing else said: the app's own events only, the service released.
      expect(app.stdout().split("\n").filter((l) => l !== "" && !l.startsWith("EVENT ")))
        .toEqual([])
      expect(app.events().slice(1)).toEqual(events)
    },
    60_000,
  )

  it("stops on options.stop as on a signal: exit 0", async () => {
    const { app, started } = launch({ STOP_AFTER_MS: "1500" })
    await started()
    expect(await app.exit(20_000), app.said()).toBe(0)
    expect(app.events().slice(-3)).toEqual(["shutdown hook", "journal closed", "exit 0"])
  }, 60_000)

  it(
    "a job done ends the app with its worker's life: exit 0 after the task, hooks and service",
    async () => {
      const { app, inQueue, started } = launch({ WORKER_MODE: "job", WORKER_JOB_MAX_TASKS: "1" })
      await started()
      broker.publish(inQueue, broker.envelope("t-job", { id: "job", millis: 100 }))
      await broker.confirmed()
      expect(await app.exit(30_000), app.said()).toBe(0)
      expect(app.events().slice(-5)).toEqual([
        "task job started",
        "task job done",
        "shutdown hook",
        "journal closed",
        "exit 0",
      ])
    },
    60_000,
  )

  it("a shutdown hook that fails: exit 1 after SIGTERM, the app's service released", async () => {
    const { child, app, started } = launch({ FAIL_SHUTDOWN_HOOK: "1" })
    await started()
    signal(child, "SIGTERM")
    expect(await app.exit(30_000), app.said()).toBe(1)
    expect(app.events().slice(-3)).toEqual(["shutdown hook", "journal closed", "exit 1"])
  }, 60_000)

  it(
    "bounds the shutdown: a service whose release never ends, exit 1 at the bound (22 s)",
    async () => {
      const { child, app, started } = launch({ WORKER_SHUTDOWN_GRACE_S: "0", HANG_ON_CLOSE: "1" })
      await started()
      signal(child, "SIGTERM")
      const sent = Date.now()
      expect(await app.exit(40_000), app.said()).toBe(1)
      const took = Date.now() - sent
      expect(took).toBeGreaterThanOrEqual(21_000)
      expect(took).toBeLessThan(30_000)
      expect(app.logged("The shutdown did not end within 22s: exiting"), app.said()).toBe(true)
      expect(app.events().slice(-3)).toEqual(["shutdown hook", "journal hangs", "exit 1"])
    },
    60_000,
  )

  it(
    "the launcher's exit: an orphan drains as on SIGTERM and exits 0 within its shutdown bound",
    async () => {
      // A launcher that passes no signal on, as npx: killed, it leaves the app to the init. It
      // says it is a package runner as npx does.
      const { child, app, inQueue, started } = launch(
        { WORKER_SHUTDOWN_GRACE_S: "5", npm_config_user_agent: "npm/10.9.2 node/v24.22.3" },
        ["sh", "-c", '"$@" & wait', "launcher"],
      )
      await started()
      broker.publish(inQueue, broker.envelope("t-b", { id: "b", millis: 1000 }))
      await broker.confirmed()
      await app.waitFor("start the task", () => app.events().includes("task b started"))
      signal(child, "SIGKILL")
      const killed = Date.now()
      // The app's exit, from its own line: the test did not start it and cannot wait for it.
      await app.waitFor("exit", () => app.events().some((e) => e.startsWith("exit ")), 22_000)
      expect(Date.now() - killed).toBeLessThan(22_000)
      expect(
        app.logged("The process that started the worker has exited: shutting down"),
        app.said(),
      ).toBe(true)
      expect(app.events().slice(-4)).toEqual([
        "task b done",
        "shutdown hook",
        "journal closed",
        "exit 0",
      ])
    },
    60_000,
  )

  it(
    "a launcher that is not a package runner (nohup … &, setsid, a supervisor): its exit is no stop",
    async () => {
      const { child, app, inQueue, outQueue, started } = launch(
        { WORKER_SHUTDOWN_GRACE_S: "5" },
        ["nohup", "sh", "-c", '"$@" & wait', "launcher"],
      )
      await started()
      signal(child, "SIGKILL")
      // Three of the watch's polls, then a task: the worker is still serving.
      await sleep(3_000)
      broker.publish(inQueue, broker.envelope("t-c", { id: "c", millis: 100 }))
      await broker.confirmed()
      await broker.readUntil(outQueue, (all) => all.some((m) => m.type === "success"))
      expect(app.logged("The process that started the worker has exited: shutting down")).toBe(
        false,
      )
      expect(app.events().some((event) => event.startsWith("exit "))).toBe(false)
      // Stopped as a supervisor would: SIGTERM to its pid, which its own line gives.
      const pid = app.events().find((event) => event.startsWith("pid "))!.slice("pid ".length)
      process.kill(Number(pid), "SIGTERM")
      await app.waitFor("exit", () => app.events().includes("exit 0"), 22_000)
    },
    60_000,
  )
})
