/**
 * The worker with its handler calls watched, for `/health` and the shutdown: a handler still
 * running long past its deadline has stopped answering to interruption, and an `async` handler
 * whose Promise is still pending after the drain ignored its `AbortSignal`.
 */
import { type Clock, Duration, Effect, Option } from "effect"
import type { Worker } from "../../WorkerDefinition.ts"
import { kindOf } from "../delivery/handlerResult.ts"

/** A handler call still running. */
interface Running {
  readonly taskId: string
  readonly startedAt: number
  /** An `async` handler's Promise. */
  readonly promise?: Promise<unknown>
}

/**
 * The worker with its handler calls watched, for `/health` and the shutdown: a handler still
 * running long past its deadline has stopped answering to interruption, and an `async` handler
 * whose Promise is still pending after the drain ignored its `AbortSignal`.
 */
export const watchHandlers = <A, I, O, R>(worker: Worker<A, I, O, R>, clock: Clock.Clock) => {
  const running = new Set<Running>()
  const watched: Worker<A, I, O, R> = {
    ...worker,
    handler: (input, ctx) => {
      const startedAt = clock.unsafeCurrentTimeMillis()
      const result = worker.handler(input, ctx)
      const kind = kindOf(result)
      if (kind === "effect") {
        const effect = result as Effect.Effect<O, unknown, R>
        const call: Running = { taskId: ctx.taskId, startedAt }
        running.add(call)
        return Effect.ensuring(effect, Effect.sync(() => void running.delete(call)))
      }
      if (kind === "value") return result
      const promise = Promise.resolve(result as PromiseLike<O>)
      const call: Running = { taskId: ctx.taskId, startedAt, promise }
      const settled = () => void running.delete(call)
      running.add(call)
      promise.then(settled, settled)
      return promise
    },
  }
  /** The first call running past `limit` after its start, if any. */
  const overrun = (limit: Duration.Duration): Option.Option<Running> => {
    const since = clock.unsafeCurrentTimeMillis() - Duration.toMillis(limit)
    for (const call of running) if (call.startedAt < since) return Option.some(call)
    return Option.none()
  }
  const pending = () => [...running].filter((call) => call.promise !== undefined)
  return { watched, overrun, pending }
}
