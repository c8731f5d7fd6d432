/**
 * What a handler knows about the task it runs, and how it reports progress.
 *
 * @since 0.1.0
 */
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import type * as LogLevel from "effect/LogLevel"
import * as References from "effect/References"
import { taskStore } from "./internal/taskStore.ts"

/**
 * A progress report: an Effect for Effect handlers (`yield* ctx.progress(0.5)`), and a
 * thenable for `async` handlers (`await ctx.progress(0.5)`). Like every Effect it does nothing
 * until it is run or awaited. It never fails: a rejected or failed report is dropped and
 * counted.
 *
 * @since 0.1.0
 * @category models
 */
export type Progress = Effect.Effect<void> & PromiseLike<void>

/**
 * The context a handler receives with its input. `signal` and `logger` are made when first
 * read, as getters of the context's class: a spread (`{ ...ctx }`) does not copy them, so pass
 * the context itself on.
 *
 * @since 0.1.0
 * @category models
 */
export interface TaskContext {
  readonly taskId: string
  /** 1 for the first attempt: the broker's count of failed deliveries plus one. */
  readonly attempt: number
  /** The last attempt: a `RetryableError` then concludes the task. */
  readonly deliveryLimit: number
  /**
   * The message's deliveries, this one included: above `attempt` where the broker counts
   * deliveries that did not fail apart (RabbitMQ 4's `x-acquired-count` plus one: a shutdown's
   * requeue), else `attempt`. Since 0.3.0.
   */
  readonly deliveries: number
  readonly clientId: string | undefined
  readonly inputRefs: ReadonlyArray<string>
  /**
   * When the task's time limit ends, in milliseconds since the epoch by the worker's clock
   * (`Date.now()`'s): a handler that can stop early with a partial result does so before it,
   * as `signal` fires at it. `Infinity` for a context made without one. Since 0.3.0.
   */
  readonly deadline: number
  /**
   * The worker running the task: `HOSTNAME` (what `started` tells the platform; the pod's name
   * under Kubernetes) and the process id, as `count-words-7d9f:1`. Since 0.3.0.
   */
  readonly workerId: string
  /**
   * Fires when the task must stop: its time limit, a lost lease, or shutdown. Effect handlers
   * are interrupted as well; `async` handlers should pass it on (to `fetch`, child processes).
   */
  readonly signal: AbortSignal
  /**
   * Reports the task's latest state: `fraction` in `[0, 1)`, never lower than before, and an
   * optional JSON object. Throttled: at most one message per interval, the newest wins.
   */
  readonly progress: (fraction: number, payload?: Readonly<Record<string, unknown>>) => Progress
  /**
   * Logs through the worker's logger with the task's `task_id`, `service` and `attempt`: for
   * `async` handlers (an Effect handler's own `Effect.log` lines carry them already).
   */
  readonly logger: TaskLogger
}

/**
 * A task's logger; `fields` are added to the line.
 *
 * @since 0.1.0
 * @category models
 */
export interface TaskLogger {
  readonly debug: (message: string, fields?: Readonly<Record<string, unknown>>) => void
  readonly info: (message: string, fields?: Readonly<Record<string, unknown>>) => void
  readonly warn: (message: string, fields?: Readonly<Record<string, unknown>>) => void
  readonly error: (message: string, fields?: Readonly<Record<string, unknown>>) => void
}

/**
 * A task's logger, logging with the loggers, level and annotations of `context` (the engine's,
 * as `Effect.context()` gives it).
 *
 * @since 0.1.0
 * @category logging
 */
export const makeLogger = (
  info: TaskInfo & { readonly service: string },
  context: Context.Context<never>,
): TaskLogger => {
  const run = Effect.runSyncWith(context)
  const at =
    (level: LogLevel.Severity) => (message: string, fields?: Readonly<Record<string, unknown>>) =>
      run(
        Effect.logWithLevel(level)(message).pipe(
          Effect.annotateLogs({
            ...fields,
            service: info.service,
            task_id: info.taskId,
            attempt: info.attempt,
          }),
        ),
      )
  return { debug: at("Debug"), info: at("Info"), warn: at("Warn"), error: at("Error") }
}

/**
 * The fields of a context that do not depend on the engine.
 *
 * @since 0.1.0
 * @category models
 */
export interface TaskInfo {
  readonly taskId: string
  readonly attempt: number
  readonly deliveryLimit: number
  /** The deliveries, where the broker counts them apart; `attempt` otherwise. Since 0.3.0. */
  readonly deliveries?: number | undefined
  readonly clientId: string | undefined
  readonly inputRefs: ReadonlyArray<string>
  /** When the time limit ends (ms since the epoch); none: `Infinity`. Since 0.3.0. */
  readonly deadline?: number | undefined
  /** The worker's id; none: `"test"`. Since 0.3.0. */
  readonly workerId?: string | undefined
}

/**
 * Makes `effect` awaitable as well, run with `context` (as `Effect.context()` gives it) when
 * awaited.
 *
 * @since 0.1.0
 * @category constructors
 */
export const awaitable = <R>(
  effect: Effect.Effect<void, never, R>,
  context: Context.Context<R>,
): Progress => {
  const progress = Effect.suspend(() => effect) as unknown as Progress & {
    then: PromiseLike<void>["then"]
  }
  progress.then = (onFulfilled, onRejected) =>
    Effect.runPromiseWith(context)(effect).then(onFulfilled, onRejected)
  return progress
}

/**
 * A task's context. `signal` and `logger` are made when first read (an `AbortController` costs
 * microseconds on Node, and most Effect handlers never read it), by getters of the class rather
 * than of each context: an object literal with getters of its own cost more to make on Deno and
 * on Node, per task (`bench/engine.ts`; the figures are in `bench/README.md`). So a spread
 * (`{ ...ctx }`) does not copy them: pass the context itself on, or name its fields.
 */
class Live implements TaskContext {
  readonly taskId: string
  readonly attempt: number
  readonly deliveryLimit: number
  readonly deliveries: number
  readonly clientId: string | undefined
  readonly inputRefs: ReadonlyArray<string>
  readonly deadline: number
  readonly workerId: string
  readonly progress: TaskContext["progress"]
  readonly #makeLogger: (info: TaskInfo) => TaskLogger
  #controller: AbortController | undefined = undefined
  #logger: TaskLogger | undefined = undefined
  #abortedWith: string | undefined = undefined

  constructor(
    info: TaskInfo,
    progress: TaskContext["progress"],
    makeLogger: (info: TaskInfo) => TaskLogger,
  ) {
    this.taskId = info.taskId
    this.attempt = info.attempt
    this.deliveryLimit = info.deliveryLimit
    this.deliveries = info.deliveries ?? info.attempt
    this.clientId = info.clientId
    this.inputRefs = info.inputRefs
    this.deadline = info.deadline ?? Number.POSITIVE_INFINITY
    this.workerId = info.workerId ?? "test"
    this.progress = progress
    this.#makeLogger = makeLogger
  }

  get logger(): TaskLogger {
    // The context is a TaskInfo itself.
    return (this.#logger ??= this.#makeLogger(this))
  }

  get signal(): AbortSignal {
    if (this.#controller === undefined) {
      this.#controller = new AbortController()
      if (this.#abortedWith !== undefined) this.#controller.abort(this.#abortedWith)
    }
    return this.#controller.signal
  }

  static abort(context: Live, reason: string): void {
    if (context.#abortedWith !== undefined) return
    context.#abortedWith = reason
    context.#controller?.abort(reason)
  }
}

/**
 * A context and the means to fire its signal. The `AbortController` is made only when a
 * handler reads `signal`, as most Effect handlers never do.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  info: TaskInfo,
  progress: TaskContext["progress"],
  makeLogger: (info: TaskInfo) => TaskLogger,
): { readonly context: TaskContext; readonly abort: (reason: string) => void } => {
  const context = new Live(info, progress, makeLogger)
  return { context, abort: (reason) => Live.abort(context, reason) }
}

/**
 * The fields every line about a task carries, as the worker's own lines name them.
 *
 * @since 0.3.0
 * @category logging
 */
export interface LogFields {
  readonly task_id: string
  readonly service: string
  readonly attempt?: number
}

/**
 * The task being run where this is called, as its log fields: a library's logger (pino's
 * `mixin`, a winston format, a `console` wrapper) adds them to its lines as the worker's own
 * lines have them. `{}` outside a task. Read from the running fiber's log annotations (an Effect
 * handler, and the fibers it forks), else from the async context the engine runs the handler
 * in (an `async` handler's awaits and callbacks, an Effect handler's Promises).
 *
 * @since 0.3.0
 * @category logging
 */
export const logFields = (): Partial<LogFields> => {
  const annotations = Fiber.getCurrent()?.getRef(References.CurrentLogAnnotations)
  const found = annotations?.task_id !== undefined ? annotations : taskStore.getStore()
  if (found === undefined) return {}
  const fields: { task_id: string; service: string; attempt?: number } = {
    task_id: found.task_id as string,
    service: found.service as string,
  }
  if (found.attempt !== undefined) fields.attempt = found.attempt as number
  return fields
}
