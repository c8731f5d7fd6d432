/**
 * The worker with its handler calls watched, for `/health` and the shutdown: a handler still
 * running long past its deadline has stopped answering to interruption, and an `async` handler
 * whose Promise is still pending after the drain ignored its `AbortSignal`.
 */
import type * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { Worker } from "../../WorkerDefinition.ts"
import { kindOf } from "../handlerResult.ts"

/** A handler call still running. */
export interface HandlerCall {
  readonly taskId: string
  readonly startedAt: number
  /** An `async` handler's Promise. */
  readonly promise?: Promise<unknown>
}

/** The handler calls still running, as `/health` and the shutdown ask about them. */
export interface HandlerWatch {
  /** The first call running past `limit` after its start, if any. */
  readonly overrun: (limit: Duration.Duration) => Option.Option<HandlerCall>
  /** The `async` calls still pending. */
  readonly pending: () => ReadonlyArray<HandlerCall>
}

/** `worker` with its handler calls watched, and the watch. */
export const watchHandlers = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  clock: Clock.Clock,
): { readonly watched: Worker<A, I, O, R>; readonly watch: HandlerWatch } => {
  const running = new Set<HandlerCall>()
  const watched: Worker<A, I, O, R> = {
    ...worker,
    handler: (input, ctx) => {
      const startedAt = clock.currentTimeMillisUnsafe()
      const result = worker.handler(input, ctx)
      const kind = kindOf(result)
      if (kind === "effect") {
        const effect = result as Effect.Effect<O, unknown, R>
        const call: HandlerCall = { taskId: ctx.taskId, startedAt }
        running.add(call)
        return Effect.ensuring(effect, Effect.sync(() => void running.delete(call)))
      }
      if (kind === "value") return result
      const promise = Promise.resolve(result as PromiseLike<O>)
      const call: HandlerCall = { taskId: ctx.taskId, startedAt, promise }
      const settled = () => void running.delete(call)
      running.add(call)
      promise.then(settled, settled)
      return promise
    },
  }
  const overrun = (limit: Duration.Duration): Option.Option<HandlerCall> => {
    const since = clock.currentTimeMillisUnsafe() - Duration.toMillis(limit)
    for (const call of running) if (call.startedAt < since) return Option.some(call)
    return Option.none()
  }
  const pending = () => [...running].filter((call) => call.promise !== undefined)
  return { watched, watch: { overrun, pending } }
}
