/**
 * What marks a handler as threaded, read where the definition is validated: the module and export
 * it runs, carried by the handler function `Thread.handler` returns.
 */

/**
 * What a threaded handler runs: a module's export, and how its threads are kept.
 *
 * @since 0.3.0
 * @category models
 */
export interface ThreadSpec {
  /** The module's URL (`file:`). */
  readonly module: string
  readonly exportName: string
  /** Tasks a thread runs before it is replaced; unbounded when absent. */
  readonly maxTasks?: number | undefined
  /** A thread's heap, in MiB: past it the thread dies (`THREAD_OUT_OF_MEMORY`). Node only. */
  readonly maxMemoryMb?: number | undefined
}

const THREAD_SPEC = Symbol.for("@async-task/worker/ThreadSpec")

/** `handler`, marked as running `spec` on threads. */
export const marked = <F extends object>(handler: F, spec: ThreadSpec): F =>
  Object.defineProperty(handler, THREAD_SPEC, { value: spec, enumerable: false })

/** The spec a handler runs on threads, if it is threaded. */
export const specOf = (handler: unknown): ThreadSpec | undefined =>
  typeof handler === "function"
    ? (handler as unknown as Record<symbol, ThreadSpec | undefined>)[THREAD_SPEC]
    : undefined
