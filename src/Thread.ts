/**
 * Handlers that run on threads: CPU-bound work (scoring, parsing, a synchronous library) off the
 * event loop, so that heartbeats, publish confirms, progress and probes go on while it computes.
 * The definition keeps its schemas, name, timeout and errors; the module holds the computation:
 *
 * ```ts
 * // score.ts: runs on a thread, gets the input as decoded and the task's context
 * export const score = (input: { text: string }, ctx: ThreadContext) => ({ score: heavy(input.text) })
 *
 * // worker.ts
 * Worker.make({ name, input, output, timeout, handler: Thread.handler(new URL("./score.ts", import.meta.url), "score") })
 * ```
 *
 * The engine runs a pool of at most the worker's concurrency of threads (`node:worker_threads`,
 * on Node and Deno), reused between tasks. A task stopped by its time limit, a lost lease or the
 * end of the drain asks its thread to stop and terminates it half a second later, so that even a
 * handler that never yields gives its slot back; a thread that dies fails its task alone
 * (`THREAD_OUT_OF_MEMORY`, `THREAD_CRASHED`, `THREAD_EXITED`) and is replaced.
 *
 * @since 0.3.0
 */
import { isAbsolute } from "node:path"
import { pathToFileURL } from "node:url"
import * as Effect from "effect/Effect"
import { CurrentThreadPool } from "./internal/thread/pool.ts"
import { marked } from "./internal/thread/spec.ts"
import type { TaskContext } from "./TaskContext.ts"
import type { Handler } from "./WorkerDefinition.ts"
import { WorkerDefinitionError } from "./WorkerError.ts"

/**
 * The context a threaded handler gets on its thread: the task's plain values, its `signal` (fired
 * when the task must stop; the thread is terminated soon after), `progress` (throttled on the
 * worker's side, as ever) and `logger` (lines in the worker's log, with the task's fields).
 *
 * @since 0.3.0
 * @category models
 */
export type ThreadContext =
  & Pick<
    TaskContext,
    | "taskId"
    | "attempt"
    | "deliveryLimit"
    | "deliveries"
    | "clientId"
    | "inputRefs"
    | "signal"
    | "logger"
  >
  & {
    readonly progress: (
      fraction: number,
      payload?: Readonly<Record<string, unknown>>,
    ) => Promise<void>
  }

/**
 * Options of a threaded handler.
 *
 * @since 0.3.0
 * @category models
 */
export interface ThreadOptions {
  /**
   * Tasks a thread runs before it is replaced, as Celery's `max-tasks-per-child`: for a library
   * that leaks. Default: no limit.
   */
  readonly maxTasks?: number | undefined
  /**
   * A thread's heap, in MiB (Node's `resourceLimits.maxOldGenerationSizeMb`): a task that needs
   * more fails `THREAD_OUT_OF_MEMORY` and its thread is replaced. Deno takes the option but did
   * not stop a thread past it in our tests: there only the process's limit holds. Default: V8's.
   */
  readonly maxMemoryMb?: number | undefined
}

export type { ThreadSpec } from "./internal/thread/spec.ts"

const isPositiveInteger = (n: unknown): boolean =>
  typeof n === "number" && Number.isInteger(n) && n >= 1

/** The module's `file:` URL: a URL, or an absolute path. */
const urlOf = (module: URL | string): string => {
  if (module instanceof URL) return module.href
  if (module.startsWith("file:")) return module
  if (isAbsolute(module)) return pathToFileURL(module).href
  throw new WorkerDefinitionError({
    message: `The threaded handler's module "${module}" is relative: give it as ` +
      `new URL("${module}", import.meta.url), or as an absolute path.`,
  })
}

/**
 * A handler that runs `exportName` of `module` on a thread of the worker's pool: a function
 * `(input, ctx: ThreadContext) => output`, synchronous or `async`, that may throw `FatalError` or
 * `RetryableError` (their meaning kept across the thread's boundary; a `RetryableError`'s
 * `delay` as seconds or a duration's text); any other error reaches the definition's `retryOn`
 * rebuilt (see `Transient.Rule`). The input, the output and progress payloads cross by
 * structured clone. Throws `WorkerDefinitionError` for a relative module path or an invalid
 * option; a module that cannot load, or has no such export, fails the worker's start.
 *
 * @since 0.3.0
 * @category constructors
 */
export const handler = <A, O>(
  module: URL | string,
  exportName: string = "default",
  options: ThreadOptions = {},
): Handler<A, O, never> => {
  if (options.maxTasks !== undefined && !isPositiveInteger(options.maxTasks)) {
    throw new WorkerDefinitionError({ message: "A thread's maxTasks must be a positive integer." })
  }
  if (options.maxMemoryMb !== undefined && !isPositiveInteger(options.maxMemoryMb)) {
    throw new WorkerDefinitionError({
      message: "A thread's maxMemoryMb must be a positive integer.",
    })
  }
  const spec = {
    module: urlOf(module),
    exportName,
    maxTasks: options.maxTasks,
    maxMemoryMb: options.maxMemoryMb,
  }
  const run = (input: A, ctx: TaskContext) =>
    Effect.flatMap(
      CurrentThreadPool,
      (pool) =>
        pool === undefined
          ? Effect.die(new Error("A threaded handler runs in a worker's engine, on its threads"))
          : pool.run(input, ctx),
    ) as Effect.Effect<O, unknown>
  return marked(run, spec)
}
