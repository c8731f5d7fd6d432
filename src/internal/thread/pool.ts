/**
 * The threads of a threaded handler (`Thread.handler`): a pool of `node:worker_threads` (Node and
 * Deno alike), at most as many as the worker's concurrency, each running one task at a time and
 * reused, recycled after `maxTasks` tasks, bounded by `maxMemoryMb` where the runtime bounds a
 * thread's heap (Node's `resourceLimits`). A task interrupted (its time limit, a lost lease, the
 * end of the drain) asks its thread to stop, then terminates it: a handler that never yields
 * cannot hold its slot. A thread that dies fails its task alone, with its own code.
 */
import { Worker as NodeWorker } from "node:worker_threads"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import type * as Scope from "effect/Scope"
import { logFields, type TaskContext } from "../../TaskContext.ts"
import { FatalError, RetryableError, WorkerDefinitionError } from "../../WorkerError.ts"
import { BOOTSTRAP } from "./bootstrap.ts"
import type { ThreadSpec } from "./spec.ts"

/** How long an interrupted task's thread may take to stop by itself before it is terminated. */
const STOP_GRACE = Duration.millis(500)

/** What a thread says, and what becomes of it. */
type ThreadEvent =
  | { readonly type: "ready" }
  | { readonly type: "load_failed"; readonly message: string }
  | {
    readonly type: "progress"
    readonly task: number
    readonly fraction: number
    readonly payload?: Readonly<Record<string, unknown>> | undefined
  }
  | {
    readonly type: "log"
    readonly task: number
    readonly level: "debug" | "info" | "warn" | "error"
    readonly message: string
    readonly fields?: Readonly<Record<string, unknown>> | undefined
  }
  | { readonly type: "done"; readonly task: number; readonly output: unknown }
  | { readonly type: "failed"; readonly task: number; readonly error: ThreadError }
  | { readonly type: "died"; readonly code: string; readonly message: string }

/** An error as it left its thread (see the bootstrap's `describe`). */
type ThreadError =
  | {
    readonly _tag: "FatalError" | "RetryableError"
    readonly code?: string | undefined
    readonly message?: string | undefined
    readonly delay?: number | string | undefined
    readonly congestion?: boolean | undefined
  }
  | ({ readonly _tag: "Error" } & CrossedError)

/** An ordinary error as it left its thread: what a definition's `retryOn` rules may read. */
interface CrossedError {
  readonly name: string
  readonly message: string
  readonly stack?: string | undefined
  /** Its own fields of plain values: `code`, `errno`, `status`, … */
  readonly fields?: Readonly<Record<string, string | number | boolean>> | undefined
  readonly headers?: Readonly<Record<string, string | number | boolean>> | undefined
  readonly response?: {
    readonly status?: unknown
    readonly statusCode?: unknown
    readonly headers?: Readonly<Record<string, string | number | boolean>> | undefined
  } | undefined
  readonly cause?: CrossedError | string | number | boolean | undefined
  readonly errors?: ReadonlyArray<CrossedError> | undefined
}

/** One thread, and whoever listens to it now: the task it runs, or its start. */
interface PoolThread {
  readonly worker: NodeWorker
  /** The tasks it ran; the one it runs now is the last, whose events alone are heard. */
  tasks: number
  dead: boolean
  listener: ((event: ThreadEvent) => void) | undefined
}

// The classes of the errors a rule may test with `instanceof`, rebuilt as such.
const STANDARD: Readonly<Record<string, new (message: string) => Error>> = {
  TypeError,
  RangeError,
  SyntaxError,
  ReferenceError,
  EvalError,
  URIError,
}

/** An ordinary error rebuilt from what crossed: its class if standard, else an `Error`. */
const rebuilt = (crossed: CrossedError): Error => {
  const error = new (STANDARD[crossed.name] ?? Error)(crossed.message)
  Object.assign(error, crossed.fields)
  error.name = crossed.name
  if (crossed.stack !== undefined) error.stack = crossed.stack
  const extra: Record<string, unknown> = {}
  if (crossed.headers !== undefined) extra.headers = crossed.headers
  if (crossed.response !== undefined) extra.response = crossed.response
  if (crossed.errors !== undefined) extra.errors = crossed.errors.map(rebuilt)
  if (crossed.cause !== undefined) {
    extra.cause = typeof crossed.cause === "object" ? rebuilt(crossed.cause) : crossed.cause
  }
  return Object.assign(error, extra)
}

/** The error a thread's handler failed with, as the engine reads it on this side. */
const errorOf = (error: ThreadError): unknown => {
  if (error._tag === "Error") return rebuilt(error)
  return error._tag === "FatalError"
    ? new FatalError({ code: String(error.code), message: String(error.message ?? "") })
    : new RetryableError({
      code: error.code,
      message: error.message,
      // Seconds, or a duration's text: what crosses a thread of `Duration.Input`.
      delay: error.delay as Duration.Input | undefined,
      congestion: error.congestion,
    })
}

/** Why a thread died, as the failure of the task it ran. */
const deathOf = (error: unknown): { readonly code: string; readonly message: string } =>
  (error as { code?: unknown } | undefined)?.code === "ERR_WORKER_OUT_OF_MEMORY"
    ? { code: "THREAD_OUT_OF_MEMORY", message: "The task's thread ran out of memory." }
    : error === undefined
    ? { code: "THREAD_EXITED", message: "The task's thread exited before the task ended." }
    : { code: "THREAD_CRASHED", message: "The task's thread failed outside the task." }

/**
 * A new thread of `spec`, its events told to its listener, but for a finished task's (a timer it
 * left behind); its death told to the task it runs, else to `idleDeath`.
 */
const spawn = (spec: ThreadSpec, idleDeath: (thread: PoolThread) => void): PoolThread => {
  const worker = new NodeWorker(BOOTSTRAP, {
    eval: true,
    workerData: { module: spec.module, exportName: spec.exportName },
    ...(spec.maxMemoryMb === undefined
      ? {}
      : { resourceLimits: { maxOldGenerationSizeMb: spec.maxMemoryMb } }),
  })
  const thread: PoolThread = { worker, tasks: 0, dead: false, listener: undefined }
  const die = (error: unknown) => {
    if (thread.dead) return
    thread.dead = true
    const listener = thread.listener
    if (listener === undefined) return idleDeath(thread)
    listener({ type: "died", ...deathOf(error) })
  }
  worker.on("message", (event: ThreadEvent) => {
    if ("task" in event && event.task !== thread.tasks) return
    thread.listener?.(event)
  })
  worker.on("error", die)
  worker.on("exit", () => die(undefined))
  // Idle, it does not keep the process alive; running a task, it does (`run`).
  worker.unref()
  return thread
}

/** Ends a thread; its `exit` comes later. */
const terminate = (thread: PoolThread): Effect.Effect<void> =>
  Effect.promise(() => {
    thread.dead = true
    thread.listener = undefined
    return thread.worker.terminate().then(() => undefined, () => undefined)
  })

/** The events of `thread` from now on, in a queue. */
const listen = (thread: PoolThread) =>
  Effect.map(Queue.unbounded<ThreadEvent>(), (events) => {
    thread.listener = (event) => Queue.offerUnsafe(events, event)
    return events
  })

/** Hands the task to its thread: an input that cannot cross is the task's error. */
const post = (thread: PoolThread, input: unknown, ctx: TaskContext) =>
  Effect.try({
    try: () =>
      thread.worker.postMessage({
        type: "run",
        task: thread.tasks,
        input,
        context: contextOf(ctx),
        // The task's log fields, for a library logging in the thread (`TaskContext.logFields`).
        fields: logFields(),
      }),
    catch: (error) =>
      new Error(`The task's input cannot cross to its thread: ${(error as Error).message}`),
  })

/** A thread's first words: its module loaded, or why not. */
const started = (spec: ThreadSpec, thread: PoolThread) =>
  Effect.flatMap(listen(thread), (events) =>
    Effect.flatMap(Queue.take(events), (event) => {
      if (event.type === "ready") return Effect.void
      const why = event.type === "load_failed" || event.type === "died"
        ? event.message
        : "it did not start"
      return Effect.fail(
        new WorkerDefinitionError({
          message:
            `The threaded handler's module ${spec.module} cannot run "${spec.exportName}": ${why}`,
        }),
      )
    }))

/** A task's context as it crosses to its thread: its plain values. */
const contextOf = (ctx: TaskContext) => ({
  taskId: ctx.taskId,
  attempt: ctx.attempt,
  deliveryLimit: ctx.deliveryLimit,
  deliveries: ctx.deliveries,
  clientId: ctx.clientId,
  inputRefs: [...ctx.inputRefs],
  deadline: ctx.deadline,
  workerId: ctx.workerId,
})

/** A pool of threads running a threaded handler. */
export interface ThreadPool {
  /** Runs one task on a thread: its output, or its handler's error as the engine knows it. */
  readonly run: (input: unknown, ctx: TaskContext) => Effect.Effect<unknown, unknown>
}

/**
 * The pool a worker's engine runs its threaded handler on, for as long as the scope: one thread is
 * started at once, so that a module that cannot load (a wrong path, no such export) fails the
 * worker's start rather than its tasks.
 */
export const make = (
  spec: ThreadSpec,
): Effect.Effect<ThreadPool, WorkerDefinitionError, Scope.Scope> =>
  Effect.gen(function* () {
    const idle: Array<PoolThread> = []
    const all = new Set<PoolThread>()
    yield* Effect.addFinalizer(() =>
      Effect.forEach(all, terminate, { concurrency: "unbounded", discard: true })
    )
    // An idle thread that dies (a timer its last task left behind) is forgotten, not handed on.
    const forget = (thread: PoolThread) => {
      all.delete(thread)
      const at = idle.indexOf(thread)
      if (at >= 0) idle.splice(at, 1)
    }
    const retire = (thread: PoolThread) => {
      forget(thread)
      return terminate(thread)
    }
    const fresh = Effect.suspend(() => {
      const thread = spawn(spec, forget)
      all.add(thread)
      return started(spec, thread).pipe(
        Effect.as(thread),
        Effect.onExit((exit) => (exit._tag === "Failure" ? retire(thread) : Effect.void)),
      )
    })
    idle.push(yield* fresh)

    /** An idle thread, else a new one: its start may be interrupted, as the task's wait. */
    const take = (restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>) =>
      Effect.suspend(() => {
        const thread = idle.pop()
        if (thread !== undefined) return Effect.succeed(thread)
        return restore(fresh).pipe(
          Effect.mapError(() =>
            new FatalError({
              code: "THREAD_CRASHED",
              message: "The task's thread could not start.",
            })
          ),
        )
      })

    // Back to the idle ones, unless it is dead or has run its tasks.
    const release = (thread: PoolThread) =>
      thread.dead || (spec.maxTasks !== undefined && thread.tasks >= spec.maxTasks)
        ? retire(thread)
        : Effect.sync(() => {
          thread.listener = undefined
          thread.worker.unref()
          idle.push(thread)
        })

    /** Asks the thread to stop, waits the grace, then ends it whatever it does. */
    const stop = (thread: PoolThread, events: Queue.Queue<ThreadEvent>) =>
      Effect.sync(() => thread.worker.postMessage({ type: "abort" })).pipe(
        Effect.andThen(Effect.timeoutOption(untilEnd(events), STOP_GRACE)),
        Effect.andThen(retire(thread)),
      )

    const run: ThreadPool["run"] = (input, ctx) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(function* () {
          const thread = yield* take(restore)
          thread.worker.ref()
          thread.tasks++
          const events = yield* listen(thread)
          const ended = yield* Effect.exit(
            restore(Effect.andThen(post(thread, input, ctx), follow(events, ctx))),
          )
          if (ended._tag === "Failure" && ended.cause.reasons.some((r) => r._tag === "Interrupt")) {
            yield* stop(thread, events)
          } else {
            yield* release(thread)
          }
          return yield* ended
        })
      )

    return { run }
  })

/** Takes the thread's events until its task ends: its output, or its failure. */
const follow = (events: Queue.Queue<ThreadEvent>, ctx: TaskContext) =>
  Effect.gen(function* () {
    for (;;) {
      const event = yield* Queue.take(events)
      switch (event.type) {
        case "progress":
          yield* ctx.progress(event.fraction, event.payload)
          break
        case "log":
          ctx.logger[event.level](event.message, event.fields)
          break
        case "done":
          return event.output
        case "failed":
          return yield* Effect.fail(errorOf(event.error))
        case "died":
          return yield* Effect.fail(new FatalError({ code: event.code, message: event.message }))
      }
    }
  })

/** Waits until the thread's task ends, whatever it ends with. */
const untilEnd = (events: Queue.Queue<ThreadEvent>): Effect.Effect<void> =>
  Effect.flatMap(
    Queue.take(events),
    (event) =>
      event.type === "done" || event.type === "failed" || event.type === "died"
        ? Effect.void
        : untilEnd(events),
  )

/**
 * The pool of the worker's threaded handler, in the handler's context: the engine provides it
 * (`DeliveryEngine`), and a threaded handler run anywhere else says so.
 */
export const CurrentThreadPool: Context.Reference<ThreadPool | undefined> = Context.Reference<
  ThreadPool | undefined
>("@async-task/worker/internal/ThreadPool", { defaultValue: () => undefined })
