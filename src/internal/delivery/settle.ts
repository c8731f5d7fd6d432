/**
 * Where every delivery is settled, and what it publishes: `started` (step 4,
 * {@link publishStarted}); then, as its {@link Plan} says ({@link settle}), its terminal message
 * published and confirmed, **then** the ack (step 6); or a requeue, after its backoff where it
 * waits one; or, its lease lost, nothing: the broker has it back (step 7 requeues a terminal
 * message the output did not take). A message is held through the output's refusals: a refused
 * publish closes the output gate and is tried again after a backoff, while the lease holds and
 * the lease's time allows ({@link publishHeld}). Every wait of a delivery keeps its lease and
 * watches it ({@link hold}).
 */
import * as Cause from "effect/Cause"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Random from "effect/Random"
import * as Result from "effect/Result"
import type * as Decision from "../../Decision.ts"
import { encodeMessageText, type MessageType } from "../../Protocol.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { Lease } from "../../Transport.ts"
import type { LeaseLost, PublishError, TransportError } from "../../WorkerError.ts"
import * as WorkerMetrics from "../../WorkerMetrics.ts"
import { encodeUtf8 } from "../codec/utf8.ts"
import type { EngineContext, InHand, Outgoing, Steps } from "./context.ts"
import {
  backoffMillis,
  fenced,
  messageIdOf,
  type Note,
  outputTooLarge,
  type Plan,
  PUBLISH_BACKOFF,
  requeue,
  returnedAs,
  type Task,
  type TaskRef,
  waitsBackoff,
} from "./decide.ts"
import { interruptedFromOutside } from "./fiberContext.ts"
import type { Timer } from "./timers.ts"

// ---------------------------------------------------------------------------------------------
// Holding a delivery, and publishing for it

/**
 * What holding a delivery for a while came to: the time elapsed, the lease lost, or the engine
 * closing (or, interruptibly, a shutdown).
 */
type Waited = "elapsed" | "lost" | "closing"

/**
 * What a publish held through the output's refusals came to: confirmed, the lease lost, the
 * lease's time used up (`expired`), the engine closing, a message larger than the broker takes
 * (`too_large`: refused again whenever tried), or a defect of the transport.
 */
export type Publication =
  | "published"
  | Exclude<Waited, "elapsed">
  | "expired"
  | "too_large"
  | Cause.Cause<unknown>

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
  Effect.callback<Waited>((resume) => {
    let pending = true
    let timer: Timer | undefined = undefined
    let stopLease = () => {}
    let stopGate = () => {}
    let stopClosing = () => {}
    const finish = (why: Waited) => {
      if (!pending) return
      pending = false
      timer?.cancel()
      stopLease()
      stopGate()
      stopClosing()
      resume(Effect.succeed(why))
    }
    stopClosing = ctx.closing.onClose(() => finish("closing"))
    if (!pending) return
    timer = ctx.timers.after(delayMillis, () => finish("elapsed"))
    stopLease = ctx.renewal.holdUnsafe(lease, () => finish("lost"))
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
const hold = <A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  delayMillis: number,
  untilOpen: boolean,
): Effect.Effect<Waited> => {
  const { df, restore } = it
  const wait = holdFor(ctx, it.delivery.lease, delayMillis, untilOpen)
  if (df.stopped) {
    return Effect.flatMap(
      wait,
      (why) =>
        why === "elapsed"
          ? Effect.map(
            interruptedFromOutside(df, restore),
            (outside) => (outside ? "closing" : why),
          )
          : Effect.succeed(why),
    )
  }
  return Effect.map(
    Effect.exit(restore(wait)),
    (exit) => (Exit.isSuccess(exit) ? exit.value : "closing"),
  )
}

/**
 * What the broker's answer to a try of a publish of `type` comes to, counted and told to the
 * output gate: published, or why not; `undefined` for a refusal worth trying again after a wait.
 */
function* answerOf<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  type: MessageType,
  published: Exit.Exit<void, PublishError>,
): Steps<Publication | undefined> {
  if (Exit.isSuccess(published)) {
    const opened = ctx.gate.accepted()
    if (opened !== undefined) yield* opened
    WorkerMetrics.count(WorkerMetrics.messagesPublished(type), it.df.fiber.context)
    return "published"
  }
  const refusal = Cause.findErrorOption(published.cause)
  if (Option.isNone(refusal) || Cause.hasDies(published.cause)) {
    return Cause.hasInterruptsOnly(published.cause) ? "closing" : published.cause
  }
  WorkerMetrics.count(WorkerMetrics.publishFailures(type), it.df.fiber.context)
  if (refusal.value.reason === "too_large") return "too_large"
  // A publish lost with its connection is retried on the next one; only the broker's own
  // refusals close the gate.
  if (refusal.value.reason !== "closed") yield* ctx.gate.refused(refusal.value)
  return undefined
}

/**
 * Publishes `out`, holding the delivery through refusals: a refused publish closes the output
 * gate and is retried after a capped, jittered backoff (at once when another publish is
 * confirmed), until its deadline, while the lease holds. While the gate is closed, a first
 * publish waits before it tries: intake pauses rather than each new task knocking. Every try of
 * a traced publish carries the same `traceparent` (`out.headers`).
 */
function* publishTries<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  out: Outgoing,
  sent?: Effect.Effect<void, PublishError>,
): Steps<Publication> {
  let tries = sent !== undefined || !ctx.gate.refusing
  for (let waits = 1;; waits++) {
    if (tries) {
      let published: Exit.Exit<void, PublishError>
      if (sent !== undefined) {
        // The first try was sent ahead of its confirm: its answer is awaited here.
        published = yield* Effect.exit(sent)
        sent = undefined
      } else {
        if (it.delivery.lease.isLost()) return "lost"
        const publish = ctx.transport.publish(out.body, out.type, out)
        published = yield* Effect.exit(out.interruptible ? it.restore(publish) : publish)
      }
      const answer = yield* answerOf(ctx, it, out.type, published)
      if (answer !== undefined) return answer
    }
    tries = true
    const r = yield* Random.next
    const waited = yield* hold(
      ctx,
      it,
      Math.round(backoffMillis(PUBLISH_BACKOFF, waits, undefined, r).millis),
      true,
    )
    if (waited !== "elapsed") return waited
    if (ctx.clock.currentTimeMillisUnsafe() >= out.deadline) return "expired"
  }
}

/** {@link publishTries}, in a span of its own when the delivery is traced. */
export function* publishHeld<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  out: Outgoing,
): Steps<Publication> {
  if (it.trace === undefined) return yield* publishTries(ctx, it, out)
  const traced = it.trace.publish(out.type, it.task?.taskId)
  const headers = traced.options?.headers
  const published = yield* publishTries(ctx, it, headers === undefined ? out : { ...out, headers })
  it.trace.endPublish(traced, published)
  return published
}

/** `started` of `task`, to publish within the time the lease leaves the handler. */
const startedOf = <A, O, R>(ctx: EngineContext<A, O, R>, it: InHand, task: Task): Outgoing => ({
  body: encodeUtf8(
    Result.getOrThrow(
      encodeMessageText({ type: "started", task_id: task.taskId, hostname: ctx.settings.hostname }),
    ),
  ),
  type: "started",
  messageId: messageIdOf(task, "started"),
  deadline: it.takenAt + ctx.holdMillis - ctx.timeoutMillis,
  interruptible: true,
})

/**
 * Step 4: `started`, unless the lease is already gone; `undefined` when the task may run. Where
 * the transport can send ahead of the confirm, the handler runs while the confirm is on the way,
 * which {@link confirmStarted} awaits before anything else of the task is published or settled;
 * otherwise, and while the output refuses, `started` is held through the refusals and confirmed
 * first. The handler must still fit in the lease once `started` is out.
 */
export function* publishStarted<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  task: Task,
): Steps<Plan | undefined> {
  if (it.delivery.lease.isLost()) return fenced(task, "lease_lost")
  let out = startedOf(ctx, it, task)
  const send = ctx.transport.publish.send
  if (send === undefined || ctx.gate.refusing) {
    return yield* startedPlan(task, yield* publishHeld(ctx, it, out))
  }
  const traced = it.trace?.publish("started", task.taskId)
  const headers = traced?.options?.headers
  if (headers !== undefined) out = { ...out, headers }
  const sent = yield* Effect.exit(send(out.body, out.type, out))
  if (Exit.isSuccess(sent) && !(Exit.isExit(sent.value) && Exit.isFailure(sent.value))) {
    it.started = { out, confirm: sent.value, traced }
    return undefined
  }
  // A transport that broke as it sent (an engine error, as a broken publish is), or a refusal
  // known at once (a broker that answers as it takes a message): held through the refusals
  // before the handler runs, as any publish.
  const published = Exit.isSuccess(sent)
    ? yield* publishTries(ctx, it, out, sent.value)
    : sent.cause
  if (traced !== undefined) it.trace?.endPublish(traced, published)
  return yield* startedPlan(task, published)
}

/**
 * The end of step 4 for a `started` sent ahead of its confirm, once the handler has run: a
 * conclusion waits for the confirm (come while the handler ran, as a rule) and, refused, holds
 * `started` through the refusals as any publish, within the lease's whole time, before its
 * terminal message; if `started` cannot get out, the plan that says so replaces it. A task that
 * goes back to the queue, or whose lease is lost, publishes nothing more: its plan stands, the
 * confirm's answer only heard.
 */
export function* confirmStarted<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  plan: Plan,
): Steps<Plan> {
  const sent = it.started
  if (sent === undefined) return plan
  it.started = undefined
  if (plan._tag !== "Conclude" || plan.task === undefined) {
    // Its answer heard once, for the metrics and the output gate, and not tried again.
    const answer = yield* answerOf(ctx, it, "started", yield* Effect.exit(sent.confirm))
    if (sent.traced !== undefined) it.trace?.endPublish(sent.traced, answer ?? "refused")
    return plan
  }
  const out = { ...sent.out, deadline: it.takenAt + ctx.holdMillis, interruptible: false }
  const published = yield* publishTries(ctx, it, out, sent.confirm)
  if (sent.traced !== undefined) it.trace?.endPublish(sent.traced, published)
  const unpublished = yield* startedPlan(plan.task, published)
  return unpublished === undefined ? plan : { ...unpublished, note: plan.note }
}

/** A `started` sent ahead whose delivery ended another way (a defect): its span ended. */
export const abandonStarted = (it: InHand): void => {
  const sent = it.started
  if (sent === undefined) return
  it.started = undefined
  if (sent.traced !== undefined) it.trace?.endPublish(sent.traced, "abandoned")
}

/** What a publish of `started` comes to: the task runs (`undefined`), or the plan that ends it. */
function* startedPlan(task: TaskRef, published: Publication): Steps<Plan | undefined> {
  switch (published) {
    case "published":
      return undefined
    case "lost":
      return fenced(task, "lease_lost")
    case "expired":
    case "too_large":
      return requeue(task, "publish_failed", { reason: "started" })
    case "closing":
      return requeue(task, "shutdown_requeued")
    default:
      yield* logBroken(published)
      return requeue(task, "engine_error")
  }
}

// ---------------------------------------------------------------------------------------------
// Settling

/** The ERROR line of a delivery the engine broke on, with its cause. */
export const logBroken = (cause: Cause.Cause<unknown>) =>
  Effect.logError("The delivery engine failed; the message is requeued", cause)

/**
 * The note's line, with the handler's Cause when it has one, so that the app's Logger gets its
 * message and stack (the platform gets a fixed sentence only).
 */
const noteLine = (note: Note, withCause: boolean): Effect.Effect<void> => {
  const log = note.level === "warning" ? Effect.logWarning : Effect.logError
  const line = withCause && note.cause !== undefined
    ? log(note.message, note.cause)
    : log(note.message)
  return note.error === undefined ? line : Effect.annotateLogs(line, { error: note.error })
}

/** Logs the note; without its Cause when a logger cannot render it (a hostile value thrown). */
function* logNote(note: Note): Steps<void> {
  const logged = yield* Effect.exit(noteLine(note, true))
  if (Exit.isFailure(logged) && note.cause !== undefined) {
    yield* Effect.exit(noteLine(note, false))
  }
}

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
          "The retry's own delay is not a non-negative duration (a RetryableError's delay, or a " +
            "retryOn rule's answer): the computed backoff is used",
        ),
        duration,
      )
      : Effect.succeed(duration)
  })

/** A settlement the broker refused: counted, and said in the decision's reason. */
const settleFailed = (
  it: InHand,
  decision: Decision.Decision,
  what: string,
  cause: Cause.Cause<LeaseLost | TransportError>,
): Effect.Effect<Decision.Decision> => {
  WorkerMetrics.count(WorkerMetrics.ackFailures, it.df.fiber.context)
  const failure = Cause.findErrorOption(cause)
  if (Option.isSome(failure)) {
    return Effect.succeed({ ...decision, reason: `${what}_failed_${failure.value.reason}` })
  }
  return Effect.as(
    Effect.logError(`Settling the delivery (${what}) failed`, cause),
    { ...decision, reason: `${what}_failed` },
  )
}

/**
 * Gives the message back to the queue, as a failed attempt or unprocessed as the decision's
 * action says; the decision says if the broker refused.
 */
export const requeueDelivery = (it: InHand, decision: Decision.Decision) =>
  Effect.matchCauseEffect(
    decision.action === "nack-requeue" ? it.delivery.release : it.delivery.requeue,
    {
      onFailure: (cause) => settleFailed(it, decision, "requeue", cause),
      onSuccess: () => Effect.succeed(decision),
    },
  )

/** Acks the message; the decision says if the broker refused. */
const ackDelivery = (it: InHand, decision: Decision.Decision) =>
  Effect.matchCauseEffect(it.delivery.ack, {
    onFailure: (cause) => settleFailed(it, decision, "ack", cause),
    onSuccess: () => Effect.succeed(decision),
  })

/**
 * Settles as `plan` says, the last of every delivery's steps: step 6's conclusion (the terminal
 * message confirmed, then the ack) or requeue, and step 7's requeue of a terminal message the
 * output did not take.
 */
export function* settle<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  plan: Plan,
): Steps<Decision.Decision> {
  if (plan.note !== undefined) yield* logNote(plan.note)
  const delivery = it.delivery
  switch (plan._tag) {
    case "Fenced":
      return plan.decision
    case "Ack":
      return yield* ackDelivery(it, plan.decision)
    case "Requeue":
      return yield* requeueSettled(ctx, it, plan.decision, plan.delay)
    case "Conclude": {
      if (delivery.lease.isLost()) return leaseLost(it)
      const published = yield* publishHeld(ctx, it, {
        body: encodeUtf8(plan.text),
        type: plan.type,
        messageId: plan.messageId,
        deadline: it.takenAt + ctx.holdMillis,
        interruptible: false,
      })
      if (published === "published") {
        const code = plan.decision.code
        if (code !== undefined) {
          WorkerMetrics.count(WorkerMetrics.taskFailures(code), it.df.fiber.context)
        }
        return yield* ackDelivery(it, plan.decision)
      }
      if (published === "lost") return leaseLost(it)
      // A result the broker will not take fails its task at once: the failure is small.
      if (published === "too_large" && plan.type === "success" && it.task !== undefined) {
        return yield* settle(ctx, it, outputTooLarge(it.task, undefined))
      }
      if (typeof published !== "string") yield* logBroken(published)
      const outcome: Decision.Outcome = published === "expired" || published === "too_large"
        ? "publish_failed"
        : published === "closing"
        ? "shutdown_requeued"
        : "engine_error"
      const decision: Decision.Decision = {
        ...plan.decision,
        outcome,
        action: returnedAs(outcome, undefined),
      }
      return yield* requeueSettled(ctx, it, decision)
    }
  }
}

/**
 * A delivery whose lease was lost before it was settled: fenced like any lost lease (the broker
 * has it back, nothing is settled), with nothing of what it was to come to (a retry's or a
 * failure's code) carried over.
 */
const leaseLost = (it: InHand): Decision.Decision => fenced(it.task, "lease_lost").decision

/**
 * Gives the message back to the queue as `decision` says, after its attempt's backoff where it
 * waits one (a retry's own `delay` if valid): a requeue that did not come from the handler waits
 * too, so that a fault that lasts cannot spin. The backoff keeps the lease and watches it: a
 * lease lost meanwhile ends it at once (the broker has the message back).
 */
function* requeueSettled<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  decision: Decision.Decision,
  delay?: unknown,
): Steps<Decision.Decision> {
  if (waitsBackoff(decision)) {
    const millis = Duration.toMillis(yield* backoff(ctx.settings, it.task?.attempt ?? 1, delay))
    const waited = yield* hold(ctx, it, millis, false)
    if (waited === "lost") return leaseLost(it)
    // A shutdown cuts a retry's backoff short: still the retry of an attempt that failed,
    // rejected so that every broker counts it.
    if (waited === "closing" && decision.outcome === "retry") {
      decision = { ...decision, reason: "shutdown" }
    }
  }
  if (it.delivery.lease.isLost()) return leaseLost(it)
  const context = it.df.fiber.context
  const outcome = decision.outcome
  if (outcome === "retry") WorkerMetrics.count(WorkerMetrics.taskRetries, context)
  if (outcome === "shutdown_requeued") WorkerMetrics.count(WorkerMetrics.shutdownRequeued, context)
  return yield* requeueDelivery(it, decision)
}
