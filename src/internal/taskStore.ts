/**
 * Where the engine keeps the running task's log annotations for `TaskContext.logFields`, as an
 * async context: what an `async` handler awaits, and what an Effect handler's Promises run, find
 * them there. One store for every copy of the SDK in the process (a bundle beside
 * `node_modules`) and for a thread's bootstrap, which imports nothing of the SDK's: hence a
 * global symbol.
 */
import { AsyncLocalStorage } from "node:async_hooks"

/** The running task's log annotations (`service`, `task_id`, `attempt`). */
export type TaskAnnotations = Readonly<Record<string, unknown>>

/** The symbol the store is kept under on `globalThis`, which a thread's bootstrap spells too. */
export const TASK_STORE_KEY = "@async-task/worker/taskStore"

export const taskStore: AsyncLocalStorage<TaskAnnotations> =
  ((globalThis as Record<symbol, unknown>)[Symbol.for(TASK_STORE_KEY)] ??=
    new AsyncLocalStorage()) as AsyncLocalStorage<TaskAnnotations>
