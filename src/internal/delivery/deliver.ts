/**
 * One delivery's whole life, as the spec numbers it, read top down: {@link deliver} opens the
 * message (steps 1 to 3 and the input: `decide.ts`, `open`), runs its task ({@link runTask}: a
 * slot; `started`, step 4, `settle.ts`; the handler, step 5, `run.ts`; what its verdict comes to,
 * step 6, `decide.ts`), settles it as planned (steps 6 and 7, `settle.ts`) and logs its one
 * decision line (`Decision.ts`). The helpers each step needs follow, in the order they are used.
 */
import * as Cause from "effect/Cause"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Scope from "effect/Scope"
import * as Decision from "../../Decision.ts"
import type { Delivery } from "../../Transport.ts"
import { MissingServiceError } from "../../WorkerError.ts"
import * as WorkerMetrics from "../../WorkerMetrics.ts"
import type { DeliveryFiber, EngineContext, InHand, Restore, Steps } from "./context.ts"
import {
  afterHandler,
  countWarning,
  deliveryIdOf,
  handlerEnd,
  open,
  type Opening,
  type Plan,
  requeue,
  type Start,
  type TaskRef,
} from "./decide.ts"
import { enterDelivery } from "./fiberContext.ts"
import { runHandler } from "./run.ts"
import {
  abandonStarted,
  confirmStarted,
  logBroken,
  publishStarted,
  requeueDelivery,
  settle,
} from "./settle.ts"
import { DeliveryTrace } from "./tracing.ts"

/**
 * One delivery's whole life on the current fiber, which must be uninterruptible: only waiting is
 * interruptible (by shutdown, or by the engine stopping the handler), through `restore`;
 * settling never is. A defect of the engine's own code settles the delivery too (`engine_error`,
 * requeued after a backoff): it never ends the fiber. `decided` hears the decision once it is
 * logged; the fiber may still hold the slot for a runaway handler afterwards. Under the app's
 * tracer, the delivery is a span from when it is taken to its decision (`tracing.ts`).
 */
export function* deliver<A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  df: DeliveryFiber,
  restore: Restore,
  decided?: (decision: Decision.Decision) => void,
): Steps<Decision.Decision> {
  const it = inHand(ctx, delivery, df, restore)
  let decision: Decision.Decision
  try {
    let plan: Plan
    try {
      plan = yield* planDelivery(ctx, it)
    } catch (defect) {
      plan = yield* shutdownOrBroken(it.task, Cause.die(defect))
    }
    decision = yield* settle(ctx, it, plan)
  } catch (defect) {
    // The settlement itself broke: the message goes back to the queue as it is.
    yield* logBroken(Cause.die(defect))
    decision = yield* requeueDelivery(it, requeue(it.task, "engine_error").decision)
  }
  decision = yield* accounted(ctx, it, decision)
  // `decided` is told last: in Effect 4 whoever it wakes runs at once, inside this call, and
  // must find the delivery said and counted.
  const runaway = it.runaway
  if (runaway !== undefined) {
    // Settled, and said so; the slot and the in-flight count wait for the handler to end.
    Decision.logUnsafe(df.fiber, decision)
    decided?.(decision)
    yield* awaitRunaway(ctx, runaway)
  }
  yield* releaseSlot(ctx, it)
  WorkerMetrics.tasksInFlight.updateUnsafe(--ctx.state.inFlight, df.fiber.context)
  ctx.state.inHand.delete(it)
  if (runaway === undefined) {
    Decision.logUnsafe(df.fiber, decision)
    decided?.(decision)
  }
  return decision
}

/**
 * Steps 1 to 3 (`open`), then, for a task that may run, its run: everything up to the plan. Sets
 * the delivery's annotations and, for a task, the handler's context on the fiber.
 */
function* planDelivery<A, O, R>(ctx: EngineContext<A, O, R>, it: InHand): Steps<Plan> {
  const { delivery, df, trace } = it
  let opening: Opening<A> | undefined
  let broken: Cause.Cause<never> | undefined
  try {
    opening = open(
      delivery.body,
      delivery.redeliveries,
      ctx.settings,
      ctx.decodeInput,
      deliveryIdOf(ctx.random.nextDoubleUnsafe()),
      ctx.expiries,
    )
    it.task = opening.task
  } catch (defect) {
    broken = Cause.die(defect)
  }
  const task = it.task
  const annotations = annotationsOf(ctx.baseAnnotations, task)
  // Set, not scoped, on the delivery's fiber, until its next delivery: the delivery's annotations
  // and, traced, its span (the parent of what runs until the handler's own; a delivery that does
  // not run logs in its own trace, not in the trace of the fiber's last task).
  if (opening?._tag !== "Start") {
    enterDelivery(df, annotations, undefined, trace?.span)
    if (task?.attempt !== undefined) yield* warnRedeliveries(ctx, delivery)
    if (opening === undefined) return yield* shutdownOrBroken(task, broken!)
    if (opening.decision.outcome === "poison") {
      WorkerMetrics.count(
        WorkerMetrics.poisonMessages(opening.decision.reason!),
        df.fiber.context,
      )
    }
    return opening
  }
  // A task runs with the handler's services `R` (in the fiber's base) and its own scope: made
  // synchronously, as a `Scope.make` would be one more step of every task (`bench/engine.ts`).
  it.scope = Scope.makeUnsafe()
  enterDelivery(df, annotations, it.scope, trace?.span)
  yield* warnRedeliveries(ctx, delivery)
  return yield* runTask(ctx, it, opening)
}

/**
 * Steps 4 to 6 of a task that may run, up to its plan: a slot (the worker's limit), `started`,
 * the handler, what its verdict comes to, and `started`'s confirm (sent ahead of it, the handler
 * ran while it was on the way).
 */
function* runTask<A, O, R>(ctx: EngineContext<A, O, R>, it: InHand, start: Start<A>): Steps<Plan> {
  const interrupted = yield* takeSlot(ctx, it)
  if (interrupted !== undefined) return interrupted
  const started = yield* publishStarted(ctx, it, start.task)
  if (started !== undefined) return started
  const startedAt = ctx.clock.currentTimeMillisUnsafe()
  const verdict = yield* runHandler(ctx, it, start)
  it.took = ctx.clock.currentTimeMillisUnsafe() - startedAt
  WorkerMetrics.taskDuration.updateUnsafe(it.took / 1000, it.df.fiber.context)
  it.end = handlerEnd(verdict)
  if (verdict._tag === "MissingService") yield* halt(ctx, verdict.service)
  // The slot is the handler's: given back before a retry's backoff or the conclusion, unless the
  // handler still runs.
  if (it.runaway === undefined) yield* releaseSlot(ctx, it)
  // `started`, if sent ahead of its confirm, is confirmed before a terminal message.
  return yield* confirmStarted(
    ctx,
    it,
    afterHandler(verdict, start.task, ctx.settings, ctx.encodeOutput),
  )
}

// ---------------------------------------------------------------------------------------------
// Taken, and counted in hand

/** The delivery's record, counted in flight and in hand. */
const inHand = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  df: DeliveryFiber,
  restore: Restore,
): InHand => {
  WorkerMetrics.tasksInFlight.updateUnsafe(++ctx.state.inFlight, df.fiber.context)
  const it: InHand = {
    delivery,
    df,
    restore,
    takenAt: ctx.clock.currentTimeMillisUnsafe(),
    trace: ctx.tracing === undefined ? undefined : traceOf(ctx.tracing, delivery),
    task: undefined,
    scope: undefined,
    started: undefined,
    ticket: undefined,
    end: undefined,
    took: undefined,
    runaway: undefined,
    lostAt: undefined,
  }
  ctx.state.inHand.add(it)
  return it
}

/** The delivery's trace, unless the app's tracer cannot even start it: then none. */
const traceOf = (
  tracing: NonNullable<EngineContext<unknown, unknown, unknown>["tracing"]>,
  delivery: Delivery,
): DeliveryTrace | undefined => {
  try {
    return new DeliveryTrace(tracing, delivery.headers)
  } catch {
    return undefined
  }
}

/** The ids of the tasks in hand, of those whose message is opened: the event loop's WARNING. */
export function* tasksInHand(inHand: Iterable<InHand>): Generator<string> {
  for (const it of inHand) if (it.task !== undefined) yield it.task.taskId
}

// ---------------------------------------------------------------------------------------------
// Opened

/** The log annotations of a delivery: the worker's, and its task's once it is known. */
const annotationsOf = (
  base: Readonly<Record<string, unknown>>,
  task: TaskRef | undefined,
): Readonly<Record<string, unknown>> =>
  task === undefined
    ? base
    : task.attempt === undefined
    ? { ...base, task_id: task.taskId }
    : { ...base, task_id: task.taskId, attempt: task.attempt }

/** The warnings a delivery's header calls for: a classic queue (once), a count that is not one. */
const warnRedeliveries = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
): Effect.Effect<void> => {
  const redeliveries = delivery.redeliveries
  if (redeliveries._tag === "Counted") {
    const warning = countWarning(redeliveries)
    return warning === undefined ? Effect.void : Effect.logWarning(warning)
  }
  if (ctx.state.warnedClassic) return Effect.void
  ctx.state.warnedClassic = true
  return Effect.logWarning(
    "The input queue reports only a redelivered flag (a classic queue): a retried task gets one retry. Use a quorum queue for the full delivery limit.",
  )
}

/** Interrupted while it waited (a shutdown), or broken: requeued either way. */
const shutdownOrBroken = (task: TaskRef | undefined, cause: Cause.Cause<unknown>) =>
  Cause.hasInterruptsOnly(cause)
    ? Effect.succeed(requeue(task, "shutdown_requeued"))
    : Effect.as(logBroken(cause), requeue(task, "engine_error"))

// ---------------------------------------------------------------------------------------------
// A slot, and the handler's end

/**
 * A slot for the task: at once, or after waiting while the worker (or its `Concurrency.pool`) is
 * at its limit, the delivery in hand; the plan of a wait interrupted (a shutdown) or broken.
 */
function* takeSlot<A, O, R>(ctx: EngineContext<A, O, R>, it: InHand): Steps<Plan | undefined> {
  it.ticket = ctx.limiter.tryAcquire()
  if (it.ticket !== undefined) return undefined
  do {
    const waited = yield* Effect.exit(it.restore(ctx.limiter.awaitSlot))
    if (waited._tag === "Failure") return yield* shutdownOrBroken(it.task, waited.cause)
    it.ticket = ctx.limiter.tryAcquire()
  } while (it.ticket === undefined)
  // Effect 4 resumes a waiter inside the call that woke it: here, the settling of the task
  // that gave its slot back. The slot taken, this task goes on from the scheduler, or tasks
  // waiting in a row would each run inside the last one's release until the stack overflows.
  yield* Effect.yieldNow
  return undefined
}

/** Gives the slot back, with how the handler ended, and runs the change of target it calls for. */
function* releaseSlot<A, O, R>(ctx: EngineContext<A, O, R>, it: InHand): Steps<void> {
  if (it.ticket === undefined) return
  const adjust = ctx.limiter.release(it.ticket, it.end ?? "other", it.took)
  it.ticket = undefined
  if (adjust !== undefined) yield* Effect.exit(adjust)
}

/**
 * Stops the engine for a service a handler needs and was not given: no delivery taken from now
 * on, and consuming ends with the error (the deliveries in hand go back to the queue).
 */
const halt = <A, O, R>(ctx: EngineContext<A, O, R>, service: string): Effect.Effect<void> => {
  Deferred.doneUnsafe(ctx.halted, Exit.fail(new MissingServiceError({ service })))
  return ctx.transport.stopIntake
}

/** Waits for a runaway `async` handler to end, unless the engine closes first. */
const awaitRunaway = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  promise: Promise<unknown>,
): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    let pending = true
    let stop = () => {}
    const finish = () => {
      if (!pending) return
      pending = false
      stop()
      resume(Effect.void)
    }
    stop = ctx.closing.onClose(finish)
    promise.then(finish, finish)
  })

// ---------------------------------------------------------------------------------------------
// Settled: what the decision line says

/**
 * The decision as the line says it: a lost lease with the block of the event loop seen during
 * the delivery, or counted as the broker's expiry (with the warning that says what to raise);
 * the delivery's span ended with it.
 */
function* accounted<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  settled: Decision.Decision,
): Steps<Decision.Decision> {
  abandonStarted(it)
  let decision = withBlock(ctx, it, settled)
  const held = (it.lostAt ?? ctx.clock.currentTimeMillisUnsafe()) - it.takenAt
  const expiry = ctx.expiries.settled(decision, held, ctx.leaseMillis)
  if (expiry !== decision) {
    decision = expiry
    yield* warnExpired(ctx, held)
  }
  try {
    it.trace?.settled(decision)
  } catch {
    // The app's tracer failed to end the span: the delivery is settled all the same.
  }
  return decision
}

/**
 * A decision whose lease was lost, with the seconds of a block of the event loop during the
 * delivery, if one was seen: a block of two heartbeats makes the broker drop the connection.
 */
const withBlock = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  decision: Decision.Decision,
): Decision.Decision => {
  if (decision.reason?.startsWith("lease_") !== true) return decision
  const seconds = ctx.loop.blockedSince(it.takenAt)
  return seconds === undefined ? decision : { ...decision, blockedSeconds: seconds }
}

/** What a lease the broker ended at its consumer timeout means, and how to stop it. */
const warnExpired = <A, O, R>(ctx: EngineContext<A, O, R>, held: number) =>
  Effect.logWarning(
    `The broker took the task back after ${Math.round(held / 1000)} s, at its consumer ` +
      "timeout: the worker counts the attempt. The broker's lease is shorter than the task " +
      "needs, or a handler kept the worker from settling it: the worker asks " +
      `WORKER_CONSUMER_TIMEOUT_S (${Math.round(ctx.leaseMillis / 1000)} s) of RabbitMQ 3.12 ` +
      "and later; an older broker's consumer_timeout must be raised in its configuration " +
      "(docs/deployment.md, Leases)",
  )
