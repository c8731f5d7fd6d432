/**
 * Step 5 of a delivery: the handler on the delivery's own fiber, under its time limit, with its
 * lease kept and its progress throttled. A time limit and a lease are watched by the engine's
 * shared timers, not a fiber or a race per delivery (see `bench/engine.ts`): stopping the handler
 * interrupts the delivery's fiber itself.
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as References from "effect/References"
import * as Scope from "effect/Scope"
import type { TaskProgress } from "../../ProgressThrottle.ts"
import * as TaskContext from "../../TaskContext.ts"
import type { Lease } from "../../Transport.ts"
import { type TaskAnnotations, taskStore } from "../taskStore.ts"
import type { LeaseLost } from "../../WorkerError.ts"
import { kindOf } from "../handlerResult.ts"
import type { DeliveryFiber, EngineContext, InHand, Steps } from "./context.ts"
import { classify, type Start, type Task, type Verdict } from "./decide.ts"
import { enterSpan, interruptedFromOutside } from "./fiberContext.ts"

/** What a handler call gave: its work as an Effect, and an `async` handler's Promise. */
interface Invoked<R> {
  readonly effect: Effect.Effect<unknown, unknown, R>
  /** An Effect handler's: its work runs on the delivery's fiber, in the task's async context. */
  readonly handlerEffect?: true
  readonly promise?: Promise<unknown>
  /** The handler threw as it was called: its defect is its own. */
  readonly threw?: true
}

/**
 * Calls the handler now and returns what it gave as an Effect (a throw is a defect, as inside
 * `Effect.suspend`): called by the delivery's own steps, where a suspension would be one more
 * step of every task. An Effect handler's work waits for its Effect to run; an `async` one's
 * starts now, in the task's async context (`TaskContext.logFields`), which its awaits keep, and
 * a shutdown that comes meanwhile interrupts it and fires its signal.
 */
const invoke = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  input: A,
  context: TaskContext.TaskContext,
  annotations: TaskAnnotations,
): Invoked<R> => {
  let result: unknown
  try {
    result = taskStore.run(annotations, ctx.worker.handler, input, context)
  } catch (defect) {
    return { effect: Effect.die(defect), threw: true }
  }
  const kind = kindOf(result)
  if (kind === "effect") {
    return { effect: result as Effect.Effect<unknown, unknown, R>, handlerEffect: true }
  }
  if (kind === "value") return { effect: Effect.succeed(result) }
  // `Promise.resolve` turns a thenable whose `then` throws into a rejection.
  const promise = Promise.resolve(result)
  return { effect: Effect.tryPromise({ try: () => promise, catch: (e) => e }), promise }
}

/**
 * Puts the delivery's fiber in the task's async context until the handler ends, for an Effect
 * handler's Promises (which run outside the fiber) and what the fiber captures at its
 * suspensions. `enterWith` changes the context of the code running now, which is the fiber's own:
 * Effect runs each resumption of a fiber, and its first run, in the async context it captured when
 * it suspended (or was forked), so the change goes no further than the fiber.
 */
const enterTaskStore = (annotations: TaskAnnotations): void => taskStore.enterWith(annotations)

/** The fiber out of the task's async context: its next delivery must not find this task's. */
const leaveTaskStore = (): void => taskStore.enterWith(undefined as unknown as TaskAnnotations)

/**
 * Interrupts the delivery's fiber as itself, from the fiber's own scheduler rather than here and
 * now: as Effect 3's `interruptAsFork` did, so that a transport telling of a lost lease, or the
 * timers' fiber firing a time limit, does not run the rest of the delivery inside its own call.
 */
const interruptSelf = (df: DeliveryFiber): void =>
  df.fiber.currentDispatcher.scheduleTask(() => df.fiber.interruptUnsafe(df.fiber.id), 0)

/**
 * The task's `progress`: its channel opened in the task's scope on the first report, and run
 * with the engine's context when an `async` handler awaits it.
 */
const progressOf = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  task: Task,
  lease: Lease,
  taskScope: Scope.Closeable,
): TaskContext.TaskContext["progress"] => {
  let channel: TaskProgress | undefined
  const report = (fraction: number, payload?: Readonly<Record<string, unknown>>) =>
    Effect.suspend(() => {
      if (channel !== undefined) return channel.report(fraction, payload)
      const opening = ctx.throttle.open(task.taskId, {
        isLost: lease.isLost,
        attempt: task.attempt,
        deliveryId: task.deliveryId,
        // `started` first, when it was sent ahead of its confirm: refused, no progress follows.
        after: it.started?.confirm,
      })
      return Scope.provide(opening, taskScope).pipe(
        Effect.flatMap((opened) => {
          channel ??= opened
          return channel.report(fraction, payload)
        }),
      )
    })
  return (fraction, payload) => TaskContext.awaitable(report(fraction, payload), ctx.context)
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
  { envelope, input, task }: Start<A>,
): Steps<Verdict> {
  const { df, restore, trace } = it
  const taskScope = it.scope!
  const lease = it.delivery.lease
  const startedAt = ctx.clock.currentTimeMillisUnsafe()
  const { abort, context } = TaskContext.make(
    {
      taskId: task.taskId,
      attempt: task.attempt,
      deliveryLimit: task.deliveryLimit,
      deliveries: task.deliveries,
      clientId: envelope.clientId,
      inputRefs: envelope.inputRefs ?? [],
      deadline: startedAt + ctx.timeoutMillis,
      workerId: ctx.workerId,
    },
    progressOf(ctx, it, task, lease, taskScope),
    ctx.loggerFor,
  )
  let running = true
  let stoppedWith: Verdict | undefined
  // Stops the handler at its time limit (called with nothing, by the timers) or for the lease it
  // lost: one function for both, as every delivery arms both (memory `bench/engine.ts` counts).
  const stop = (lost?: LeaseLost) => {
    if (!running) return
    if (lost !== undefined) it.lostAt ??= ctx.clock.currentTimeMillisUnsafe()
    if (stoppedWith !== undefined) return
    stoppedWith = lost === undefined ? { _tag: "Timeout" } : { _tag: "Lost", lost }
    df.stopped = true
    abort(lost === undefined ? "The task ran past its time limit" : "The task's lease was lost")
    interruptSelf(df)
  }
  // The handler's span goes where its own `Effect.withSpan` finds its parent: the fiber's
  // context, set for the task already (a traced delivery only).
  if (trace !== undefined) enterSpan(df.fiber, trace.startHandler())
  const timeLimit = ctx.timers.after(ctx.timeoutMillis, stop)
  const release = ctx.renewal.holdUnsafe(lease, stop)
  let invoked: Invoked<R> | undefined
  let exit: Exit.Exit<unknown, unknown>
  const annotations = df.fiber.getRef(References.CurrentLogAnnotations)
  try {
    // A lease lost already (while `started` was held through the output's refusals) is heard at
    // once: the handler is not called at all.
    invoked = stoppedWith === undefined
      ? invoke(ctx, input, context, annotations)
      : { effect: Effect.interrupt }
    if (invoked.handlerEffect) enterTaskStore(annotations)
    exit = yield* Effect.exit(restore(invoked.effect as Effect.Effect<unknown, unknown>))
  } finally {
    // Whatever happened, this task's timer and lease hold end here: left armed, they would stop
    // the next task of this fiber.
    running = false
    timeLimit.cancel()
    release()
    if (invoked?.handlerEffect) leaveTaskStore()
  }
  trace?.endHandler(exit)
  // A result after the deadline (the handler blocked the event loop past it, so the timer could
  // not fire) is a time out all the same.
  const late = ctx.clock.currentTimeMillisUnsafe() - startedAt > ctx.timeoutMillis
  const interrupted = Exit.isFailure(exit) && Cause.hasInterrupts(exit.cause) &&
    (yield* interruptedFromOutside(df, restore))
  if (interrupted && stoppedWith === undefined) abort("The worker is shutting down")
  if (stoppedWith !== undefined && invoked.promise !== undefined) it.runaway = invoked.promise
  const closed = yield* Effect.exit(Scope.close(taskScope, exit))
  if (Exit.isFailure(closed)) {
    yield* Effect.logError("Releasing the task's resources failed", closed.cause)
  }
  if (stoppedWith !== undefined) return stoppedWith
  if (interrupted) return { _tag: "Shutdown" }
  return late ? { _tag: "Timeout" } : classify(exit, invoked.threw === true, ctx.worker.retryOn)
}
