/**
 * The `async-task-worker` command: `run <module>[:export]` loads a worker from a module and runs
 * it as the process; `conformance` checks a running worker against the protocol. The entry point
 * is `cli.ts`; this module is its testable logic.
 *
 * @since 0.1.0
 */
import { resolve } from "node:path"
import { versions } from "node:process"
import { fileURLToPath, pathToFileURL } from "node:url"
import * as Effect from "effect/Effect"
import * as Result from "effect/Result"
import { firstLine } from "./internal/describe.ts"
import { vhostOf } from "./internal/conformance/unacked.ts"
import { EmbeddedBrokerHint } from "./internal/lifecycle/process.ts"
import { VERSION } from "./internal/version.ts"
import * as Conformance from "./Conformance.ts"
import * as Lifecycle from "./Lifecycle.ts"
import { type ExitCode, missingRead, Process } from "./Process.ts"
import type * as Worker from "./WorkerDefinition.ts"

/**
 * The command's help.
 *
 * @since 0.1.0
 * @category constants
 */
export const USAGE = `Usage: async-task-worker run <module>[:export] [--memory]
       async-task-worker conformance --broker <url> --service <name> [options]

Runs the worker exported by <module> (default export name: worker) until SIGTERM or SIGINT.
The export is a worker made with Worker.make, or a function of no arguments returning one
(or a Promise of one).

Options:
  --memory       run on the embedded broker (as WORKER_TRANSPORT=memory): each line of
                 standard input is a task, each message published is printed
  -h, --help     show this help
  -V, --version  show the SDK's version

A TypeScript module runs as it is: Node (22.19 or later) strips its types, Deno reads it.

Settings come from the environment (BROKER_URL, WORKER_CONCURRENCY, WORKER_MODE, ...).
Exit codes: 0 clean stop, 1 failure, 2 configuration or usage error.

conformance checks a worker of any SDK, running the conformance workload (docs/conformance.md)
and consuming <name>_queue_in, against the protocol: a report line per rule.
  --in-queue, --out-queue Q   the queues, if not <name>_queue_in and <name>_queue_out
  --delivery-limit N          the worker's WORKER_DELIVERY_LIMIT (5)
  --max-message-bytes N       its WORKER_MAX_MESSAGE_BYTES (16777216)
  --progress-interval S       its WORKER_PROGRESS_MIN_INTERVAL_S (1)
  --timeout S                 its task time limit (8)
  --management URL            RabbitMQ's management API, for the unacked count (found
                              from the broker's host and port when not given)
  --rabbitmqctl               the unacked count from rabbitmqctl, for a broker on this host
Exit codes: 0 every rule passed, 1 a rule failed or was not observable, 2 usage or broker.`

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
  | {
    readonly _tag: "Conformance"
    readonly options: Omit<Conformance.ConformanceOptions, "unacked" | "log">
    /** Where the unacked count comes from: the management API's URL, or rabbitmqctl. */
    readonly unacked: { readonly management: string } | "rabbitmqctl" | undefined
  }

const EXPORT_NAME = /^[A-Za-z_$][\w$]*$/

/**
 * Reads the arguments, or says in one line what is wrong with them.
 *
 * @since 0.1.0
 * @category codecs
 */
export const parse = (argv: ReadonlyArray<string>): Result.Result<Invocation, string> => {
  if (argv.some((a) => a === "-h" || a === "--help")) return Result.succeed({ _tag: "Help" })
  if (argv.some((a) => a === "-V" || a === "--version")) return Result.succeed({ _tag: "Version" })
  const [command, ...rest] = argv
  if (command === undefined) return Result.fail("missing command: expected run <module>")
  if (command === "conformance") return parseConformance(rest)
  if (command !== "run") {
    return Result.fail(`unknown command "${command}": expected run or conformance`)
  }
  let memory = false
  const positional: Array<string> = []
  for (const arg of rest) {
    if (arg === "--memory") memory = true
    else if (arg.startsWith("-")) return Result.fail(`unknown option "${arg}"`)
    else positional.push(arg)
  }
  if (positional.length === 0) return Result.fail("run needs a module, such as ./worker.ts")
  if (positional.length > 1) {
    return Result.fail(`run takes one module, got ${positional.length}`)
  }
  const spec = positional[0]!
  const colon = spec.lastIndexOf(":")
  const suffix = spec.slice(colon + 1)
  // `C:\\dir\\w.ts` or `file:///w.ts` keep their colon: only a trailing identifier names an export.
  const named = colon > 0 && EXPORT_NAME.test(suffix)
  return Result.succeed({
    _tag: "Run",
    module: named ? spec.slice(0, colon) : spec,
    exportName: named ? suffix : "worker",
    memory,
  })
}

/** The options of `conformance` that take a value, and what each sets. */
const CONFORMANCE_VALUES = {
  "--broker": "brokerUrl",
  "--service": "service",
  "--in-queue": "inQueue",
  "--out-queue": "outQueue",
  "--delivery-limit": "deliveryLimit",
  "--max-message-bytes": "maxMessageBytes",
  "--progress-interval": "progressIntervalS",
  "--timeout": "taskTimeoutS",
  "--management": "management",
} as const

/** What each number must be: whole (a count, bytes), or any positive number of seconds. */
const NUMBERS: Record<string, "whole" | "seconds"> = {
  deliveryLimit: "whole",
  maxMessageBytes: "whole",
  progressIntervalS: "seconds",
  taskTimeoutS: "seconds",
}

/** A number option's value, or what is wrong with it. */
const numberOf = (
  arg: string,
  value: string,
  kind: "whole" | "seconds",
): Result.Result<number, string> => {
  const n = /^\d+(\.\d+)?$/.test(value) ? Number(value) : NaN
  if (kind === "whole" ? Number.isInteger(n) && n >= 1 : n > 0) return Result.succeed(n)
  return Result.fail(
    `${arg} needs ${kind === "whole" ? "a whole number from 1" : "a number of seconds above 0"}, ` +
      `not "${value}"`,
  )
}

const parseConformance = (args: ReadonlyArray<string>): Result.Result<Invocation, string> => {
  const values: Record<string, string | number> = {}
  let rabbitmqctl = false
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!
    if (arg === "--rabbitmqctl") {
      rabbitmqctl = true
      continue
    }
    const key = CONFORMANCE_VALUES[arg as keyof typeof CONFORMANCE_VALUES]
    if (key === undefined) return Result.fail(`unknown option "${arg}" of conformance`)
    if (key in values) return Result.fail(`${arg} is given twice`)
    const value = args[++i]
    if (value === undefined) return Result.fail(`${arg} needs a value`)
    const kind = NUMBERS[key]
    if (kind === undefined) {
      values[key] = value
      continue
    }
    const n = numberOf(arg, value, kind)
    if (Result.isFailure(n)) return Result.fail(n.failure)
    values[key] = n.success
  }
  const { brokerUrl, service, management, ...rest } = values
  if (typeof brokerUrl !== "string") return Result.fail("conformance needs --broker <url>")
  if (!URL.canParse(brokerUrl)) return Result.fail(`--broker needs an AMQP URL, not "${brokerUrl}"`)
  if (typeof service !== "string") return Result.fail("conformance needs --service <name>")
  if (management !== undefined && rabbitmqctl) {
    return Result.fail("--management and --rabbitmqctl both tell the unacked count: give one")
  }
  return Result.succeed({
    _tag: "Conformance",
    options: { brokerUrl, service, ...rest },
    unacked: typeof management === "string"
      ? { management }
      : rabbitmqctl
      ? "rabbitmqctl"
      : undefined,
  })
}

/** The vhost of an AMQP URL: its path, or RabbitMQ's default. */

/** Runs the conformance kit, printing its report: 0 when every rule passed. */
const conformance = (
  invocation: Extract<Invocation, { _tag: "Conformance" }>,
): Effect.Effect<ExitCode, never, Process> =>
  Effect.gen(function* () {
    const process = yield* Process
    const { options, unacked } = invocation
    const inQueue = options.inQueue ?? `${options.service}_queue_in`
    const vhost = vhostOf(options.brokerUrl)
    const report = yield* Effect.result(Conformance.check({
      ...options,
      unacked: unacked === undefined
        ? undefined
        : unacked === "rabbitmqctl"
        ? Conformance.rabbitmqctlUnacked(vhost, inQueue)
        : Conformance.managementUnacked(unacked.management, vhost, inQueue),
      log: (line) => Effect.runSync(process.writeErr(line)),
    }))
    if (Result.isFailure(report)) {
      yield* process.writeErr(`async-task-worker conformance: ${report.failure.message}`)
      return 2
    }
    yield* process.writeOut(Conformance.format(report.success))
    return report.success.passed ? 0 : 1
  })

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
 * line; `undefined` when `error` is not about TypeScript. The import's own error decides:
 * `ERR_UNKNOWN_FILE_EXTENSION` for a `.ts`, `.mts` or `.cts` (on the Nodes the SDK supports,
 * 22.19+, only a Node run with `--no-experimental-strip-types` strips no types: the CLI refuses
 * an older one before it loads anything), `ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING` (a file
 * under `node_modules`) and `ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX` (an enum, a namespace: syntax
 * that stripping cannot remove). `node` is the running Node's version, named in the line.
 *
 * @since 0.1.0
 * @category constructors
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
      return `${prefix} Node v${node ?? "?"} strips no types from ${extension} files, as it ` +
        `runs with --no-experimental-strip-types: run it without that flag, ${COMPILE}`
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

/** The most export names a missing export's message lists. */
const LISTED_EXPORTS = 8

const isWorkerExport = (loaded: Record<string, unknown>, name: string): boolean => {
  try {
    return isWorker(loaded[name])
  } catch {
    // An export still in its temporal dead zone (an import cycle), or a Proxy: not a worker.
    return false
  }
}

/**
 * What `module` exports that `run <module>:<export>` could name, workers first (the others may
 * be factories, which only calling them would tell), by name, at most {@link LISTED_EXPORTS}.
 */
const exportsOf = (loaded: Record<string, unknown>): string => {
  // Sorted, as a module namespace has them: a bundler's or a test runner's object may not.
  const names = Object.keys(loaded).filter((name) => EXPORT_NAME.test(name)).sort()
  if (names.length === 0) return "it exports nothing"
  const workers = names.filter((name) => isWorkerExport(loaded, name))
  const shown = [...workers, ...names.filter((name) => !workers.includes(name))].slice(
    0,
    LISTED_EXPORTS,
  )
  const others = shown.slice(workers.length)
  const parts = [
    workers.length === 0
      ? "it exports no worker"
      : `its workers: ${shown.slice(0, workers.length).join(", ")}`,
  ]
  if (others.length > 0) {
    parts.push(
      `${workers.length === 0 ? "its exports" : "its other exports"}: ${others.join(", ")}`,
    )
  }
  const more = names.length - shown.length
  return parts.join("; ") + (more > 0 ? `, and ${more} more` : "")
}

/**
 * Imports `module` and returns its worker, calling a factory export.
 *
 * @since 0.1.0
 * @category constructors
 */
export const load = (
  cwd: string,
  module: string,
  exportName: string,
): Effect.Effect<Worker.Any, string> =>
  Effect.gen(function* () {
    const url = module.startsWith("file:") ? module : pathToFileURL(resolve(cwd, module)).href
    // Deno would name the first permission it refuses, with its broad flag: all of them, here.
    const missing = missingRead(fileURLToPath(url))
    if (missing !== undefined) return yield* Effect.fail(`cannot load ${module}: ${missing}`)
    const loaded = yield* Effect.tryPromise({
      try: () => import(url) as Promise<Record<string, unknown>>,
      catch: (e) => typeScriptHint(e, module) ?? `cannot load ${module}: ${firstLine(e)}`,
    })
    const exported = loaded[exportName]
    if (exported === undefined) {
      return yield* Effect.fail(
        `${module} has no export named "${exportName}" (${exportsOf(loaded)})`,
      )
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
  if (Result.isFailure(invocation)) {
    yield* process.writeErr(`async-task-worker: ${invocation.failure} (see --help)`)
    return 2
  }
  switch (invocation.success._tag) {
    case "Help":
      yield* process.writeOut(USAGE)
      return 0
    case "Version":
      yield* process.writeOut(VERSION)
      return 0
    case "Conformance":
      return yield* conformance(invocation.success)
    case "Run": {
      const { exportName, memory, module } = invocation.success
      const worker = yield* Effect.result(load(process.cwd, module, exportName))
      if (Result.isFailure(worker)) {
        yield* process.writeErr(`async-task-worker: ${worker.failure}`)
        return 2
      }
      // A worker whose handler needs services must be run by code that provides them.
      return yield* Lifecycle.run(
        worker.success as Worker.Worker<unknown, unknown, unknown, never>,
        { settings: memory ? { transport: "memory" } : {} },
      ).pipe(Effect.provideService(EmbeddedBrokerHint, "--memory (WORKER_TRANSPORT=memory)"))
    }
  }
})
