/**
 * The `async-task-worker` command: `run <module>[:export]` loads a worker from a module and runs
 * it as the process. The entry point is `cli.ts`; this module is its testable logic.
 *
 * @since 0.1.0
 */
import { resolve } from "node:path"
import { versions } from "node:process"
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

A TypeScript module runs as it is on Node 22.18+ (22.6+ with --experimental-strip-types)
and Deno; on an older Node, compile it to JavaScript first.

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

const codeOf = (u: unknown): unknown => {
  try {
    return typeof u === "object" && u !== null ? (u as { code?: unknown }).code : undefined
  } catch {
    return undefined
  }
}

const COMPILE = "or compile it with tsc and run the .js"

/**
 * Why this Node cannot import the TypeScript module `module`, and how to run it instead, in one
 * line; `undefined` when `error` is not about TypeScript. The import's own error decides, not
 * the version: `ERR_UNKNOWN_FILE_EXTENSION` for a `.ts`, `.mts` or `.cts` (a Node that strips
 * no types: before 22.6, 22.6 – 22.17 without `--experimental-strip-types`, or with
 * `--no-experimental-strip-types`), `ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING` (a file under
 * `node_modules`) and `ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX` (an enum, a namespace: syntax that
 * stripping cannot remove). `node` is the running Node's version, which only words the advice.
 *
 * @since 0.1.0
 * @category loading
 */
export const typeScriptHint = (
  error: unknown,
  module: string,
  node: string | undefined = versions.node,
): string | undefined => {
  const code = codeOf(error)
  const message = firstLine(error)
  const prefix = `cannot load ${module}:`
  switch (code) {
    case "ERR_UNKNOWN_FILE_EXTENSION": {
      const extension = /"(\.[cm]?ts)"/.exec(message)?.[1]
      if (extension === undefined) return undefined
      const [major = 0, minor = 0] = (node ?? "0").split(".").map(Number)
      const v = `Node v${node ?? "?"}`
      if (major > 22 || (major === 22 && minor >= 18)) {
        return `${prefix} ${v} strips no types from ${extension} files, as it runs with ` +
          `--no-experimental-strip-types: run it without that flag, ${COMPILE}`
      }
      if (major === 22 && minor >= 6) {
        return `${prefix} ${v} runs ${extension} files only with --experimental-strip-types: ` +
          `NODE_OPTIONS=--experimental-strip-types async-task-worker run ${module}, or use ` +
          `Node 22.18+ or 24, or Deno, ${COMPILE}`
      }
      return `${prefix} ${v} cannot run TypeScript (${extension}): run it on Node 22.18+ or 24, ` +
        `or on Deno, ${COMPILE}`
    }
    case "ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING": {
      const file = /for "([^"]+)"/.exec(message)?.[1] ?? "a TypeScript file"
      return `${prefix} Node strips types only outside node_modules, and ${file} is inside: ` +
        `compile it to JavaScript, or run the worker on Deno`
    }
    case "ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX":
      return `${prefix} ${message}: Node's type stripping only erases types; use ` +
        `NODE_OPTIONS=--experimental-transform-types, ${COMPILE}`
    default:
      return undefined
  }
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
      catch: (e) => typeScriptHint(e, module) ?? `cannot load ${module}: ${firstLine(e)}`,
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
