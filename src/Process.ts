/**
 * The process a worker runs in: its signals (and its launcher's exit), arguments, standard
 * streams, permissions and exit. The one module that touches `process` (which Deno provides
 * too), so that the lifecycle is tested with {@link makeTest} and no real process.
 *
 * @since 0.1.0
 */
import { relative, resolve } from "node:path"
import process from "node:process"
import { createInterface } from "node:readline"
import type * as Scope from "effect/Scope"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as WorkerLogger from "./WorkerLogger.ts"

/**
 * The signals that stop a worker.
 *
 * @since 0.1.0
 * @category models
 */
export type Signal = "SIGTERM" | "SIGINT"

/**
 * What stops a worker: a signal, or its launcher's exit (`"LauncherExited"`): the process that
 * started it (`npx`, `npm start`, a shell) is gone without passing a signal on, leaving it an
 * orphan that nothing would stop.
 *
 * @since 0.2.0
 * @category models
 */
export type Stop = Signal | "LauncherExited"

/**
 * A stop as the log says it: `SIGTERM received`, or that the launcher has exited.
 *
 * @since 0.2.0
 * @category models
 */
export const describeStop = (stop: Stop): string =>
  stop === "LauncherExited" ? "The process that started the worker has exited" : `${stop} received`

/**
 * The spec's exit codes: 0 a clean stop, 1 a failure, 2 a configuration or usage error.
 *
 * @since 0.1.0
 * @category models
 */
export type ExitCode = 0 | 1 | 2

interface ProcessShape {
  /**
   * The stops from now on, for as long as the scope lives: each signal received, and the
   * launcher's exit (see {@link Stop}) unless a signal came first. While anyone listens, a
   * signal no longer ends the process by itself.
   */
  readonly signals: Effect.Effect<Queue.Dequeue<Stop>, never, Scope.Scope>
  /** The command-line arguments after the program's own. */
  readonly argv: ReadonlyArray<string>
  /** Standard input, line by line, ending when it closes. */
  readonly stdinLines: Stream.Stream<string>
  /** Writes one line to standard output. */
  readonly writeOut: (line: string) => Effect.Effect<void>
  /** Writes one line to standard error. */
  readonly writeErr: (line: string) => Effect.Effect<void>
  /** The working directory, for resolving a module given on the command line. */
  readonly cwd: string
}

const ProcessService: Context.ServiceClass<Process, "@async-task/worker/Process", ProcessShape> =
  Context.Service<Process, ProcessShape>()("@async-task/worker/Process")

/**
 * The process, as the lifecycle uses it.
 *
 * @since 0.1.0
 * @category services
 */
export class Process extends ProcessService {}

const SIGNALS: ReadonlyArray<Signal> = ["SIGTERM", "SIGINT"]

/** How often the launcher is looked for: its exit is noticed within this. */
const LAUNCHER_POLL = Duration.seconds(1)

/**
 * Completes once the launcher (the parent when the process started) has exited, when it is a
 * package runner: the parent is then another, the init or subreaper that adopted the orphan. A
 * package runner (`npx`, `npm start`, `deno task`) may end without passing a signal on, and the
 * worker would run on unseen; any other launcher left it on purpose or outlives it: `nohup … &`
 * and `setsid` detach it from a shell that exits, and a supervisor (or a container's init, or any
 * PID 1) stops it itself. Never for PID 1, nor under a parent that is PID 1 or outside the PID
 * namespace (0): an orphan already has no launcher to lose.
 */
const launcherExit = (
  pid: number,
  launcher: number,
  parentPid: () => number,
  packageRunner: () => boolean,
): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (pid === 1 || launcher <= 1 || !packageRunner()) return Effect.never
    return Effect.sync(parentPid).pipe(
      Effect.repeat({
        schedule: Schedule.spaced(LAUNCHER_POLL),
        until: (parent) => parent !== launcher,
      }),
      Effect.asVoid,
    )
  })

/**
 * Whether a package runner started the process: npm, npx, pnpm, yarn, bun and `deno task` each
 * say who they are in `npm_config_user_agent` (npm's scripts also in `npm_lifecycle_event`).
 */
const startedByPackageRunner = (): boolean => {
  try {
    return process.env.npm_config_user_agent !== undefined ||
      process.env.npm_lifecycle_event !== undefined
  } catch {
    // Deno without the permission to read them: no runner that the SDK can tell.
    return false
  }
}

/**
 * The stops to come, for as long as the scope lives: `subscribe` delivers the signals, and the
 * launcher's exit is one unless a signal came first (a Ctrl-C reaches `npx` and the worker
 * alike: `npx` ending then is not a second signal, which would skip the grace).
 */
const stopsIn = (
  subscribe: (deliver: (signal: Signal) => void) => Effect.Effect<void, never, Scope.Scope>,
  launcherExited: Effect.Effect<void>,
): Effect.Effect<Queue.Dequeue<Stop>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const queue = yield* Effect.acquireRelease(Queue.unbounded<Stop>(), Queue.shutdown)
    let signalled = false
    yield* subscribe((signal) => {
      signalled = true
      Queue.offerUnsafe(queue, signal)
    })
    yield* Effect.forkScoped(Effect.andThen(
      launcherExited,
      Effect.sync(() => {
        if (!signalled) Queue.offerUnsafe(queue, "LauncherExited")
      }),
    ))
    return queue
  })

interface DenoPermissions {
  readonly querySync: (
    descriptor:
      | { readonly name: "net"; readonly host?: string }
      | { readonly name: "env" }
      | { readonly name: "sys"; readonly kind: "hostname" }
      | { readonly name: "read"; readonly path: string },
  ) => { readonly state: string }
}

const denoPermissions = (): DenoPermissions | undefined =>
  (globalThis as { Deno?: { permissions?: DenoPermissions } }).Deno?.permissions

/** Whether Deno grants `descriptor`; true elsewhere, or where it cannot say. */
const granted = (descriptor: Parameters<DenoPermissions["querySync"]>[0]): boolean => {
  const permissions = denoPermissions()
  if (permissions === undefined) return true
  try {
    return permissions.querySync(descriptor).state === "granted"
  } catch {
    // A runtime that cannot say is not one to stop on.
    return true
  }
}

/**
 * On Deno without the network permission for `host:port`, the line that says so and names the
 * flag (its listen would fail out of reach of any handler), as {@link missingPermissions} says
 * it; `undefined` elsewhere, or when it is granted.
 *
 * @since 0.1.0
 * @category running
 */
export const missingNetPermission = (host: string, port: number): string | undefined =>
  missingPermissions({ net: [`${host}:${port}`] })

/**
 * What a worker is about to read and reach, for {@link missingPermissions}.
 *
 * @since 0.2.0
 * @category models
 */
export interface PermissionNeeds {
  /** Files it will load (the CLI's module, with what it imports). */
  readonly read?: ReadonlyArray<string> | undefined
  /**
   * The addresses (`host:port`) it will connect to or listen on: the broker, the probe server.
   * Not yet known (before the settings are read), the network is named only beside another
   * missing permission: a grant for some hosts cannot be told from none.
   */
  readonly net?: ReadonlyArray<string> | undefined
}

/** `"a"`, `"a" and "b"`, `"a", "b" and "c"`. */
const quoted = (items: ReadonlyArray<string>): string => {
  const all = items.map((item) => `"${item}"`)
  return all.length < 2 ? all.join("") : `${all.slice(0, -1).join(", ")} and ${all.at(-1)}`
}

/**
 * On Deno, the one line that names every permission the worker needs and lacks, with the
 * narrowest flags that grant them: `--allow-read` for `needs.read` (`=.` for files under the
 * working directory), `--allow-net=host:port,…` for `needs.net` (the addresses not granted;
 * `--allow-net` while they are not known), `--allow-env` (the settings read the whole
 * environment) and `--allow-sys=hostname` (the `started` message's `hostname`, unless `HOSTNAME`
 * is set); so that
 * a run without them says all at once what Deno would say one at a time, as the first thing
 * fails. The version file is not named: without it `/__version__` serves the SDK's own version.
 * `undefined` elsewhere, or when everything is granted.
 *
 * @since 0.2.0
 * @category running
 */
export const missingPermissions = (needs: PermissionNeeds = {}): string | undefined => {
  if (denoPermissions() === undefined) return undefined
  const missing: Array<{ readonly what: string; readonly flag: string }> = []
  const unread = (needs.read ?? []).filter((path) => !granted({ name: "read", path }))
  if (unread.length > 0) {
    const outside = unread.some((path) => relative(".", resolve(path)).startsWith(".."))
    missing.push({
      what: `read access to ${quoted(unread)}`,
      flag: outside ? "--allow-read" : "--allow-read=.",
    })
  }
  const env = granted({ name: "env" })
  // The host's name is asked for only as HOSTNAME's default (Kubernetes sets HOSTNAME).
  const hostname = granted({ name: "sys", kind: "hostname" }) ||
    (env && (process.env.HOSTNAME ?? "") !== "")
  if (needs.net === undefined) {
    if ((unread.length > 0 || !env || !hostname) && !granted({ name: "net" })) {
      missing.push({ what: "net access", flag: "--allow-net" })
    }
  } else {
    const unreached = needs.net.filter((host) => !granted({ name: "net", host }))
    if (unreached.length > 0) {
      missing.push({
        what: `net access to ${quoted(unreached)}`,
        flag: `--allow-net=${unreached.join(",")}`,
      })
    }
  }
  if (!env) missing.push({ what: "env access", flag: "--allow-env" })
  if (!hostname) missing.push({ what: 'sys access to "hostname"', flag: "--allow-sys=hostname" })
  if (missing.length === 0) return undefined
  const head = missing.length === 1
    ? "A Deno permission is missing"
    : "Deno permissions are missing"
  return `${head}: ${missing.map((m) => m.what).join(", ")}: run again with ${
    missing.map((m) => m.flag).join(" ")
  }`
}

/**
 * On Deno without read access to `path` (a module about to be imported), the line of
 * {@link missingPermissions} that names it first, with every other permission missing.
 *
 * @since 0.2.0
 * @category running
 */
export const missingRead = (path: string): string | undefined =>
  granted({ name: "read", path }) ? undefined : missingPermissions({ read: [path] })

/** The launcher: the parent when this module loaded, as early as the SDK can tell. */
const LAUNCHER = process.ppid

const processService = Process.of({
  signals: stopsIn(
    (deliver) =>
      Effect.acquireRelease(
        Effect.sync(() =>
          SIGNALS.map((signal) => {
            const listener = () => deliver(signal)
            process.on(signal, listener)
            return () => process.off(signal, listener)
          })
        ),
        (listeners) => Effect.sync(() => listeners.forEach((off) => off())),
      ),
    launcherExit(process.pid, LAUNCHER, () => process.ppid, startedByPackageRunner),
  ),
  argv: process.argv.slice(2),
  stdinLines: Stream.suspend(() =>
    Stream.fromAsyncIterable(
      createInterface({ input: process.stdin, crlfDelay: Infinity }),
      () => undefined,
    ).pipe(Stream.catch(() => Stream.empty))
  ),
  writeOut: (line) => Effect.sync(() => void process.stdout.write(`${line}\n`)),
  writeErr: (line) => Effect.sync(() => void process.stderr.write(`${line}\n`)),
  cwd: process.cwd(),
})

/**
 * The real process, as a service value.
 *
 * @since 0.1.0
 * @category constructors
 */
export const live: Process["Service"] = processService

/**
 * The real process.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<Process> = Layer.succeed(Process, processService)

/**
 * Runs `program` as the process, logging JSON lines (see `WorkerLogger`), and exits with its
 * code (1 if it fails), unless `exits` says not to; the Promise gives the code. Only an entry
 * point (`Worker.run`, the CLI) calls it.
 *
 * @since 0.1.0
 * @category running
 */
export const runMain = (
  program: Effect.Effect<ExitCode, never, Process>,
  options: {
    /** Whether to exit the process with the code (default yes): not when its owner stopped it. */
    readonly exits?: (() => boolean) | undefined
  } = {},
): Promise<ExitCode> =>
  new Promise((resolve) => {
    // A running fiber holds nothing open: while the program waits on what has no timer or
    // socket (a signal, a startup hook's bare Promise), the runtime would end the process with
    // code 0.
    const keepAlive = setInterval(() => {}, 2 ** 31 - 1)
    Effect.runFork(
      program.pipe(
        Effect.provideService(Process, processService),
        Effect.provide(WorkerLogger.layer),
      ),
    ).addObserver((exit) => {
      clearInterval(keepAlive)
      const code: ExitCode = Exit.isSuccess(exit) ? exit.value : 1
      if (options.exits?.() ?? true) process.exit(code)
      resolve(code)
    })
  })

/**
 * A process for tests: signals sent with `signal`, standard input given as lines, and what was
 * written kept.
 *
 * @since 0.1.0
 * @category testing
 */
export interface TestProcess {
  readonly process: Process["Service"]
  /** Sends a stop signal to every listener. */
  readonly signal: (signal?: Signal) => Effect.Effect<void>
  /** Lines written to standard output, then to standard error. */
  readonly out: Effect.Effect<ReadonlyArray<string>>
  readonly err: Effect.Effect<ReadonlyArray<string>>
}

/**
 * Makes a {@link TestProcess}. With `parentPid`, its signals watch the launcher as the real
 * process's do: the parent's pid when it is made is the launcher's, and the watch reads
 * `parentPid` again every second (under `TestClock`, as the test adjusts it); `pid` is the
 * process's own (default 1000; 1 is an init's).
 *
 * @since 0.1.0
 * @category testing
 */
export const makeTest = (options: {
  readonly argv?: ReadonlyArray<string>
  readonly stdinLines?: Stream.Stream<string>
  readonly cwd?: string
  readonly parentPid?: (() => number) | undefined
  readonly pid?: number | undefined
  /** Whether the launcher is a package runner, whose exit is a stop (default `true`). */
  readonly packageRunner?: boolean | undefined
} = {}): Effect.Effect<TestProcess> =>
  Effect.gen(function* () {
    const listeners = new Set<(signal: Signal) => void>()
    const out = yield* Ref.make<ReadonlyArray<string>>([])
    const err = yield* Ref.make<ReadonlyArray<string>>([])
    const { parentPid } = options
    const launcherExited = parentPid === undefined ? Effect.never : launcherExit(
      options.pid ?? 1000,
      parentPid(),
      parentPid,
      () => options.packageRunner ?? true,
    )
    return {
      process: Process.of({
        signals: stopsIn(
          (deliver) =>
            Effect.acquireRelease(
              Effect.sync(() => listeners.add(deliver)),
              () => Effect.sync(() => listeners.delete(deliver)),
            ),
          launcherExited,
        ),
        argv: options.argv ?? [],
        stdinLines: options.stdinLines ?? Stream.never,
        writeOut: (line) => Ref.update(out, (lines) => [...lines, line]),
        writeErr: (line) => Ref.update(err, (lines) => [...lines, line]),
        cwd: options.cwd ?? ".",
      }),
      signal: (signal = "SIGTERM") =>
        Effect.sync(() => {
          for (const deliver of listeners) deliver(signal)
        }),
      out: Ref.get(out),
      err: Ref.get(err),
    }
  })
