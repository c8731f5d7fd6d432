/**
 * The process a worker runs in: its signals, arguments, standard streams and exit. The one
 * module that touches `process` (which Deno provides too), so that the lifecycle is tested with
 * {@link layerTest} and no real process.
 *
 * @since 0.1.0
 */
import process from "node:process"
import { createInterface } from "node:readline"
import type { Scope } from "effect"
import { Context, Effect, Exit, Layer, Queue, Ref, Stream } from "effect"
import * as WorkerLogger from "./WorkerLogger.ts"

/**
 * The signals that stop a worker.
 *
 * @since 0.1.0
 * @category models
 */
export type Signal = "SIGTERM" | "SIGINT"

/**
 * The spec's exit codes: 0 a clean stop, 1 a failure, 2 a configuration or usage error.
 *
 * @since 0.1.0
 * @category models
 */
export type ExitCode = 0 | 1 | 2

/**
 * The process, as the lifecycle uses it.
 *
 * @since 0.1.0
 * @category services
 */
export class Process extends Context.Service<Process, {
  /**
   * The stop signals received from now on, for as long as the scope lives. While anyone
   * listens, a signal no longer ends the process by itself.
   */
  readonly signals: Effect.Effect<Queue.Dequeue<Signal>, never, Scope.Scope>
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
}>()("@async-task/worker/Process") {}

const SIGNALS: ReadonlyArray<Signal> = ["SIGTERM", "SIGINT"]

interface DenoPermissions {
  readonly querySync: (descriptor: { readonly name: "net"; readonly host: string }) => {
    readonly state: string
  }
}

/**
 * On Deno without the network permission for `host:port`, the line that says so and names the
 * flag, as Deno says it of the others (its listen would fail out of reach of any handler);
 * `undefined` elsewhere, or when it is granted.
 *
 * @since 0.1.0
 * @category running
 */
export const missingNetPermission = (host: string, port: number): string | undefined => {
  const permissions = (globalThis as { Deno?: { permissions?: DenoPermissions } }).Deno
    ?.permissions
  if (permissions === undefined) return undefined
  const address = `${host}:${port}`
  try {
    if (permissions.querySync({ name: "net", host: address }).state === "granted") return undefined
  } catch {
    return undefined
  }
  return `A Deno permission is missing: Requires net access to "${address}", run again with the --allow-net flag`
}

const processService = Process.of({
  signals: Effect.acquireRelease(
    Effect.gen(function* () {
      const queue = yield* Queue.unbounded<Signal>()
      const listeners = SIGNALS.map((signal) => {
        const listener = () => Queue.offerUnsafe(queue, signal)
        process.on(signal, listener)
        return () => process.off(signal, listener)
      })
      return { queue, listeners }
    }),
    ({ listeners, queue }) =>
      Effect.sync(() => listeners.forEach((off) => off())).pipe(
        Effect.andThen(Queue.shutdown(queue)),
      ),
  ).pipe(Effect.map(({ queue }) => queue)),
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
 * Makes a {@link TestProcess}.
 *
 * @since 0.1.0
 * @category testing
 */
export const makeTest = (options: {
  readonly argv?: ReadonlyArray<string>
  readonly stdinLines?: Stream.Stream<string>
  readonly cwd?: string
} = {}): Effect.Effect<TestProcess> =>
  Effect.gen(function* () {
    const listeners = new Set<Queue.Queue<Signal>>()
    const out = yield* Ref.make<ReadonlyArray<string>>([])
    const err = yield* Ref.make<ReadonlyArray<string>>([])
    return {
      process: Process.of({
        signals: Effect.acquireRelease(
          Effect.tap(Queue.unbounded<Signal>(), (queue) => Effect.sync(() => listeners.add(queue))),
          (queue) => Effect.sync(() => listeners.delete(queue)),
        ),
        argv: options.argv ?? [],
        stdinLines: options.stdinLines ?? Stream.never,
        writeOut: (line) => Ref.update(out, (lines) => [...lines, line]),
        writeErr: (line) => Ref.update(err, (lines) => [...lines, line]),
        cwd: options.cwd ?? ".",
      }),
      signal: (signal = "SIGTERM") =>
        Effect.sync(() => {
          for (const queue of listeners) Queue.offerUnsafe(queue, signal)
        }),
      out: Ref.get(out),
      err: Ref.get(err),
    }
  })
