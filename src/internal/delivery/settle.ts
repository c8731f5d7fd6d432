/**
 * Where every delivery is settled: a terminal message published and confirmed, **then** acked;
 * or requeued; or, its lease lost, left to the broker. The terminal message is held through the
 * output's refusals (`publish.ts`); a requeue that did not come from the handler waits its
 * attempt's backoff first, so that a fault that lasts cannot spin.
 */
import { Cause, Duration, Effect, Option, Random } from "effect"
import type * as Decision from "../../Decision.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { LeaseLost, TransportError } from "../../WorkerError.ts"
import * as WorkerMetrics from "../../WorkerMetrics.ts"
import { encodeUtf8 } from "../codec/utf8.ts"
import type { EngineContext, InHand, Steps } from "./context.ts"
import { outputTooLarge } from "./conclude.ts"
import { backoffMillis, fenced, type Plan, returnedAs } from "./plan.ts"
import { hold, logBroken, publishHeld } from "./publish.ts"

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
  const delivery = it.delivery
  switch (plan._tag) {
    case "Fenced":
      return plan.decision
    case "Ack":
      return yield* ackDelivery(it, plan.decision)
    case "Requeue":
      return yield* requeueSettled(ctx, it, plan.decision)
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

function* requeueSettled<A, O, R>(
  ctx: EngineContext<A, O, R>,
  it: InHand,
  decision: Decision.Decision,
): Steps<Decision.Decision> {
  const delivery = it.delivery
  const outcome = decision.outcome
  // A service missing stops the worker: that requeue cannot spin, and waits for nothing.
  if (
    outcome === "publish_failed" ||
    (outcome === "engine_error" && decision.reason !== "missing_service")
  ) {
    const delay = yield* backoff(ctx.settings, it.task?.attempt ?? 1, undefined)
    yield* hold(ctx, it, Duration.toMillis(delay), false)
  }
  if (delivery.lease.isLost()) return leaseLost(it)
  const context = it.df.fiber.context
  if (outcome === "retry") WorkerMetrics.count(WorkerMetrics.taskRetries, context)
  if (outcome === "shutdown_requeued") WorkerMetrics.count(WorkerMetrics.shutdownRequeued, context)
  return yield* requeueDelivery(it, decision)
}
