/**
 * The `async-task-worker` command: `run <module>[:export]` loads a worker from a module and runs
 * it as the process. The entry point is `cli.ts`; this module is its testable logic.
 *
 * @since 0.1.0
 */
import { resolve } from "node:path"
import { pathToFileURL } from "node:url"
import { Effect, Either } from "effect"
import { firstLine } from "./internal/describe.ts"
import { VERSION } from "./internal/version.ts"
import * as Lifecycle from "./Lifecycle.ts"
import { type ExitCode, Process } from "./Process.ts"
import type * as Worker from "./WorkerDefinition.ts"

/**
 * The command's help.
 *
 * @since 0.1.0
 * @category constants
 */
export const USAGE = `Usage: async-task-worker run <module>[:export] [--memory]

Runs the worker exported by <module> (default export name: worker) until SIGTERM or SIGINT.
The export is a worker made with Worker.make, or a function of no arguments returning one
(or a Promise of one).

Options:
  --memory       run on the embedded broker (as WORKER_TRANSPORT=memory): each line of
                 standard input is a task, each message published is printed
  -h, --help     show this help
  -V, --version  show the SDK's version

Settings come from the environment (BROKER_URL, WORKER_CONCURRENCY, WORKER_MODE, ...).
Exit codes: 0 clean stop, 1 failure, 2 configuration or usage error.`

/**
 * What the command line asks for.
 *
 * @since 0.1.0
 * @category models
 */
export type Invocation =
  | { readonly _tag: "Help" }
  | { readonly _tag: "Version" }
  | {
    readonly _tag: "Run"
    readonly module: string
    readonly exportName: string
    readonly memory: boolean
  }

const EXPORT_NAME = /^[A-Za-z_$][\w$]*$/

/**
 * Reads the arguments, or says in one line what is wrong with them.
 *
 * @since 0.1.0
 * @category parsing
 */
export const parse = (argv: ReadonlyArray<string>): Either.Either<Invocation, string> => {
  if (argv.some((a) => a === "-h" || a === "--help")) return Either.right({ _tag: "Help" })
  if (argv.some((a) => a === "-V" || a === "--version")) return Either.right({ _tag: "Version" })
  const [command, ...rest] = argv
  if (command === undefined) return Either.left("missing command: expected run <module>")
  if (command !== "run") return Either.left(`unknown command "${command}": expected run`)
  let memory = false
  const positional: Array<string> = []
  for (const arg of rest) {
    if (arg === "--memory") memory = true
    else if (arg.startsWith("-")) return Either.left(`unknown option "${arg}"`)
    else positional.push(arg)
  }
  if (positional.length === 0) return Either.left("run needs a module, such as ./worker.ts")
  if (positional.length > 1) {
    return Either.left(`run takes one module, got ${positional.length}`)
  }
  const spec = positional[0]!
  const colon = spec.lastIndexOf(":")
  const suffix = spec.slice(colon + 1)
  // `C:\\dir\\w.ts` or `file:///w.ts` keep their colon: only a trailing identifier names an export.
  const named = colon > 0 && EXPORT_NAME.test(suffix)
  return Either.right({
    _tag: "Run",
    module: named ? spec.slice(0, colon) : spec,
    exportName: named ? suffix : "worker",
    memory,
  })
}

const isWorker = (u: unknown): u is Worker.Any =>
  typeof u === "object" && u !== null && (u as { _tag?: unknown })._tag === "Worker"

/**
 * Imports `module` and returns its worker, calling a factory export.
 *
 * @since 0.1.0
 * @category loading
 */
export const load = (
  cwd: string,
  module: string,
  exportName: string,
): Effect.Effect<Worker.Any, string> =>
  Effect.gen(function* () {
    const url = module.startsWith("file:") ? module : pathToFileURL(resolve(cwd, module)).href
    const loaded = yield* Effect.tryPromise({
      try: () => import(url) as Promise<Record<string, unknown>>,
      catch: (e) => `cannot load ${module}: ${firstLine(e)}`,
    })
    const exported = loaded[exportName]
    if (exported === undefined) {
      return yield* Effect.fail(`${module} has no export named "${exportName}"`)
    }
    if (isWorker(exported)) return exported
    if (typeof exported === "function" && exported.length === 0) {
      const made = yield* Effect.tryPromise({
        try: async () => await (exported as () => unknown)(),
        catch: (e) => `the factory "${exportName}" of ${module} failed: ${firstLine(e)}`,
      })
      if (isWorker(made)) return made
    }
    return yield* Effect.fail(
      `the export "${exportName}" of ${module} is not a worker (made with Worker.make) nor a ` +
        "function of no arguments returning one",
    )
  })

/**
 * The command, from the process's arguments to its exit code.
 *
 * @since 0.1.0
 * @category running
 */
export const main: Effect.Effect<ExitCode, never, Process> = Effect.gen(function* () {
  const process = yield* Process
  const invocation = parse(process.argv)
  if (Either.isLeft(invocation)) {
    yield* process.writeErr(`async-task-worker: ${invocation.left} (see --help)`)
    return 2
  }
  switch (invocation.right._tag) {
    case "Help":
      yield* process.writeOut(USAGE)
      return 0
    case "Version":
      yield* process.writeOut(VERSION)
      return 0
    case "Run": {
      const { exportName, memory, module } = invocation.right
      const worker = yield* Effect.either(load(process.cwd, module, exportName))
      if (Either.isLeft(worker)) {
        yield* process.writeErr(`async-task-worker: ${worker.left}`)
        return 2
      }
      // A worker whose handler needs services must be run by code that provides them.
      return yield* Lifecycle.run(
        worker.right as Worker.Worker<unknown, unknown, unknown, never>,
        { settings: memory ? { transport: "memory" } : {} },
      )
    }
  }
})
