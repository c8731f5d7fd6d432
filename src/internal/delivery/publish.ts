/**
 * A message the engine publishes for a delivery (`started`, or its terminal message), held
 * through the output's refusals: a refused publish closes the output gate and is tried again
 * after a capped, jittered backoff, while the lease holds and the lease's time allows (see
 * {@link publishHeld}). Step 4, `started`, is here; the terminal message is published by the
 * settlement (`settle.ts`).
 */
import { Cause, Effect, Exit, Option, Random, Result } from "effect"
import { encodeMessageText, type MessageType } from "../../Protocol.ts"
import type { Lease, PublishOptions } from "../../Transport.ts"
import * as WorkerMetrics from "../../WorkerMetrics.ts"
import { encodeUtf8 } from "../codec/utf8.ts"
import type { EngineContext, InHand, Steps } from "./context.ts"
import { fenced, messageIdOf, type Plan, requeue, type Task } from "./plan.ts"
import { interruptedFromOutside } from "./run.ts"
import type { Timer } from "./timers.ts"

/** The first wait before a refused publish is tried again, and the longest. */
const PUBLISH_RETRY_BASE_MILLIS = 100
const PUBLISH_RETRY_MAX_MILLIS = 5000

/**
 * What a publish held through the output's refusals came to: confirmed, the lease lost, the
 * lease's time used up (`expired`), the engine closing, a message larger than the broker takes
 * (`too_large`: refused again whenever tried), or a defect of the transport.
 */
export type Publication =
  | "published"
  | "lost"
  | "expired"
  | "closing"
  | "too_large"
  | Cause.Cause<unknown>

type Waited = "elapsed" | "lost" | "closing"

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
export const hold = <A, O, R>(
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
 * A message to publish for the delivery, and how long it may be held for it; the options the
 * transport takes itself (its id, a traced delivery's `traceparent` header), so that a publish
 * makes no object of its own.
 */
export interface Outgoing extends PublishOptions {
  readonly body: Uint8Array
  readonly type: MessageType
  /** Its id: the same for each copy (`messageIdOf`). */
  readonly messageId: string
  /** When the retries of a refused publish stop: the lease's time, less what must follow. */
  readonly deadline: number
  /** Whether a shutdown may cut the publish short (`started`), or only its retries' waits. */
  readonly interruptible: boolean
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
): Steps<Publication> {
  let delayMillis = PUBLISH_RETRY_BASE_MILLIS
  let tries = !ctx.gate.refusing
  for (;;) {
    if (tries) {
      if (it.delivery.lease.isLost()) return "lost"
      const publish = ctx.transport.publish(out.body, out.type, out)
      const published = yield* Effect.exit(out.interruptible ? it.restore(publish) : publish)
      if (Exit.isSuccess(published)) {
        const opened = ctx.gate.accepted()
        if (opened !== undefined) yield* opened
        WorkerMetrics.count(WorkerMetrics.messagesPublished(out.type), it.df.fiber.context)
        return "published"
      }
      const refusal = Cause.findErrorOption(published.cause)
      if (Option.isNone(refusal) || Cause.hasDies(published.cause)) {
        return Cause.hasInterruptsOnly(published.cause) ? "closing" : published.cause
      }
      WorkerMetrics.count(WorkerMetrics.publishFailures(out.type), it.df.fiber.context)
      if (refusal.value.reason === "too_large") return "too_large"
      // A publish lost with its connection is retried on the next one; only the broker's own
      // refusals close the gate.
      if (refusal.value.reason !== "closed") yield* ctx.gate.refused(refusal.value)
    }
    tries = true
    const jittered = Math.round(delayMillis / 2 + ((yield* Random.next) * delayMillis) / 2)
    const waited = yield* hold(ctx, it, jittered, true)
    if (waited !== "elapsed") return waited
    if (ctx.clock.currentTimeMillisUnsafe() >= out.deadline) return "expired"
    delayMillis = Math.min(delayMillis * 2, PUBLISH_RETRY_MAX_MILLIS)
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

/** The ERROR line of a delivery the engine broke on, with its cause. */
export const logBroken = (cause: Cause.Cause<unknown>) =>
  Effect.logError("The delivery engine failed; the message is requeued", cause)

/**
 * Step 4: `started`, confirmed, unless the lease is already gone; `undefined` when the task may
 * run. The handler must still fit in the lease once `started` is out.
 */
export function* publishStarted<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  task: Task,
): Steps<Plan | undefined> {
  if (it.delivery.lease.isLost()) return fenced(task, "lease_lost")
  const started = encodeMessageText({
    type: "started",
    task_id: task.taskId,
    hostname: ctx.settings.hostname,
  })
  const published = yield* publishHeld(ctx, it, {
    body: encodeUtf8(Result.getOrThrow(started)),
    type: "started",
    messageId: messageIdOf(task, "started"),
    deadline: it.takenAt + ctx.holdMillis - ctx.timeoutMillis,
    interruptible: true,
  })
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
