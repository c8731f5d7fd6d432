/**
 * The life of one delivery, exactly as the spec numbers it: decode, attempt, delivery limit,
 * `started`, the handler under its time limit with throttled progress and a kept lease, then
 * the conclusion — terminal message confirmed, **then** ack — or a requeue. Every delivery ends
 * in exactly one {@link Decision}.
 *
 * @since 0.1.0
 */
import {
  Cause,
  Context,
  Duration,
  Effect,
  Either,
  Exit,
  FiberSet,
  Metric,
  Random,
  Schema,
  Scope,
  Stream,
} from "effect"
import * as Decision from "./Decision.ts"
import { formatIssues } from "./internal/issues.ts"
import { LeaseRenewal } from "./LeaseRenewal.ts"
import { ProgressThrottle } from "./ProgressThrottle.ts"
import {
  decodeEnvelope,
  encodeMessageText,
  type Envelope,
  FAILURE_CODE_PATTERN,
  type MessageType,
  type OutboundMessage,
} from "./Protocol.ts"
import { Settings, type WorkerSettings } from "./Settings.ts"
import * as TaskContext from "./TaskContext.ts"
import { type Delivery, type Lease, Transport } from "./Transport.ts"
import type { Worker } from "./Worker.ts"
import type { LeaseLost, RetryableError, TransportError } from "./WorkerError.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"

/**
 * The engine of one worker.
 *
 * @since 0.1.0
 * @category tags
 */
export class DeliveryEngine
  extends Context.Tag("@async-task/worker/DeliveryEngine")<DeliveryEngine, {
    /** Runs one delivery to its settlement; never fails. */
    readonly handle: (delivery: Delivery) => Effect.Effect<Decision.Decision>
    /** Consumes the transport's deliveries, each in its own fiber, until intake stops. */
    readonly run: Effect.Effect<void, TransportError>
    /** Deliveries in hand. */
    readonly inFlight: Effect.Effect<number>
    /** Completes when no delivery is in hand. */
    readonly awaitIdle: Effect.Effect<void>
    /** Interrupts every delivery in hand: each requeues itself (`shutdown_requeued`). */
    readonly interruptAll: Effect.Effect<void>
  }>() {}

/** What the handler's run came to. */
type Result =
  | { readonly _tag: "Success"; readonly output: unknown }
  | { readonly _tag: "Fatal"; readonly code: string; readonly message: string }
  | { readonly _tag: "Retry"; readonly error: RetryableError }
  | { readonly _tag: "Timeout" }
  | { readonly _tag: "Internal"; readonly name: string }
  | { readonly _tag: "Lost"; readonly lost: LeaseLost }

/** What settling the delivery will do. */
type Plan =
  | { readonly _tag: "Ack"; readonly decision: Decision.Decision }
  | {
    readonly _tag: "Conclude"
    readonly type: MessageType
    readonly text: string
    readonly decision: Decision.Decision
  }
  | { readonly _tag: "Requeue"; readonly decision: Decision.Decision }
  | { readonly _tag: "Fenced"; readonly decision: Decision.Decision }

/** What is known of the task so far, for the decision of an interrupted or broken delivery. */
interface Known {
  taskId?: string
  attempt?: number
  deliveryLimit?: number
}

const encoder = new TextEncoder()

const INTERNAL_MESSAGE = "The worker failed while running the task."

const isTagged = (u: unknown, tag: string): u is { readonly _tag: string } =>
  typeof u === "object" && u !== null && (u as { _tag?: unknown })._tag === tag

const isPromiseLike = (u: unknown): u is PromiseLike<unknown> =>
  typeof u === "object" && u !== null && typeof (u as { then?: unknown }).then === "function"

const errorName = (u: unknown): string => {
  if (isTagged(u, (u as { _tag?: string })?._tag ?? "")) return (u as { _tag: string })._tag
  if (u instanceof Error) return u.name
  return typeof u
}

const classify = (exit: Exit.Exit<unknown, unknown>): Result => {
  if (Exit.isSuccess(exit)) return { _tag: "Success", output: exit.value }
  const failure = Cause.failureOption(exit.cause)
  const error = failure._tag === "Some" ? failure.value : Cause.squash(exit.cause)
  if (isTagged(error, "FatalError")) {
    const e = error as unknown as { code: unknown; message: unknown }
    return { _tag: "Fatal", code: String(e.code), message: String(e.message ?? "") }
  }
  if (isTagged(error, "RetryableError")) {
    return { _tag: "Retry", error: error as unknown as RetryableError }
  }
  return {
    _tag: "Internal",
    name: Cause.isInterruptedOnly(exit.cause) ? "Interrupted" : errorName(error),
  }
}

/**
 * The backoff before the requeue of `attempt`: exponential from `base`, capped at `max`, with
 * equal jitter (between half and all of it); or the error's own delay, capped at `max`.
 *
 * @since 0.1.0
 * @category retry
 */
export const backoff = (
  settings: Pick<WorkerSettings, "retryBackoffBase" | "retryBackoffMax">,
  attempt: number,
  delay: Duration.DurationInput | undefined,
): Effect.Effect<Duration.Duration> => {
  const maxMillis = Duration.toMillis(settings.retryBackoffMax)
  if (delay !== undefined) {
    const own = typeof delay === "number" ? delay * 1000 : Duration.toMillis(Duration.decode(delay))
    return Effect.succeed(Duration.millis(Math.min(Math.max(own, 0), maxMillis)))
  }
  const full = Math.min(
    Duration.toMillis(settings.retryBackoffBase) * 2 ** (attempt - 1),
    maxMillis,
  )
  return Effect.map(Random.next, (r) => Duration.millis(full / 2 + (r * full) / 2))
}

const invoke = <A, O, R>(
  worker: Worker<A, any, O, R>,
  input: A,
  context: TaskContext.TaskContext,
) =>
  Effect.suspend((): Effect.Effect<unknown, unknown, R> => {
    const result = worker.handler(input, context)
    if (Effect.isEffect(result)) return result
    if (isPromiseLike(result)) {
      return Effect.tryPromise({
        try: () => result as PromiseLike<unknown>,
        catch: (e) => e,
      })
    }
    return Effect.succeed(result)
  })

/**
 * Makes the engine of `worker`: its handler's requirements `R` are taken from the context now.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
): Effect.Effect<
  DeliveryEngine["Type"],
  never,
  Scope.Scope | Settings | Transport | ProgressThrottle | LeaseRenewal | R
> =>
  Effect.gen(function* () {
    const settings = yield* Settings
    const transport = yield* Transport
    const throttle = yield* ProgressThrottle
    const renewal = yield* LeaseRenewal
    // The handler's services, but not this engine's Scope: a handler that requires a Scope gets
    // its task's own (closed when the task ends), or its resources would live as long as the
    // worker.
    const services = yield* Effect.context<R>()
    const handlerContext = Context.omit(Scope.Scope)(services) as Context.Context<R>
    const fibers = yield* FiberSet.make<Decision.Decision>()
    const permits = yield* Effect.makeSemaphore(settings.concurrency)
    const decodeInput = Schema.decodeUnknownEither(worker.input)
    const encodeOutput = Schema.encodeEither(worker.output)
    const timeoutMillis = Duration.toMillis(settings.taskTimeout)
    let warnedClassic = false
    let inFlight = 0

    const conclude = (
      message: OutboundMessage,
      decision: Omit<Decision.Decision, "action" | "code">,
    ): Plan => {
      const encoded = encodeMessageText(message)
      if (Either.isLeft(encoded)) {
        // Only a success can fail to encode here: its response is not JSON data.
        return conclude(
          {
            type: "failure",
            task_id: message.task_id,
            code: "INVALID_OUTPUT",
            message: `The handler's output is not a JSON object: ${encoded.left.message}`,
          },
          { ...decision, outcome: "failure" },
        )
      }
      const code = message.type === "failure" ? message.code : undefined
      return {
        _tag: "Conclude",
        type: message.type,
        text: encoded.right,
        decision: { ...decision, action: "conclude", code },
      }
    }

    const fail = (
      known: Known,
      code: string,
      message: string,
      outcome: Decision.Outcome = "failure",
    ): Plan =>
      conclude({ type: "failure", task_id: known.taskId!, code, message }, { ...known, outcome })

    const checkedCode = (known: Known, code: string, message: string): Effect.Effect<Plan> =>
      FAILURE_CODE_PATTERN.test(code)
        ? Effect.succeed(fail(known, code, message))
        : Effect.logWarning(
          `The handler failed with the code "${code.slice(0, 80)}", which is not a valid code`,
        ).pipe(
          Effect.as(fail(known, "INTERNAL_ERROR", INTERNAL_MESSAGE)),
        )

    const runHandler = (envelope: Envelope, input: A, known: Known, lease: Lease) =>
      Effect.scoped(Effect.gen(function* () {
        const progress = yield* throttle.open(envelope.taskId)
        const runtime = yield* Effect.runtime<never>()
        const { abort, context } = TaskContext.make(
          {
            taskId: envelope.taskId,
            attempt: known.attempt!,
            deliveryLimit: known.deliveryLimit!,
            clientId: envelope.clientId,
            inputRefs: envelope.inputRefs ?? [],
          },
          (fraction, payload) => TaskContext.awaitable(progress.report(fraction, payload), runtime),
        )
        const handler = invoke(worker, input, context).pipe(
          Effect.provide(handlerContext),
          Effect.onInterrupt(() => Effect.sync(() => abort("The task was stopped"))),
          Effect.exit,
          Effect.map(classify),
        )
        const timer = Effect.sleep(Duration.millis(timeoutMillis)).pipe(
          Effect.zipRight(Effect.sync((): Result => {
            abort("The task ran past its time limit")
            return { _tag: "Timeout" }
          })),
        )
        const lost = renewal.keep(lease).pipe(
          Effect.map((lost): Result => {
            abort("The task's lease was lost")
            return { _tag: "Lost", lost }
          }),
        )
        const result = yield* Effect.raceAll([handler, timer, lost])
        yield* progress.close
        return result
      })).pipe(
        Effect.annotateLogs({
          task_id: envelope.taskId,
          service: worker.name,
          attempt: known.attempt,
        }),
      )

    const afterHandler = (result: Result, known: Known): Effect.Effect<Plan> => {
      switch (result._tag) {
        case "Success": {
          const encoded = encodeOutput(result.output as O)
          if (Either.isLeft(encoded)) {
            return Effect.succeed(fail(
              known,
              "INVALID_OUTPUT",
              `The handler's output does not match the output schema: ${
                formatIssues(encoded.left)
              }`,
            ))
          }
          const response = encoded.right as Record<string, unknown>
          return Effect.succeed(
            conclude({ type: "success", task_id: known.taskId!, response }, {
              ...known,
              outcome: "success",
            }),
          )
        }
        case "Fatal":
          return checkedCode(known, result.code, result.message)
        case "Retry": {
          const error = result.error
          if (known.attempt! < known.deliveryLimit!) {
            return backoff(settings, known.attempt!, error.delay).pipe(
              Effect.flatMap(Effect.sleep),
              Effect.as<Plan>({
                _tag: "Requeue",
                decision: { ...known, outcome: "retry", action: "nack-requeue", code: error.code },
              }),
            )
          }
          // A tagged error made without a message inherits `Error.prototype.message` (""): an
          // empty message falls back to the sentence as an absent one does.
          return checkedCode(
            known,
            error.code ?? "RETRY_EXHAUSTED",
            typeof error.message === "string" && error.message !== ""
              ? error.message
              : `The task failed on each of its ${known.deliveryLimit} attempts.`,
          )
        }
        case "Timeout":
          return Effect.succeed(
            fail(
              known,
              "TASK_TIMEOUT",
              `The task ran past its time limit of ${Duration.format(settings.taskTimeout)}.`,
            ),
          )
        case "Internal":
          return Effect.logError(`The handler failed with an unexpected ${result.name}`).pipe(
            Effect.annotateLogs({ task_id: known.taskId, error: result.name }),
            Effect.as(fail(known, "INTERNAL_ERROR", INTERNAL_MESSAGE)),
          )
        case "Lost":
          return Effect.succeed<Plan>({
            _tag: "Fenced",
            decision: {
              ...known,
              outcome: "cancelled",
              action: "nack-requeue",
              reason: `lease_${result.lost.reason}`,
            },
          })
      }
    }

    const prepare = (delivery: Delivery, known: Known): Effect.Effect<Plan> =>
      Effect.gen(function* () {
        const decoded = decodeEnvelope(delivery.body, { maxBytes: settings.maxMessageBytes })
        if (decoded._tag === "Poison") {
          yield* Metric.increment(WorkerMetrics.poisonMessages(decoded.reason))
          return {
            _tag: "Ack",
            decision: { outcome: "poison", action: "ack", reason: decoded.reason },
          } satisfies Plan
        }
        known.taskId = decoded._tag === "Task" ? decoded.envelope.taskId : decoded.taskId
        if (decoded._tag === "InvalidEnvelope") {
          yield* Metric.increment(WorkerMetrics.poisonMessages("invalid_envelope"))
          const plan = fail(
            known,
            "INVALID_MESSAGE",
            `The task message is malformed: ${decoded.problem}.`,
            "poison",
          )
          return { ...plan, decision: { ...plan.decision, reason: "invalid_envelope" } }
        }
        const envelope = decoded.envelope
        if (delivery.redeliveries._tag === "Counted") {
          known.attempt = delivery.redeliveries.count + 1
          known.deliveryLimit = settings.deliveryLimit
        } else {
          if (!warnedClassic) {
            warnedClassic = true
            yield* Effect.logWarning(
              "The input queue reports only a redelivered flag (a classic queue): a retried task gets one retry. Use a quorum queue for the full delivery limit.",
            )
          }
          known.attempt = delivery.redeliveries.redelivered ? 2 : 1
          known.deliveryLimit = Math.min(settings.deliveryLimit, 2)
        }
        if (known.attempt > settings.deliveryLimit) {
          return fail(
            known,
            "TASK_ABANDONED_AFTER_REDELIVERIES",
            `The task was delivered ${known.attempt} times, past the limit of ${settings.deliveryLimit}: it was abandoned without running again.`,
          )
        }
        const input = decodeInput(envelope.body)
        if (Either.isLeft(input)) {
          return fail(
            known,
            "INVALID_INPUT",
            `The task input is invalid: ${formatIssues(input.left)}`,
          )
        }
        if (yield* delivery.lease.isLost) {
          return {
            _tag: "Fenced",
            decision: {
              ...known,
              outcome: "cancelled",
              action: "nack-requeue",
              reason: "lease_lost",
            },
          } satisfies Plan
        }
        const started = encodeMessageText({
          type: "started",
          task_id: envelope.taskId,
          hostname: settings.hostname,
        })
        const confirmed = yield* transport.publish(
          encoder.encode(Either.getOrThrow(started)),
          "started",
        ).pipe(Effect.either)
        if (Either.isLeft(confirmed)) {
          yield* Metric.increment(WorkerMetrics.publishFailures("started"))
          return {
            _tag: "Requeue",
            decision: {
              ...known,
              outcome: "publish_failed",
              action: "nack-requeue",
              reason: "started",
            },
          } satisfies Plan
        }
        yield* Metric.increment(WorkerMetrics.messagesPublished("started"))
        const startedAt = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
        const result = yield* runHandler(envelope, input.right, known, delivery.lease)
        const plan = yield* afterHandler(result, known)
        const endedAt = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
        yield* Metric.update(WorkerMetrics.taskDuration, (endedAt - startedAt) / 1000)
        return plan
      })

    const requeue = (
      delivery: Delivery,
      decision: Decision.Decision,
    ): Effect.Effect<Decision.Decision> =>
      delivery.requeue.pipe(
        Effect.as(decision),
        Effect.catchAll((error) =>
          Metric.increment(WorkerMetrics.ackFailures).pipe(
            Effect.as({
              ...decision,
              reason: `requeue_failed_${error._tag === "LeaseLost" ? error.reason : error.reason}`,
            }),
          )
        ),
      )

    const settle = (delivery: Delivery, plan: Plan): Effect.Effect<Decision.Decision> => {
      switch (plan._tag) {
        case "Fenced":
          return Effect.succeed(plan.decision)
        case "Ack":
          return delivery.ack.pipe(
            Effect.as(plan.decision),
            Effect.catchAll(() =>
              Metric.increment(WorkerMetrics.ackFailures).pipe(
                Effect.as({ ...plan.decision, reason: `${plan.decision.reason}; ack_failed` }),
              )
            ),
          )
        case "Requeue":
          return Effect.gen(function* () {
            if (yield* delivery.lease.isLost) {
              return {
                ...plan.decision,
                outcome: "cancelled",
                reason: "lease_lost",
              } satisfies Decision.Decision
            }
            if (plan.decision.outcome === "retry") {
              yield* Metric.increment(WorkerMetrics.taskRetries)
            }
            if (plan.decision.outcome === "shutdown_requeued") {
              yield* Metric.increment(WorkerMetrics.shutdownRequeued)
            }
            return yield* requeue(delivery, plan.decision)
          })
        case "Conclude":
          return Effect.gen(function* () {
            if (yield* delivery.lease.isLost) {
              return {
                ...plan.decision,
                outcome: "cancelled",
                action: "nack-requeue",
                reason: "lease_lost",
              } satisfies Decision.Decision
            }
            const published = yield* transport.publish(encoder.encode(plan.text), plan.type).pipe(
              Effect.either,
            )
            if (Either.isLeft(published)) {
              yield* Metric.increment(WorkerMetrics.publishFailures(plan.type))
              return yield* requeue(delivery, {
                ...plan.decision,
                outcome: "publish_failed",
                action: "nack-requeue",
              })
            }
            yield* Metric.increment(WorkerMetrics.messagesPublished(plan.type))
            if (plan.decision.code !== undefined) {
              yield* Metric.increment(WorkerMetrics.taskFailures(plan.decision.code))
            }
            return yield* delivery.ack.pipe(
              Effect.as(plan.decision),
              Effect.catchAll((error) =>
                Metric.increment(WorkerMetrics.ackFailures).pipe(
                  Effect.as({
                    ...plan.decision,
                    reason: `ack_failed_${
                      error._tag === "LeaseLost" ? error.reason : error.reason
                    }`,
                  }),
                )
              ),
            )
          })
      }
    }

    const handle = (delivery: Delivery): Effect.Effect<Decision.Decision> =>
      Effect.uninterruptibleMask((restore) => {
        const known: Known = {}
        return restore(prepare(delivery, known)).pipe(
          Effect.exit,
          Effect.flatMap((exit): Effect.Effect<Decision.Decision> => {
            if (Exit.isSuccess(exit)) return settle(delivery, exit.value)
            if (Cause.isInterruptedOnly(exit.cause)) {
              return settle(delivery, {
                _tag: "Requeue",
                decision: { ...known, outcome: "shutdown_requeued", action: "nack-requeue" },
              })
            }
            return Effect.logError(
              "The delivery engine failed; the message is requeued",
              exit.cause,
            ).pipe(
              Effect.zipRight(
                settle(delivery, {
                  _tag: "Requeue",
                  decision: { ...known, outcome: "engine_error", action: "nack-requeue" },
                }),
              ),
            )
          }),
          Effect.tap(Decision.log),
          Effect.annotateLogs("service", worker.name),
        )
      })

    const track = (delivery: Delivery) =>
      Effect.suspend(() => {
        inFlight++
        return Metric.set(WorkerMetrics.tasksInFlight, inFlight)
      }).pipe(
        Effect.zipRight(handle(delivery)),
        Effect.ensuring(Effect.suspend(() => {
          inFlight--
          return Effect.zipRight(
            Metric.set(WorkerMetrics.tasksInFlight, inFlight),
            permits.release(1),
          )
        })),
      )

    return DeliveryEngine.of({
      handle,
      run: Stream.runForEach(
        transport.deliveries,
        (delivery) => permits.take(1).pipe(Effect.zipRight(FiberSet.run(fibers, track(delivery)))),
      ),
      inFlight: Effect.sync(() => inFlight),
      awaitIdle: FiberSet.awaitEmpty(fibers),
      interruptAll: FiberSet.clear(fibers),
    })
  })
