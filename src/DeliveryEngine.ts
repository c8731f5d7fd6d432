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
  Equal,
  Exit,
  Fiber,
  type FiberId,
  FiberRef,
  FiberRefs,
  FiberSet,
  HashMap,
  Option,
  Random,
  Schema,
  Scope,
} from "effect"
import type { YieldWrap } from "effect/Utils"
import * as Concurrency from "./Concurrency.ts"
import * as Decision from "./Decision.ts"
import { formatIssues } from "./internal/issues.ts"
import * as Timers from "./internal/timers.ts"
import { encodeUtf8 } from "./internal/utf8.ts"
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
    /**
     * Sets the number of tasks run at once, and the prefetch: growing grants capacity at once;
     * shrinking starts no task until enough running ones settle; `0` pauses intake.
     */
    readonly setConcurrency: (n: number) => Effect.Effect<void, Concurrency.ConcurrencyError>
    /** The number of tasks run at once now. */
    readonly concurrency: Effect.Effect<number>
  }>() {}

/** What the handler's run came to. */
type Result =
  | { readonly _tag: "Success"; readonly output: unknown }
  | { readonly _tag: "Fatal"; readonly code: string; readonly message: string }
  | { readonly _tag: "Retry"; readonly error: RetryableError }
  | { readonly _tag: "Timeout" }
  | { readonly _tag: "Internal"; readonly name: string }
  | { readonly _tag: "Lost"; readonly lost: LeaseLost }
  | { readonly _tag: "Shutdown" }

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

const handlerEnd = (result: Result): Concurrency.HandlerEnd => {
  switch (result._tag) {
    case "Success":
      return "success"
    case "Retry":
      return result.error.congestion === true ? "congestion" : "other"
    case "Timeout":
      return "timeout"
    default:
      return "other"
  }
}

/** The slot a delivery's task holds, once it has one. */
interface Held {
  ticket?: number | undefined
}

/**
 * `refs` with the log annotations and the context set for the fiber `id`, as
 * `FiberRefs.updateManyAs` sets them, but without its check that each value differs from the
 * one it replaces: a structural comparison of two HashMaps and two Contexts, which measured
 * 2 µs of a delivery's 20, when a new task's values always differ.
 */
const withTaskRefs = (
  refs: FiberRefs.FiberRefs,
  id: FiberId.Runtime,
  annotations: HashMap.HashMap<string, unknown>,
  context: Context.Context<any>,
): FiberRefs.FiberRefs => {
  const locals = new Map(refs.locals)
  setOwn(locals, id, FiberRef.currentLogAnnotations, annotations)
  setOwn(locals, id, FiberRef.currentContext, context)
  return FiberRefs.unsafeMake(locals)
}

/** Makes `value` the fiber's own value of `ref`: the head of its stack of values. */
const setOwn = (
  locals: FiberRefs.FiberRefs["locals"],
  id: FiberId.Runtime,
  ref: FiberRef.FiberRef<any>,
  value: unknown,
): void => {
  const stack = locals.get(ref)
  if (stack === undefined) return void locals.set(ref, [[id, value]])
  const own = stack[0][0] === id || Equal.equals(stack[0][0], id)
  locals.set(ref, own ? [[id, value], ...stack.slice(1)] : [[id, value], ...stack])
}

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

/**
 * Calls the handler now and returns what it gave as an Effect (a throw is a defect, as inside
 * `Effect.suspend`): called by the delivery's own steps, where a suspension would be one more
 * step of every task. An Effect handler's work waits for its Effect to run; an `async` one's
 * starts now, and a shutdown that comes meanwhile interrupts it and fires its signal.
 */
const invoke = <A, O, R>(
  worker: Worker<A, any, O, R>,
  input: A,
  context: TaskContext.TaskContext,
): Effect.Effect<unknown, unknown, R> => {
  let result: unknown
  try {
    result = worker.handler(input, context)
  } catch (defect) {
    return Effect.die(defect)
  }
  if (Effect.isEffect(result)) return result as Effect.Effect<unknown, unknown, R>
  if (isPromiseLike(result)) {
    return Effect.tryPromise({
      try: () => result as PromiseLike<unknown>,
      catch: (e) => e,
    })
  }
  return Effect.succeed(result)
}

/**
 * The fiber a delivery runs on (a pool fiber, or `handle`'s), and its note that the engine
 * itself interrupted it (a time limit, a lost lease).
 */
interface Slot {
  readonly fiber: Fiber.RuntimeFiber<unknown, unknown>
  stopped: boolean
}

/** The steps of a delivery, run by delegation (`yield*`) inside its one `Effect.gen`. */
type Steps<A> = Generator<YieldWrap<Effect.Effect<any, never, never>>, A, any>

/** A restore of `Effect.uninterruptibleMask`: what it runs may be interrupted. */
type Restore = <X, E, RR>(effect: Effect.Effect<X, E, RR>) => Effect.Effect<X, E, RR>

/**
 * Makes the engine of `worker`: its handler's requirements `R` are taken from the context now.
 *
 * Deliveries run on a pool of `concurrency` long-lived fibers, and a task's time limit and
 * lease are watched by shared timers: a fiber or a race per delivery would cost more than the
 * rest of the engine together. A handler runs on its pool fiber, so stopping it (time limit,
 * lost lease) interrupts that fiber: the delivery is still settled, uninterruptibly, and the
 * fiber is then replaced.
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
    const runtime = yield* Effect.runtime<never>()
    const loggerFor = (info: TaskContext.TaskInfo) =>
      TaskContext.makeLogger({ ...info, service: worker.name }, runtime)
    const timers = yield* Timers.make
    const clock = yield* Effect.clock
    // The handler's services, but not this engine's Scope: a handler that requires a Scope gets
    // its task's own (closed when the task ends), or its resources would live as long as the
    // worker.
    const services = yield* Effect.context<R>()
    const handlerContext = Context.omit(Scope.Scope)(services) as Context.Context<R>
    const baseAnnotations = HashMap.make(["service", worker.name] as [string, unknown])
    const fibers = yield* FiberSet.make<void, TransportError>()
    const decodeInput = Schema.decodeUnknownEither(worker.input)
    const encodeOutput = Schema.encodeEither(worker.output)
    const timeoutMillis = Duration.toMillis(settings.taskTimeout)
    let warnedClassic = false
    let inFlight = 0
    let poolSize = 0
    const limiter = yield* Concurrency.makeLimiter(
      worker.policy,
      settings.concurrency,
      worker.weight,
    )
    let closing = false

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
            message: `The handler's output is not JSON data: ${encoded.left.message}`,
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

    /** A lost lease: the broker has the message back, and nothing more is published for it. */
    const fenced = (known: Known, reason: string): Plan => ({
      _tag: "Fenced",
      decision: { ...known, outcome: "cancelled", action: "nack-requeue", reason },
    })

    const checkedCode = (known: Known, code: string, message: string): Effect.Effect<Plan> =>
      FAILURE_CODE_PATTERN.test(code)
        ? Effect.succeed(fail(known, code, message))
        : Effect.logWarning(
          `The handler failed with the code "${code.slice(0, 80)}", which is not a valid code`,
        ).pipe(Effect.as(fail(known, "INTERNAL_ERROR", INTERNAL_MESSAGE)))

    /**
     * Steps 1 to 3, and the input: decode, attempt, delivery limit, input schema. Synchronous:
     * it runs for every delivery, poison included, and needs no Effect of its own.
     */
    const prelude = (
      delivery: Delivery,
      known: Known,
    ): Plan | { readonly _tag: "Run"; readonly envelope: Envelope; readonly input: A } => {
      const decoded = decodeEnvelope(delivery.body, { maxBytes: settings.maxMessageBytes })
      if (decoded._tag === "Poison") {
        WorkerMetrics.count(WorkerMetrics.poisonMessages(decoded.reason))
        return {
          _tag: "Ack",
          decision: { outcome: "poison", action: "ack", reason: decoded.reason },
        }
      }
      known.taskId = decoded._tag === "Task" ? decoded.envelope.taskId : decoded.taskId
      if (decoded._tag === "InvalidEnvelope") {
        WorkerMetrics.count(WorkerMetrics.poisonMessages("invalid_envelope"))
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
      return { _tag: "Run", envelope, input: input.right }
    }

    const warnClassicOnce = (delivery: Delivery): Effect.Effect<void> => {
      if (warnedClassic || delivery.redeliveries._tag === "Counted") return Effect.void
      warnedClassic = true
      return Effect.logWarning(
        "The input queue reports only a redelivered flag (a classic queue): a retried task gets one retry. Use a quorum queue for the full delivery limit.",
      )
    }

    /**
     * Step 4: `started`, confirmed, unless the lease is already gone; `undefined` when the task
     * may run.
     */
    function* publishStarted(
      delivery: Delivery,
      envelope: Envelope,
      known: Known,
      restore: Restore,
    ): Steps<Plan | undefined> {
      if (delivery.lease.isLost()) return fenced(known, "lease_lost")
      const started = encodeMessageText({
        type: "started",
        task_id: envelope.taskId,
        hostname: settings.hostname,
      })
      const published = yield* Effect.exit(
        restore(transport.publish(encodeUtf8(Either.getOrThrow(started)), "started")),
      )
      if (Exit.isSuccess(published)) {
        WorkerMetrics.count(WorkerMetrics.messagesPublished("started"))
        return undefined
      }
      if (!Cause.isDie(published.cause) && Option.isSome(Cause.failureOption(published.cause))) {
        WorkerMetrics.count(WorkerMetrics.publishFailures("started"))
        return {
          _tag: "Requeue",
          decision: {
            ...known,
            outcome: "publish_failed",
            action: "nack-requeue",
            reason: "started",
          },
        }
      }
      return yield* shutdownOrBroken(known, published.cause)
    }

    /**
     * Step 5: the handler on this fiber, under its time limit, with the lease kept and progress
     * throttled. The task's own scope (the handler's resources and its progress channel) is
     * closed before this returns, so nothing of the task outlives it.
     */
    function* runHandler(
      envelope: Envelope,
      input: A,
      known: Known,
      lease: Lease,
      slot: Slot,
      restore: Restore,
      taskScope: Scope.CloseableScope,
    ): Steps<Result> {
      let progress: ProgressThrottle["Type"] extends
        { open: (...a: any) => Effect.Effect<infer P, any, any> } ? P | undefined
        : never
      const report = (fraction: number, payload?: Readonly<Record<string, unknown>>) =>
        Effect.suspend(() => {
          if (progress !== undefined) return progress.report(fraction, payload)
          return Scope.extend(throttle.open(envelope.taskId), taskScope).pipe(
            Effect.flatMap((opened) => {
              progress ??= opened
              return progress.report(fraction, payload)
            }),
          )
        })
      const { abort, context } = TaskContext.make(
        {
          taskId: envelope.taskId,
          attempt: known.attempt!,
          deliveryLimit: known.deliveryLimit!,
          clientId: envelope.clientId,
          inputRefs: envelope.inputRefs ?? [],
        },
        (fraction, payload) => TaskContext.awaitable(report(fraction, payload), runtime),
        loggerFor,
      )
      let running = true
      let stoppedWith: Result | undefined
      const stop = (result: Result, reason: string) => {
        if (!running || stoppedWith !== undefined) return
        stoppedWith = result
        slot.stopped = true
        abort(reason)
        slot.fiber.unsafeInterruptAsFork(slot.fiber.id())
      }
      const cancelTimer = timers.after(
        timeoutMillis,
        () => stop({ _tag: "Timeout" }, "The task ran past its time limit"),
      )
      const release = renewal.unsafeHold(
        lease,
        (lost) => stop({ _tag: "Lost", lost }, "The task's lease was lost"),
      )
      const exit = yield* Effect.exit(
        restore(invoke(worker, input, context) as Effect.Effect<unknown, unknown>),
      )
      running = false
      cancelTimer()
      release()
      const interrupted = Exit.isFailure(exit) && Cause.isInterrupted(exit.cause)
      if (interrupted && stoppedWith === undefined) abort("The worker is shutting down")
      yield* Scope.close(taskScope, exit)
      return interrupted ? stoppedWith ?? { _tag: "Shutdown" } : classify(exit)
    }

    /** Step 6 for a handler that succeeded: its output, encoded, is the task's response. */
    const succeeded = (output: unknown, known: Known): Plan => {
      const encoded = encodeOutput(output as O)
      if (Either.isLeft(encoded)) {
        return fail(
          known,
          "INVALID_OUTPUT",
          `The handler's output does not match the output schema: ${formatIssues(encoded.left)}`,
        )
      }
      const response = encoded.right as Record<string, unknown>
      return conclude(
        { type: "success", task_id: known.taskId!, response },
        { ...known, outcome: "success" },
      )
    }

    /**
     * Step 6 for any other result; a retry waits its backoff here. A generator of its own, which
     * a success (most deliveries) does without.
     */
    function* afterHandler(
      result: Exclude<Result, { readonly _tag: "Success" }>,
      known: Known,
      restore: Restore,
    ): Steps<Plan> {
      switch (result._tag) {
        case "Fatal":
          return yield* checkedCode(known, result.code, result.message)
        case "Retry": {
          const error = result.error
          if (known.attempt! < known.deliveryLimit!) {
            const requeue: Plan = {
              _tag: "Requeue",
              decision: { ...known, outcome: "retry", action: "nack-requeue", code: error.code },
            }
            const shutdown: Plan = {
              _tag: "Requeue",
              decision: { ...known, outcome: "shutdown_requeued", action: "nack-requeue" },
            }
            const delay = yield* backoff(settings, known.attempt!, error.delay)
            const slept = yield* Effect.exit(restore(Effect.sleep(delay)))
            return Exit.isSuccess(slept) ? requeue : shutdown
          }
          // A tagged error made without a message inherits `Error.prototype.message` (""): an
          // empty message falls back to the sentence as an absent one does.
          return yield* checkedCode(
            known,
            error.code ?? "RETRY_EXHAUSTED",
            typeof error.message === "string" && error.message !== ""
              ? error.message
              : `The task failed on each of its ${known.deliveryLimit} attempts.`,
          )
        }
        case "Timeout":
          return fail(
            known,
            "TASK_TIMEOUT",
            `The task ran past its time limit of ${Duration.format(settings.taskTimeout)}.`,
          )
        case "Internal":
          yield* Effect.logError(`The handler failed with an unexpected ${result.name}`).pipe(
            Effect.annotateLogs({ error: result.name }),
          )
          return fail(known, "INTERNAL_ERROR", INTERNAL_MESSAGE)
        case "Lost":
          return fenced(known, `lease_${result.lost.reason}`)
        case "Shutdown":
          return {
            _tag: "Requeue",
            decision: { ...known, outcome: "shutdown_requeued", action: "nack-requeue" },
          }
      }
    }

    /** A settlement the broker refused: counted, and said in the decision's reason. */
    const settleFailed = (
      decision: Decision.Decision,
      what: string,
      error: LeaseLost | TransportError,
    ): Decision.Decision => {
      WorkerMetrics.count(WorkerMetrics.ackFailures)
      return { ...decision, reason: `${what}_failed_${error.reason}` }
    }

    const requeue = (delivery: Delivery, decision: Decision.Decision) =>
      Effect.match(delivery.requeue, {
        onFailure: (error) => settleFailed(decision, "requeue", error),
        onSuccess: () => decision,
      })

    const ack = (delivery: Delivery, decision: Decision.Decision) =>
      Effect.match(delivery.ack, {
        onFailure: (error) => settleFailed(decision, "ack", error),
        onSuccess: () => decision,
      })

    /** Where every delivery is settled: after the terminal message is confirmed, or requeued. */
    function* settle(delivery: Delivery, plan: Plan): Steps<Decision.Decision> {
      switch (plan._tag) {
        case "Fenced":
          return plan.decision
        case "Ack":
          return yield* ack(delivery, plan.decision)
        case "Requeue": {
          if (delivery.lease.isLost()) {
            return { ...plan.decision, outcome: "cancelled", reason: "lease_lost" }
          }
          if (plan.decision.outcome === "retry") WorkerMetrics.count(WorkerMetrics.taskRetries)
          if (plan.decision.outcome === "shutdown_requeued") {
            WorkerMetrics.count(WorkerMetrics.shutdownRequeued)
          }
          return yield* requeue(delivery, plan.decision)
        }
        case "Conclude": {
          if (delivery.lease.isLost()) {
            return {
              ...plan.decision,
              outcome: "cancelled",
              action: "nack-requeue",
              reason: "lease_lost",
            }
          }
          const published = yield* Effect.either(
            transport.publish(encodeUtf8(plan.text), plan.type),
          )
          if (Either.isLeft(published)) {
            WorkerMetrics.count(WorkerMetrics.publishFailures(plan.type))
            return yield* requeue(delivery, {
              ...plan.decision,
              outcome: "publish_failed",
              action: "nack-requeue",
            })
          }
          WorkerMetrics.count(WorkerMetrics.messagesPublished(plan.type))
          if (plan.decision.code !== undefined) {
            WorkerMetrics.count(WorkerMetrics.taskFailures(plan.decision.code))
          }
          return yield* ack(delivery, plan.decision)
        }
      }
    }

    const shutdownOrBroken = (known: Known, cause: Cause.Cause<unknown>): Effect.Effect<Plan> =>
      Cause.isInterruptedOnly(cause)
        ? Effect.succeed({
          _tag: "Requeue",
          decision: { ...known, outcome: "shutdown_requeued", action: "nack-requeue" },
        })
        : Effect.logError("The delivery engine failed; the message is requeued", cause).pipe(
          Effect.as<Plan>({
            _tag: "Requeue",
            decision: { ...known, outcome: "engine_error", action: "nack-requeue" },
          }),
        )

    /** Steps 4 to 6 of a valid task: `started`, the handler, and what its result comes to. */
    function* run(
      delivery: Delivery,
      envelope: Envelope,
      input: A,
      known: Known,
      slot: Slot,
      restore: Restore,
      held: Held,
      taskScope: Scope.CloseableScope,
    ): Steps<Plan> {
      if (!warnedClassic && delivery.redeliveries._tag === "Flagged") {
        yield* warnClassicOnce(delivery)
      }
      // A task waits here, its delivery in hand, while the worker (or its pool) is at its limit.
      held.ticket = limiter.tryAcquire()
      while (held.ticket === undefined) {
        const waited = yield* Effect.exit(restore(limiter.awaitSlot))
        if (Exit.isFailure(waited)) return yield* shutdownOrBroken(known, waited.cause)
        held.ticket = limiter.tryAcquire()
      }
      const started = yield* publishStarted(delivery, envelope, known, restore)
      if (started !== undefined) return started
      const startedAt = clock.unsafeCurrentTimeMillis()
      const result = yield* runHandler(
        envelope,
        input,
        known,
        delivery.lease,
        slot,
        restore,
        taskScope,
      )
      // The slot is the handler's: given back before a retry's backoff or the conclusion.
      const adjust = limiter.release(held.ticket!, handlerEnd(result))
      held.ticket = undefined
      if (adjust !== undefined) yield* adjust
      const plan = result._tag === "Success"
        ? succeeded(result.output, known)
        : yield* afterHandler(result, known, restore)
      WorkerMetrics.taskDuration.unsafeUpdate(
        (clock.unsafeCurrentTimeMillis() - startedAt) / 1000,
        [],
      )
      return plan
    }

    /**
     * One delivery's whole life on the current fiber, which must be uninterruptible: only
     * waiting is interruptible (by shutdown, or by the engine stopping the handler), through
     * `restore`; settling never is. Steps delegated to (`yield*`) from the `Effect.gen` of a
     * pool fiber or of `handle`: a combinator per step, or an Effect per delivery, would cost
     * more than the steps.
     */
    function* process(
      delivery: Delivery,
      slot: Slot,
      restore: Restore,
      keep?: (decision: Decision.Decision) => void,
    ): Steps<Decision.Decision> {
      WorkerMetrics.tasksInFlight.unsafeUpdate(++inFlight, [])
      const known: Known = {}
      const held: Held = {}
      let first: ReturnType<typeof prelude> | undefined
      let broken: Cause.Cause<never> | undefined
      try {
        first = prelude(delivery, known)
      } catch (defect) {
        broken = Cause.die(defect)
      }
      const annotations = HashMap.mutate(baseAnnotations, (annotations) => {
        if (known.taskId !== undefined) HashMap.set(annotations, "task_id", known.taskId)
        if (known.attempt !== undefined) HashMap.set(annotations, "attempt", known.attempt)
      })
      // Set, not scoped, on the engine's own fiber (a pool fiber, or `handle`'s): its
      // annotations are this delivery's, and for a task its context the handler's services
      // `R` and the task's scope, until the next delivery. Set together, as each set copies
      // every FiberRef of the fiber. A task that does not reach its handler leaves its scope
      // empty: there is nothing to close.
      let plan: Plan
      if (first?._tag === "Run") {
        const taskScope = yield* Scope.make()
        const context = Context.add(handlerContext, Scope.Scope, taskScope)
        yield* Effect.updateFiberRefs((id, refs) => withTaskRefs(refs, id, annotations, context))
        plan = yield* run(
          delivery,
          first.envelope,
          first.input,
          known,
          slot,
          restore,
          held,
          taskScope,
        )
      } else {
        yield* FiberRef.set(FiberRef.currentLogAnnotations, annotations)
        plan = first ?? (yield* shutdownOrBroken(known, broken!))
      }
      const decision = yield* settle(delivery, plan)
      if (held.ticket !== undefined) {
        const adjust = limiter.release(held.ticket, "other")
        held.ticket = undefined
        if (adjust !== undefined) yield* adjust
      }
      keep?.(decision)
      WorkerMetrics.tasksInFlight.unsafeUpdate(--inFlight, [])
      Decision.unsafeLog(slot.fiber, decision)
      return decision
    }

    /**
     * A pool fiber: takes deliveries until intake stops; replaced if the engine stopped it.
     * Uninterruptible but while it waits for a delivery (and where `process` restores). Forked
     * on the engine's runtime, interruptible, whoever spawns it: a pool fiber growing the pool
     * from its uninterruptible task, or `worker.setConcurrency` from a Promise.
     */
    let failure: Cause.Cause<TransportError> | undefined
    /** Pool fibers waiting for a delivery. */
    let idle = 0
    const forkPool = yield* FiberSet.runtime(fibers)<never>()
    const spawn: Effect.Effect<void> = Effect.suspend(() => {
      const loop = Effect.uninterruptibleMask((restore) =>
        Effect.withFiberRuntime<void, TransportError>((fiber) => {
          const slot: Slot = { fiber, stopped: false }
          let waiting = false
          return Effect.gen(function* () {
            for (;;) {
              waiting = true
              idle++
              const next = yield* restore(transport.take)
              waiting = false
              idle--
              if (Option.isNone(next)) return
              // The pool grows as deliveries come, up to the target: one fiber always waits.
              if (mayGrow()) yield* spawn
              yield* process(next.value, slot, restore)
              // Above a lowered target, a pool fiber retires once its task is settled.
              if (poolSize > Math.max(1, limiter.target())) return
            }
          }).pipe(
            Effect.ensuring(Effect.sync(() => {
              poolSize--
              if (waiting) idle--
            })),
            // Kept: when the last pool fiber fails, `awaitEmpty` may win `run`'s race first.
            Effect.tapErrorCause((cause) =>
              Effect.sync(() => {
                if (!Cause.isInterruptedOnly(cause)) failure ??= cause
              })
            ),
            Effect.onExit(() => (slot.stopped && !closing ? spawn : Effect.void)),
          )
        })
      )
      poolSize++
      // Scheduled, as a fork is, rather than run here and now inside the spawning task.
      return Effect.sync(() => void forkPool(Effect.interruptible(loop), { immediate: false }))
    })
    /**
     * One more pool fiber when none waits for a delivery and the pool is below the target (one
     * at least, so that the pool lives through a pause): fibers are made as deliveries come,
     * not one per slot of a target that may be 2^31 − 1.
     */
    const mayGrow = () => !closing && idle === 0 && poolSize < Math.max(1, limiter.target())
    const grow = Effect.suspend(() => (mayGrow() ? spawn : Effect.void))
    limiter.onChange((target) => Effect.zipRight(transport.setCapacity(target), grow))

    return DeliveryEngine.of({
      handle: (delivery) =>
        Effect.gen(function* () {
          let decision: Decision.Decision | undefined
          const fiber = yield* Effect.fork(
            // A stopped handler leaves its fiber interrupted: the decision is kept as it is made.
            Effect.uninterruptibleMask((restore) =>
              Effect.withFiberRuntime<Decision.Decision>((fiber) =>
                Effect.gen(() =>
                  process(delivery, { fiber, stopped: false }, restore, (d) => (decision = d))
                )
              )
            ).pipe(Effect.locally(FiberRef.currentLogAnnotations, baseAnnotations)),
          )
          const exit = yield* Fiber.await(fiber)
          if (decision !== undefined) return decision
          return yield* Effect.failCause(exit._tag === "Failure" ? exit.cause : Cause.empty).pipe(
            Effect.orDie,
          )
        }),
      run: Effect.gen(function* () {
        yield* grow
        yield* Effect.raceFirst(FiberSet.join(fibers), FiberSet.awaitEmpty(fibers))
        if (failure !== undefined) return yield* Effect.failCause(failure)
      }),
      inFlight: Effect.sync(() => inFlight),
      awaitIdle: Effect.suspend(() =>
        FiberSet.size(fibers).pipe(
          Effect.flatMap((size) => (size === 0 ? Effect.void : FiberSet.awaitEmpty(fibers))),
        )
      ),
      setConcurrency: (n) => Effect.flatMap(Concurrency.validate(n), limiter.setTarget),
      concurrency: Effect.sync(() => limiter.target()),
      interruptAll: Effect.suspend(() => {
        closing = true
        return FiberSet.clear(fibers)
      }),
    })
  })
