/**
 * Where every delivery is settled: a terminal message published and confirmed, **then** acked;
 * or requeued; or, its lease lost, left to the broker. A publish the output refuses holds its
 * delivery (see {@link publishHeld}); a requeue that did not come from the handler waits its
 * attempt's backoff first, so that a fault that lasts cannot spin.
 */
import { Cause, Duration, Effect, Either, Exit, Option, Random } from "effect"
import type * as Decision from "../../Decision.ts"
import { encodeMessageText, type MessageType } from "../../Protocol.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { Delivery, Lease, PublishOptions } from "../../Transport.ts"
import type { LeaseLost, TransportError } from "../../WorkerError.ts"
import * as WorkerMetrics from "../../WorkerMetrics.ts"
import { encodeUtf8 } from "../utf8.ts"
import { interruptedFromOutside } from "./handler.ts"
import type { DeliveryFiber, EngineContext, Restore, Steps } from "./context.ts"
import { backoffMillis, fenced, type Plan, requeue, type Task, type TaskRef } from "./plan.ts"
import type { DeliveryTrace } from "./tracing.ts"

/** The first wait before a refused publish is tried again, and the longest. */
const PUBLISH_RETRY_BASE_MILLIS = 100
const PUBLISH_RETRY_MAX_MILLIS = 5000

/**
 * What a publish held through the output's refusals came to: confirmed, the lease lost, the
 * lease's time used up (`expired`), the engine closing, or a defect of the transport.
 */
type Publication = "published" | "lost" | "expired" | "closing" | Cause.Cause<unknown>

type Waited = "elapsed" | "lost" | "closing"

/** The backoff before the requeue of `attempt` (see `backoffMillis`), warning of an own delay ignored. */
export const backoff = (
  settings: Pick<WorkerSettings, "retryBackoffBase" | "retryBackoffMax">,
  attempt: number,
  delay: unknown,
): Effect.Effect<Duration.Duration> =>
  Effect.flatMap(Random.next, (r) => {
    const { millis, ownIgnored } = backoffMillis(settings, attempt, delay, r)
    const duration = Duration.millis(millis)
    return ownIgnored
      ? Effect.as(
        Effect.logWarning(
          "The RetryableError's delay is not a non-negative duration: the computed backoff is used",
        ),
        duration,
      )
      : Effect.succeed(duration)
  })

/**
 * Waits `delayMillis` without being interruptible (a stopped delivery's fiber stays
 * interrupted), while keeping the lease: ends early when the lease is lost, when the engine
 * closes and, with `untilOpen`, when the output gate opens.
 */
const holdFor = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  lease: Lease,
  delayMillis: number,
  untilOpen: boolean,
): Effect.Effect<Waited> =>
  Effect.async<Waited>((resume) => {
    let pending = true
    let stopTimer = () => {}
    let stopLease = () => {}
    let stopGate = () => {}
    let stopClosing = () => {}
    const finish = (why: Waited) => {
      if (!pending) return
      pending = false
      stopTimer()
      stopLease()
      stopGate()
      stopClosing()
      resume(Effect.succeed(why))
    }
    stopClosing = ctx.closing.onClose(() => finish("closing"))
    if (!pending) return
    stopTimer = ctx.timers.after(delayMillis, () => finish("elapsed"))
    stopLease = ctx.renewal.unsafeHold(lease, () => finish("lost"))
    if (!pending) return
    // Only a refusing gate wakes the wait when it opens: an open one would end it at once, and a
    // publish lost with its connection would be tried again without a pause.
    if (untilOpen && ctx.gate.refusing) stopGate = ctx.gate.onOpen(() => finish("elapsed"))
    return Effect.sync(() => finish("closing"))
  })

/**
 * {@link holdFor}, interruptible (a shutdown ends it) unless the engine itself stopped the
 * delivery's fiber: then only the engine's closing, or an interruption from outside seen once
 * the wait ends, does.
 */
export const hold = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  df: DeliveryFiber,
  restore: Restore,
  delayMillis: number,
  untilOpen: boolean,
): Effect.Effect<Waited> => {
  const wait = holdFor(ctx, delivery.lease, delayMillis, untilOpen)
  if (df.stopped) {
    return Effect.map(
      wait,
      (why) => (why === "elapsed" && interruptedFromOutside(df) ? "closing" : why),
    )
  }
  return Effect.map(
    Effect.exit(restore(wait)),
    (exit) => (Exit.isSuccess(exit) ? exit.value : "closing"),
  )
}

/**
 * Publishes `body`, holding the delivery through refusals: a refused publish closes the output
 * gate and is retried after a capped, jittered backoff (at once when another publish is
 * confirmed), until `deadline`, while the lease holds. While the gate is closed, a first publish
 * waits before it tries: intake pauses rather than each new task knocking. Every try of a traced
 * publish carries the same `traceparent` (`options`).
 */
function* publishTries<A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  body: Uint8Array,
  type: MessageType,
  deadline: number,
  df: DeliveryFiber,
  restore: Restore,
  interruptible: boolean,
  options: PublishOptions | undefined,
): Steps<Publication> {
  let delayMillis = PUBLISH_RETRY_BASE_MILLIS
  let tries = !ctx.gate.refusing
  for (;;) {
    if (tries) {
      if (delivery.lease.isLost()) return "lost"
      const publish = ctx.transport.publish(body, type, options)
      const published = yield* Effect.exit(interruptible ? restore(publish) : publish)
      if (Exit.isSuccess(published)) {
        const opened = ctx.gate.accepted()
        if (opened !== undefined) yield* opened
        WorkerMetrics.count(WorkerMetrics.messagesPublished(type))
        return "published"
      }
      const refusal = Cause.failureOption(published.cause)
      if (Option.isNone(refusal) || Cause.isDie(published.cause)) {
        return Cause.isInterruptedOnly(published.cause) ? "closing" : published.cause
      }
      WorkerMetrics.count(WorkerMetrics.publishFailures(type))
      // A publish lost with its connection is retried on the next one; only the broker's own
      // refusals close the gate.
      if (refusal.value.reason !== "closed") yield* ctx.gate.refused(refusal.value)
    }
    tries = true
    const jittered = Math.round(delayMillis / 2 + ((yield* Random.next) * delayMillis) / 2)
    const waited = yield* hold(ctx, delivery, df, restore, jittered, true)
    if (waited !== "elapsed") return waited
    if (ctx.clock.unsafeCurrentTimeMillis() >= deadline) return "expired"
    delayMillis = Math.min(delayMillis * 2, PUBLISH_RETRY_MAX_MILLIS)
  }
}

/** {@link publishTries} in a span of its own, when the delivery is traced. */
function* publishTraced<A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  body: Uint8Array,
  type: MessageType,
  deadline: number,
  df: DeliveryFiber,
  restore: Restore,
  interruptible: boolean,
  trace: DeliveryTrace,
  taskId: string | undefined,
): Steps<Publication> {
  const traced = trace.publish(type, taskId)
  const published = yield* publishTries(
    ctx,
    delivery,
    body,
    type,
    deadline,
    df,
    restore,
    interruptible,
    traced.options,
  )
  trace.endPublish(traced, published)
  return published
}

/** {@link publishTries}, traced when the delivery is: the untraced one adds no step. */
const publishHeld = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  body: Uint8Array,
  type: MessageType,
  deadline: number,
  df: DeliveryFiber,
  restore: Restore,
  interruptible: boolean,
  trace: DeliveryTrace | undefined,
  taskId: string | undefined,
): Steps<Publication> =>
  trace === undefined
    ? publishTries(ctx, delivery, body, type, deadline, df, restore, interruptible, undefined)
    : publishTraced(ctx, delivery, body, type, deadline, df, restore, interruptible, trace, taskId)

/** The ERROR line of a delivery the engine broke on, with its cause. */
export const logBroken = (cause: Cause.Cause<unknown>) =>
  Effect.logError("The delivery engine failed; the message is requeued", cause)

/**
 * Step 4: `started`, confirmed, unless the lease is already gone; `undefined` when the task may
 * run. The handler must still fit in the lease once `started` is out.
 */
export function* publishStarted<A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  task: Task,
  df: DeliveryFiber,
  restore: Restore,
  takenAt: number,
  trace: DeliveryTrace | undefined,
): Steps<Plan | undefined> {
  if (delivery.lease.isLost()) return fenced(task, "lease_lost")
  const started = encodeMessageText({
    type: "started",
    task_id: task.taskId,
    hostname: ctx.settings.hostname,
  })
  const deadline = takenAt + ctx.holdMillis - ctx.timeoutMillis
  const published = yield* publishHeld(
    ctx,
    delivery,
    encodeUtf8(Either.getOrThrow(started)),
    "started",
    deadline,
    df,
    restore,
    true,
    trace,
    task.taskId,
  )
  switch (published) {
    case "published":
      return undefined
    case "lost":
      return fenced(task, "lease_lost")
    case "expired":
      return requeue(task, "publish_failed", { reason: "started" })
    case "closing":
      return requeue(task, "shutdown_requeued")
    default:
      yield* logBroken(published)
      return requeue(task, "engine_error")
  }
}

/** A settlement the broker refused: counted, and said in the decision's reason. */
const settleFailed = (
  decision: Decision.Decision,
  what: string,
  cause: Cause.Cause<LeaseLost | TransportError>,
): Effect.Effect<Decision.Decision> => {
  WorkerMetrics.count(WorkerMetrics.ackFailures)
  const failure = Cause.failureOption(cause)
  if (Option.isSome(failure)) {
    return Effect.succeed({ ...decision, reason: `${what}_failed_${failure.value.reason}` })
  }
  return Effect.as(
    Effect.logError(`Settling the delivery (${what}) failed`, cause),
    { ...decision, reason: `${what}_failed` },
  )
}

/** Gives the message back to the queue; the decision says if the broker refused. */
export const requeueDelivery = (delivery: Delivery, decision: Decision.Decision) =>
  Effect.matchCauseEffect(delivery.requeue, {
    onFailure: (cause) => settleFailed(decision, "requeue", cause),
    onSuccess: () => Effect.succeed(decision),
  })

const ack = (delivery: Delivery, decision: Decision.Decision) =>
  Effect.matchCauseEffect(delivery.ack, {
    onFailure: (cause) => settleFailed(decision, "ack", cause),
    onSuccess: () => Effect.succeed(decision),
  })

/** Settles as `plan` says: the last step of every delivery. */
export function* settle<A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  plan: Plan,
  task: TaskRef | undefined,
  df: DeliveryFiber,
  restore: Restore,
  takenAt: number,
  trace: DeliveryTrace | undefined,
): Steps<Decision.Decision> {
  switch (plan._tag) {
    case "Fenced":
      return plan.decision
    case "Ack":
      return yield* ack(delivery, plan.decision)
    case "Requeue":
      return yield* requeueSettled(ctx, delivery, plan.decision, task, df, restore)
    case "Conclude": {
      if (delivery.lease.isLost()) return leaseLost(plan.decision)
      const published = yield* publishHeld(
        ctx,
        delivery,
        encodeUtf8(plan.text),
        plan.type,
        takenAt + ctx.holdMillis,
        df,
        restore,
        false,
        trace,
        plan.decision.taskId,
      )
      if (published === "published") {
        const code = plan.decision.code
        if (code !== undefined) WorkerMetrics.count(WorkerMetrics.taskFailures(code))
        return yield* ack(delivery, plan.decision)
      }
      if (published === "lost") return leaseLost(plan.decision)
      if (typeof published !== "string") yield* logBroken(published)
      const outcome: Decision.Outcome = published === "expired"
        ? "publish_failed"
        : published === "closing"
        ? "shutdown_requeued"
        : "engine_error"
      const decision: Decision.Decision = { ...plan.decision, outcome, action: "nack-requeue" }
      return yield* requeueSettled(ctx, delivery, decision, task, df, restore)
    }
  }
}

/** A concluded task whose lease was lost first: the broker has it back, nothing is settled. */
const leaseLost = (decision: Decision.Decision): Decision.Decision => ({
  ...decision,
  outcome: "cancelled",
  action: "nack-requeue",
  reason: "lease_lost",
})

function* requeueSettled<A, O, R>(
  ctx: EngineContext<A, O, R>,
  delivery: Delivery,
  decision: Decision.Decision,
  task: TaskRef | undefined,
  df: DeliveryFiber,
  restore: Restore,
): Steps<Decision.Decision> {
  const outcome = decision.outcome
  if (outcome === "publish_failed" || outcome === "engine_error") {
    const delay = yield* backoff(ctx.settings, task?.attempt ?? 1, undefined)
    yield* hold(ctx, delivery, df, restore, Duration.toMillis(delay), false)
  }
  if (delivery.lease.isLost()) return { ...decision, outcome: "cancelled", reason: "lease_lost" }
  if (outcome === "retry") WorkerMetrics.count(WorkerMetrics.taskRetries)
  if (outcome === "shutdown_requeued") WorkerMetrics.count(WorkerMetrics.shutdownRequeued)
  return yield* requeueDelivery(delivery, decision)
}
