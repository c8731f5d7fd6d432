/**
 * Step 5 of a delivery: the handler on the delivery's own fiber, under its time limit, with its
 * lease kept and its progress throttled. A time limit and a lease are watched by the engine's
 * shared timers, not a fiber or a race per delivery (see `bench/engine.ts`): stopping the handler
 * interrupts the delivery's fiber itself.
 */
import { Cause, Effect, Equal, Exit, FiberRef, Scope } from "effect"
import * as TaskContext from "../../TaskContext.ts"
import type { Envelope } from "../../Protocol.ts"
import type { Lease } from "../../Transport.ts"
import { kindOf } from "./handlerResult.ts"
import type { DeliveryFiber, EngineContext, InHand, Steps } from "./context.ts"
import { withContext } from "./fiberRefs.ts"
import { classify, type Result, type Task } from "./plan.ts"

/** What a handler call gave: its work as an Effect, and an `async` handler's Promise. */
interface Invoked<R> {
  readonly effect: Effect.Effect<unknown, unknown, R>
  readonly promise?: Promise<unknown>
}

/** A defect: `Effect.die` itself reads its value, which a hostile one makes throw. */
const dieWith = (defect: unknown): Effect.Effect<never> => {
  try {
    return Effect.die(defect)
  } catch {
    return Effect.dieMessage("The handler threw a value that cannot be read")
  }
}

/**
 * Calls the handler now and returns what it gave as an Effect (a throw is a defect, as inside
 * `Effect.suspend`): called by the delivery's own steps, where a suspension would be one more
 * step of every task. An Effect handler's work waits for its Effect to run; an `async` one's
 * starts now, and a shutdown that comes meanwhile interrupts it and fires its signal.
 */
const invoke = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  input: A,
  context: TaskContext.TaskContext,
): Invoked<R> => {
  let result: unknown
  try {
    result = ctx.worker.handler(input, context)
  } catch (defect) {
    return { effect: dieWith(defect) }
  }
  const kind = kindOf(result)
  if (kind === "effect") return { effect: result as Effect.Effect<unknown, unknown, R> }
  if (kind === "value") return { effect: Effect.succeed(result) }
  // `Promise.resolve` turns a thenable whose `then` throws into a rejection.
  const promise = Promise.resolve(result)
  return { effect: Effect.tryPromise({ try: () => promise, catch: (e) => e }), promise }
}

/**
 * Whether something other than the engine itself interrupted the delivery's fiber (a shutdown,
 * the caller of `handle`): the engine stops a handler by interrupting the fiber as itself, and a
 * handler that interrupts itself (`Effect.interrupt`) leaves the fiber uninterrupted.
 */
export const interruptedFromOutside = (df: DeliveryFiber): boolean => {
  const fiber = df.fiber
  for (const id of Cause.interruptors(fiber.getFiberRef(FiberRef.interruptedCause))) {
    if (!Equal.equals(id, fiber.id())) return true
  }
  return false
}

/** The task's progress channel, opened in its scope on the first report. */
const progressOf = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  taskId: string,
  lease: Lease,
  taskScope: Scope.CloseableScope,
) => {
  let progress:
    | Effect.Effect.Success<ReturnType<EngineContext<A, O, R>["throttle"]["open"]>>
    | undefined
  return (fraction: number, payload?: Readonly<Record<string, unknown>>) =>
    Effect.suspend(() => {
      if (progress !== undefined) return progress.report(fraction, payload)
      return Scope.extend(ctx.throttle.open(taskId, { isLost: lease.isLost }), taskScope).pipe(
        Effect.flatMap((opened) => {
          progress ??= opened
          return progress.report(fraction, payload)
        }),
      )
    })
}

/**
 * Runs the handler of `task`. The task's own scope (the handler's resources and its progress
 * channel) is closed before this returns, so nothing of the task outlives it but an `async`
 * handler that ignores its signal: its Promise is kept in `it`, and the delivery keeps its slot
 * until the Promise settles. A traced delivery runs the handler in its own span, the parent of
 * the handler's spans.
 */
export function* runHandler<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  task: Task,
  envelope: Envelope,
  input: A,
  taskScope: Scope.CloseableScope,
): Steps<Result> {
  const { df, restore, trace } = it
  const lease = it.delivery.lease
  const report = progressOf(ctx, task.taskId, lease, taskScope)
  const { abort, context } = TaskContext.make(
    {
      taskId: task.taskId,
      attempt: task.attempt,
      deliveryLimit: task.deliveryLimit,
      clientId: envelope.clientId,
      inputRefs: envelope.inputRefs ?? [],
    },
    (fraction, payload) => TaskContext.awaitable(report(fraction, payload), ctx.runtime),
    ctx.loggerFor,
  )
  let running = true
  let stoppedWith: Result | undefined
  const stop = (result: Result, reason: string) => {
    if (!running || stoppedWith !== undefined) return
    stoppedWith = result
    df.stopped = true
    abort(reason)
    df.fiber.unsafeInterruptAsFork(df.fiber.id())
  }
  if (trace !== undefined) {
    // The handler's span goes where its own `Effect.withSpan` finds its parent: the fiber's
    // context, set for the task already, set again (a traced delivery only).
    const traced = trace.startHandler()
    yield* Effect.updateFiberRefs((id, refs) => withContext(refs, id, traced))
  }
  const startedAt = ctx.clock.unsafeCurrentTimeMillis()
  const cancelTimer = ctx.timers.after(
    ctx.timeoutMillis,
    () => stop({ _tag: "Timeout" }, "The task ran past its time limit"),
  )
  const release = ctx.renewal.unsafeHold(
    lease,
    (lost) => stop({ _tag: "Lost", lost }, "The task's lease was lost"),
  )
  let invoked: Invoked<R> | undefined
  let exit: Exit.Exit<unknown, unknown>
  try {
    // A lease lost already (while `started` awaited its confirm) is heard at once: the handler
    // is not called at all.
    invoked = stoppedWith === undefined ? invoke(ctx, input, context) : { effect: Effect.interrupt }
    exit = yield* Effect.exit(restore(invoked.effect as Effect.Effect<unknown, unknown>))
  } finally {
    // Whatever happened, this task's timer and lease hold end here: left armed, they would stop
    // the next task of this fiber.
    running = false
    cancelTimer()
    release()
  }
  trace?.endHandler(exit)
  // A result after the deadline (the handler blocked the event loop past it, so the timer could
  // not fire) is a time out all the same.
  const late = ctx.clock.unsafeCurrentTimeMillis() - startedAt > ctx.timeoutMillis
  const interrupted = Exit.isFailure(exit) && Cause.isInterrupted(exit.cause) &&
    interruptedFromOutside(df)
  if (interrupted && stoppedWith === undefined) abort("The worker is shutting down")
  if (stoppedWith !== undefined && invoked.promise !== undefined) it.runaway = invoked.promise
  const closed = yield* Effect.exit(Scope.close(taskScope, exit))
  if (Exit.isFailure(closed)) {
    yield* Effect.logError("Releasing the task's resources failed", closed.cause)
  }
  if (stoppedWith !== undefined) return stoppedWith
  if (interrupted) return { _tag: "Shutdown" }
  return late ? { _tag: "Timeout" } : classify(exit)
}
