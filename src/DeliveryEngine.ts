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
  Deferred,
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
  type ParseResult,
  Random,
  Schema,
  Scope,
} from "effect"
import type { YieldWrap } from "effect/Utils"
import * as Concurrency from "./Concurrency.ts"
import * as Decision from "./Decision.ts"
import { decodeNonNegative } from "./internal/duration.ts"
import { kindOf } from "./internal/handlerResult.ts"
import { formatIssues } from "./internal/issues.ts"
import { OutputGate } from "./internal/outputGate.ts"
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
import { LEASE_MARGIN, Settings, type WorkerSettings } from "./Settings.ts"
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
  | {
    readonly _tag: "Retry"
    readonly code: string | undefined
    readonly message: string | undefined
    readonly delay: unknown
    readonly congestion: boolean
  }
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
      return result.congestion ? "congestion" : "other"
    case "Timeout":
      return "timeout"
    default:
      return "other"
  }
}

/** The slot a delivery's task holds, once it has one, and what it waits for to give it back. */
interface Held {
  ticket?: number | undefined
  /** How the handler ended, for the adaptive policy. */
  end?: Concurrency.HandlerEnd | undefined
  /** An `async` handler's Promise still pending after the engine stopped it. */
  runaway?: Promise<unknown> | undefined
}

/**
 * What a publish held through the output's refusals came to: confirmed, the lease lost, the
 * lease's time used up (`expired`), the engine closing, or a defect of the transport.
 */
type Publication = "published" | "lost" | "expired" | "closing" | Cause.Cause<unknown>

/** The first wait before a refused publish is tried again, and the longest. */
const PUBLISH_RETRY_BASE_MILLIS = 100
const PUBLISH_RETRY_MAX_MILLIS = 5000

/** Whether a broker's delivery count is one: an integer, not negative. */
const isDeliveryCount = (count: unknown): count is number =>
  typeof count === "number" && Number.isInteger(count) && count >= 0

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

const errorName = (u: unknown): string => {
  if (isTagged(u, (u as { _tag?: string })?._tag ?? "")) return (u as { _tag: string })._tag
  if (u instanceof Error) return u.name
  return typeof u
}

/**
 * What the handler's exit means. Never throws, whatever the handler failed with (a value with
 * a throwing getter, a revoked Proxy): anything unreadable is an unexpected error.
 */
const classify = (exit: Exit.Exit<unknown, unknown>): Result => {
  if (Exit.isSuccess(exit)) return { _tag: "Success", output: exit.value }
  if (Cause.isInterruptedOnly(exit.cause)) return { _tag: "Internal", name: "Interrupted" }
  try {
    const failure = Cause.failureOption(exit.cause)
    const error = failure._tag === "Some" ? failure.value : Cause.squash(exit.cause)
    if (isTagged(error, "FatalError")) {
      const e = error as unknown as { code: unknown; message: unknown }
      return { _tag: "Fatal", code: String(e.code), message: String(e.message ?? "") }
    }
    if (isTagged(error, "RetryableError")) {
      const e = error as unknown as RetryableError
      return {
        _tag: "Retry",
        code: e.code === undefined ? undefined : String(e.code),
        message: typeof e.message === "string" && e.message !== "" ? e.message : undefined,
        delay: e.delay,
        congestion: e.congestion === true,
      }
    }
    return { _tag: "Internal", name: errorName(error) }
  } catch {
    return { _tag: "Internal", name: "unreadable error" }
  }
}

/**
 * The backoff before the requeue of `attempt`: exponential from `base`, capped at `max`, with
 * equal jitter (between half and all of it); or the error's own delay (seconds, or a
 * `DurationInput`), capped at `max`. An own delay that names no duration, or a negative or NaN
 * one, is an ordinary retry: the computed backoff, and a warning.
 *
 * @since 0.1.0
 * @category retry
 */
export const backoff = (
  settings: Pick<WorkerSettings, "retryBackoffBase" | "retryBackoffMax">,
  attempt: number,
  delay: unknown,
): Effect.Effect<Duration.Duration> => {
  const maxMillis = Duration.toMillis(settings.retryBackoffMax)
  if (delay !== undefined) {
    const own = decodeNonNegative(typeof delay === "number" ? delay * 1000 : delay)
    if (Option.isSome(own)) {
      return Effect.succeed(Duration.millis(Math.min(Duration.toMillis(own.value), maxMillis)))
    }
  }
  const full = Math.min(
    Duration.toMillis(settings.retryBackoffBase) * 2 ** (attempt - 1),
    maxMillis,
  )
  const computed = Effect.map(Random.next, (r) => Duration.millis(full / 2 + (r * full) / 2))
  return delay === undefined ? computed : Effect.zipLeft(
    computed,
    Effect.logWarning(
      "The RetryableError's delay is not a non-negative duration: the computed backoff is used",
    ),
  )
}

/** What a handler call gave: its work as an Effect, and an `async` handler's Promise. */
interface Invoked<R> {
  readonly effect: Effect.Effect<unknown, unknown, R>
  readonly promise?: Promise<unknown>
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
): Invoked<R> => {
  let result: unknown
  try {
    result = worker.handler(input, context)
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

/** A defect: `Effect.die` itself reads its value, which a hostile one makes throw. */
const dieWith = (defect: unknown): Effect.Effect<never> => {
  try {
    return Effect.die(defect)
  } catch {
    return Effect.dieMessage("The handler threw a value that cannot be read")
  }
}

/**
 * The fiber a delivery runs on (a pool fiber, or `handle`'s), and its note that the engine
 * itself interrupted it (a time limit, a lost lease).
 */
interface Slot {
  readonly fiber: Fiber.RuntimeFiber<unknown, unknown>
  stopped: boolean
}

/**
 * Whether something other than the engine itself interrupted the delivery's fiber (a shutdown,
 * the caller of `handle`): the engine stops a handler by interrupting the fiber as itself, and a
 * handler that interrupts itself (`Effect.interrupt`) leaves the fiber uninterrupted.
 */
const interruptedFromOutside = (slot: Slot): boolean => {
  const fiber = slot.fiber
  for (const id of Cause.interruptors(fiber.getFiberRef(FiberRef.interruptedCause))) {
    if (!Equal.equals(id, fiber.id())) return true
  }
  return false
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
    const gate = new OutputGate()
    /** Deliveries waiting without being interruptible (a held publish, a runaway handler). */
    const onClosing = new Set<() => void>()
    const holdMillis = Duration.toMillis(settings.consumerTimeout) -
      Duration.toMillis(LEASE_MARGIN) - Duration.toMillis(settings.retryBackoffMax)

    const conclude = (
      message: OutboundMessage,
      decision: Omit<Decision.Decision, "action" | "code">,
    ): Plan => {
      let encoded: Either.Either<string, { readonly message: string }>
      try {
        encoded = encodeMessageText(message)
      } catch {
        // A response whose getters throw, or a revoked Proxy: not JSON data either.
        encoded = Either.left({ message: "it cannot be read" })
      }
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

    const requeueAs = (known: Known, outcome: Decision.Outcome, reason?: string): Plan => ({
      _tag: "Requeue",
      decision: {
        ...known,
        outcome,
        action: "nack-requeue",
        ...(reason === undefined ? {} : { reason }),
      },
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
        const count = delivery.redeliveries.count
        // A count that is not one (negative, fractional) is taken as the first attempt.
        known.attempt = isDeliveryCount(count) ? count + 1 : 1
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

    /** The warnings a delivery's header calls for: a classic queue (once), a bad count. */
    const warnRedeliveries = (delivery: Delivery): Effect.Effect<void> => {
      const redeliveries = delivery.redeliveries
      if (redeliveries._tag === "Counted") {
        return isDeliveryCount(redeliveries.count) ? Effect.void : Effect.logWarning(
          `The delivery count (x-delivery-count) is not a count: ${
            String(redeliveries.count).slice(0, 40)
          }; taken as the first attempt`,
        )
      }
      if (warnedClassic) return Effect.void
      warnedClassic = true
      return Effect.logWarning(
        "The input queue reports only a redelivered flag (a classic queue): a retried task gets one retry. Use a quorum queue for the full delivery limit.",
      )
    }

    /**
     * Waits `delayMillis` without being interruptible (a stopped delivery's fiber stays
     * interrupted), while keeping the lease: ends early when the lease is lost, when the engine
     * closes and, with `untilOpen`, when the output gate opens. Made interruptible through
     * `restore` where the fiber may still be interrupted from outside.
     */
    const holdFor = (
      lease: Lease,
      delayMillis: number,
      untilOpen: boolean,
    ): Effect.Effect<"elapsed" | "lost" | "closing"> =>
      Effect.async<"elapsed" | "lost" | "closing">((resume) => {
        let pending = true
        let stopTimer = () => {}
        let stopLease = () => {}
        let stopGate = () => {}
        const finish = (why: "elapsed" | "lost" | "closing") => {
          if (!pending) return
          pending = false
          stopTimer()
          stopLease()
          stopGate()
          onClosing.delete(onClose)
          resume(Effect.succeed(why))
        }
        const onClose = () => finish("closing")
        if (closing) return finish("closing")
        onClosing.add(onClose)
        stopTimer = timers.after(delayMillis, () => finish("elapsed"))
        stopLease = renewal.unsafeHold(lease, () => finish("lost"))
        if (untilOpen) stopGate = gate.onOpen(() => finish("elapsed"))
        return Effect.sync(() => finish("closing"))
      })

    /** {@link holdFor}, interruptible unless the engine itself stopped the delivery's fiber. */
    const hold = (
      delivery: Delivery,
      slot: Slot,
      restore: Restore,
      delayMillis: number,
      untilOpen: boolean,
    ): Effect.Effect<"elapsed" | "lost" | "closing"> => {
      const wait = holdFor(delivery.lease, delayMillis, untilOpen)
      if (slot.stopped) {
        return Effect.map(
          wait,
          (why) => (why === "elapsed" && interruptedFromOutside(slot) ? "closing" : why),
        )
      }
      return Effect.map(
        Effect.exit(restore(wait)),
        (exit) => (Exit.isSuccess(exit) ? exit.value : "closing"),
      )
    }

    /**
     * Publishes `body`, holding the delivery through refusals: a refused publish closes the
     * output gate and is retried after a capped, jittered backoff (at once when another publish
     * is confirmed), until `deadline`, while the lease holds. While the gate is closed, a first
     * publish waits before it tries: intake pauses rather than each new task knocking.
     */
    function* publishHeld(
      delivery: Delivery,
      body: Uint8Array,
      type: MessageType,
      deadline: number,
      slot: Slot,
      restore: Restore,
      interruptible: boolean,
    ): Steps<Publication> {
      let delayMillis = PUBLISH_RETRY_BASE_MILLIS
      let tries = !gate.refusing
      for (;;) {
        if (tries) {
          if (delivery.lease.isLost()) return "lost"
          const publish = transport.publish(body, type)
          const published = yield* Effect.exit(interruptible ? restore(publish) : publish)
          if (Exit.isSuccess(published)) {
            const opened = gate.accepted()
            if (opened !== undefined) yield* opened
            WorkerMetrics.count(WorkerMetrics.messagesPublished(type))
            return "published"
          }
          const refusal = Cause.failureOption(published.cause)
          if (Option.isNone(refusal) || Cause.isDie(published.cause)) {
            return Cause.isInterruptedOnly(published.cause) ? "closing" : published.cause
          }
          WorkerMetrics.count(WorkerMetrics.publishFailures(type))
          // A publish lost with its connection is retried on the next one; only the broker's
          // own refusals close the gate.
          if (refusal.value.reason !== "closed") yield* gate.refused(refusal.value)
        }
        tries = true
        const jittered = Math.round(delayMillis / 2 + ((yield* Random.next) * delayMillis) / 2)
        const waited = yield* hold(delivery, slot, restore, jittered, true)
        if (waited !== "elapsed") return waited
        if (clock.unsafeCurrentTimeMillis() >= deadline) return "expired"
        delayMillis = Math.min(delayMillis * 2, PUBLISH_RETRY_MAX_MILLIS)
      }
    }

    /** What a `started` that did not go out comes to: the handler does not run. */
    const notStarted = (
      known: Known,
      publication: Exclude<Publication, "published">,
    ): Effect.Effect<Plan> => {
      switch (publication) {
        case "lost":
          return Effect.succeed(fenced(known, "lease_lost"))
        case "expired":
          return Effect.succeed(requeueAs(known, "publish_failed", "started"))
        case "closing":
          return Effect.succeed(requeueAs(known, "shutdown_requeued"))
        default:
          return shutdownOrBroken(known, publication)
      }
    }

    /**
     * Step 4: `started`, confirmed, unless the lease is already gone; `undefined` when the task
     * may run.
     */
    function* publishStarted(
      delivery: Delivery,
      envelope: Envelope,
      known: Known,
      slot: Slot,
      restore: Restore,
      takenAt: number,
    ): Steps<Plan | undefined> {
      if (delivery.lease.isLost()) return fenced(known, "lease_lost")
      const started = encodeMessageText({
        type: "started",
        task_id: envelope.taskId,
        hostname: settings.hostname,
      })
      // The handler must still fit in the lease once `started` is out.
      const deadline = takenAt + holdMillis - timeoutMillis
      const published = yield* publishHeld(
        delivery,
        encodeUtf8(Either.getOrThrow(started)),
        "started",
        deadline,
        slot,
        restore,
        true,
      )
      if (published === "published") return undefined
      return yield* notStarted(known, published)
    }

    /**
     * Step 5: the handler on this fiber, under its time limit, with the lease kept and progress
     * throttled. The task's own scope (the handler's resources and its progress channel) is
     * closed before this returns, so nothing of the task outlives it but an `async` handler that
     * ignores its signal: its Promise is kept in `held`, and the delivery keeps its slot until
     * the Promise settles.
     */
    function* runHandler(
      envelope: Envelope,
      input: A,
      known: Known,
      lease: Lease,
      slot: Slot,
      restore: Restore,
      held: Held,
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
      const startedAt = clock.unsafeCurrentTimeMillis()
      const cancelTimer = timers.after(
        timeoutMillis,
        () => stop({ _tag: "Timeout" }, "The task ran past its time limit"),
      )
      const release = renewal.unsafeHold(
        lease,
        (lost) => stop({ _tag: "Lost", lost }, "The task's lease was lost"),
      )
      let invoked: Invoked<R> | undefined
      let exit: Exit.Exit<unknown, unknown>
      try {
        invoked = invoke(worker, input, context)
        exit = yield* Effect.exit(restore(invoked.effect as Effect.Effect<unknown, unknown>))
      } finally {
        // Whatever happened, this task's timer and lease hold end here: left armed, they would
        // stop the next task of this fiber.
        running = false
        cancelTimer()
        release()
      }
      // A result after the deadline (the handler blocked the event loop past it, so the timer
      // could not fire) is a time out all the same.
      const late = clock.unsafeCurrentTimeMillis() - startedAt > timeoutMillis
      const interrupted = Exit.isFailure(exit) && Cause.isInterrupted(exit.cause) &&
        interruptedFromOutside(slot)
      if (interrupted && stoppedWith === undefined) abort("The worker is shutting down")
      if (stoppedWith !== undefined && invoked.promise !== undefined) held.runaway = invoked.promise
      const closed = yield* Effect.exit(Scope.close(taskScope, exit))
      if (Exit.isFailure(closed)) {
        yield* Effect.logError("Releasing the task's resources failed", closed.cause)
      }
      if (stoppedWith !== undefined) return stoppedWith
      if (interrupted) return { _tag: "Shutdown" }
      return late ? { _tag: "Timeout" } : classify(exit)
    }

    /** Step 6 for a handler that succeeded: its output, encoded, is the task's response. */
    const succeeded = (output: unknown, known: Known): Plan => {
      let encoded: Either.Either<unknown, ParseResult.ParseError | undefined>
      try {
        encoded = encodeOutput(output as O)
      } catch {
        encoded = Either.left(undefined)
      }
      if (Either.isLeft(encoded)) {
        return fail(
          known,
          "INVALID_OUTPUT",
          encoded.left === undefined
            ? "The handler's output could not be encoded with the output schema."
            : `The handler's output does not match the output schema: ${
              formatIssues(encoded.left)
            }`,
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
          if (known.attempt! < known.deliveryLimit!) {
            const delay = yield* backoff(settings, known.attempt!, result.delay)
            const slept = yield* Effect.exit(restore(Effect.sleep(delay)))
            return Exit.isSuccess(slept)
              ? {
                _tag: "Requeue",
                decision: { ...known, outcome: "retry", action: "nack-requeue", code: result.code },
              }
              : requeueAs(known, "shutdown_requeued")
          }
          return yield* checkedCode(
            known,
            result.code ?? "RETRY_EXHAUSTED",
            result.message ?? `The task failed on each of its ${known.deliveryLimit} attempts.`,
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
          return requeueAs(known, "shutdown_requeued")
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

    const requeue = (delivery: Delivery, decision: Decision.Decision) =>
      Effect.matchCauseEffect(delivery.requeue, {
        onFailure: (cause) => settleFailed(decision, "requeue", cause),
        onSuccess: () => Effect.succeed(decision),
      })

    const ack = (delivery: Delivery, decision: Decision.Decision) =>
      Effect.matchCauseEffect(delivery.ack, {
        onFailure: (cause) => settleFailed(decision, "ack", cause),
        onSuccess: () => Effect.succeed(decision),
      })

    /**
     * Where every delivery is settled: after the terminal message is confirmed, or requeued. A
     * requeue that did not come from the handler (a publish the output kept refusing, a broken
     * engine) waits its attempt's backoff first, so that a fault that lasts cannot spin.
     */
    function* settle(
      delivery: Delivery,
      plan: Plan,
      known: Known,
      slot: Slot,
      restore: Restore,
      takenAt: number,
    ): Steps<Decision.Decision> {
      switch (plan._tag) {
        case "Fenced":
          return plan.decision
        case "Ack":
          return yield* ack(delivery, plan.decision)
        case "Requeue": {
          const outcome = plan.decision.outcome
          if (outcome === "publish_failed" || outcome === "engine_error") {
            const delay = yield* backoff(settings, known.attempt ?? 1, undefined)
            yield* hold(delivery, slot, restore, Duration.toMillis(delay), false)
          }
          if (delivery.lease.isLost()) {
            return { ...plan.decision, outcome: "cancelled", reason: "lease_lost" }
          }
          if (outcome === "retry") WorkerMetrics.count(WorkerMetrics.taskRetries)
          if (outcome === "shutdown_requeued") WorkerMetrics.count(WorkerMetrics.shutdownRequeued)
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
          const published = yield* publishHeld(
            delivery,
            encodeUtf8(plan.text),
            plan.type,
            takenAt + holdMillis,
            slot,
            restore,
            false,
          )
          if (published === "lost") {
            return {
              ...plan.decision,
              outcome: "cancelled",
              action: "nack-requeue",
              reason: "lease_lost",
            }
          }
          if (published !== "published") {
            if (typeof published !== "string") {
              yield* Effect.logError(
                "The delivery engine failed; the message is requeued",
                published,
              )
            }
            const outcome: Decision.Outcome = published === "expired"
              ? "publish_failed"
              : published === "closing"
              ? "shutdown_requeued"
              : "engine_error"
            return yield* settle(
              delivery,
              { _tag: "Requeue", decision: { ...plan.decision, outcome, action: "nack-requeue" } },
              known,
              slot,
              restore,
              takenAt,
            )
          }
          if (plan.decision.code !== undefined) {
            WorkerMetrics.count(WorkerMetrics.taskFailures(plan.decision.code))
          }
          return yield* ack(delivery, plan.decision)
        }
      }
    }

    const shutdownOrBroken = (known: Known, cause: Cause.Cause<unknown>): Effect.Effect<Plan> =>
      Cause.isInterruptedOnly(cause)
        ? Effect.succeed(requeueAs(known, "shutdown_requeued"))
        : Effect.logError("The delivery engine failed; the message is requeued", cause).pipe(
          Effect.as(requeueAs(known, "engine_error")),
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
      takenAt: number,
    ): Steps<Plan> {
      // A task waits here, its delivery in hand, while the worker (or its pool) is at its limit.
      held.ticket = limiter.tryAcquire()
      while (held.ticket === undefined) {
        const waited = yield* Effect.exit(restore(limiter.awaitSlot))
        if (Exit.isFailure(waited)) return yield* shutdownOrBroken(known, waited.cause)
        held.ticket = limiter.tryAcquire()
      }
      const started = yield* publishStarted(delivery, envelope, known, slot, restore, takenAt)
      if (started !== undefined) return started
      const startedAt = clock.unsafeCurrentTimeMillis()
      const result = yield* runHandler(
        envelope,
        input,
        known,
        delivery.lease,
        slot,
        restore,
        held,
        taskScope,
      )
      held.end = handlerEnd(result)
      // The slot is the handler's: given back before a retry's backoff or the conclusion, unless
      // the handler still runs.
      if (held.runaway === undefined) yield* releaseSlot(held)
      const plan = result._tag === "Success"
        ? succeeded(result.output, known)
        : yield* afterHandler(result, known, restore)
      WorkerMetrics.taskDuration.unsafeUpdate(
        (clock.unsafeCurrentTimeMillis() - startedAt) / 1000,
        [],
      )
      return plan
    }

    /** Gives the slot back, with how the handler ended, and runs the change of target it calls for. */
    function* releaseSlot(held: Held): Steps<void> {
      if (held.ticket === undefined) return
      const adjust = limiter.release(held.ticket, held.end ?? "other")
      held.ticket = undefined
      if (adjust !== undefined) yield* Effect.exit(adjust)
    }

    /** Waits for a runaway `async` handler to end, unless the engine closes first. */
    const awaitRunaway = (promise: Promise<unknown>): Effect.Effect<void> =>
      Effect.async<void>((resume) => {
        let pending = true
        const finish = () => {
          if (!pending) return
          pending = false
          onClosing.delete(finish)
          resume(Effect.void)
        }
        if (closing) return finish()
        onClosing.add(finish)
        promise.then(finish, finish)
      })

    /**
     * One delivery's whole life on the current fiber, which must be uninterruptible: only
     * waiting is interruptible (by shutdown, or by the engine stopping the handler), through
     * `restore`; settling never is. Steps delegated to (`yield*`) from the `Effect.gen` of a
     * pool fiber or of `handle`: a combinator per step, or an Effect per delivery, would cost
     * more than the steps. A defect of the engine's own code settles the delivery too
     * (`engine_error`, requeued after a backoff): it never ends the pool fiber.
     */
    function* process(
      delivery: Delivery,
      slot: Slot,
      restore: Restore,
      keep?: (decision: Decision.Decision) => void,
    ): Steps<Decision.Decision> {
      WorkerMetrics.tasksInFlight.unsafeUpdate(++inFlight, [])
      const takenAt = clock.unsafeCurrentTimeMillis()
      const known: Known = {}
      const held: Held = {}
      let decision: Decision.Decision
      try {
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
          yield* warnRedeliveries(delivery)
          try {
            plan = yield* run(
              delivery,
              first.envelope,
              first.input,
              known,
              slot,
              restore,
              held,
              taskScope,
              takenAt,
            )
          } catch (defect) {
            plan = yield* shutdownOrBroken(known, Cause.die(defect))
          }
        } else {
          yield* FiberRef.set(FiberRef.currentLogAnnotations, annotations)
          if (known.attempt !== undefined) yield* warnRedeliveries(delivery)
          plan = first ?? (yield* shutdownOrBroken(known, broken!))
        }
        decision = yield* settle(delivery, plan, known, slot, restore, takenAt)
      } catch (defect) {
        // The settlement itself broke: the message goes back to the queue as is.
        yield* Effect.logError(
          "The delivery engine failed; the message is requeued",
          Cause.die(defect),
        )
        decision = yield* requeue(delivery, {
          ...known,
          outcome: "engine_error",
          action: "nack-requeue",
        })
      }
      const runaway = held.runaway
      if (runaway !== undefined) {
        // Settled, and said so; the slot and the in-flight count wait for the handler to end.
        keep?.(decision)
        Decision.unsafeLog(slot.fiber, decision)
        yield* awaitRunaway(runaway)
      }
      yield* releaseSlot(held)
      if (runaway === undefined) keep?.(decision)
      WorkerMetrics.tasksInFlight.unsafeUpdate(--inFlight, [])
      if (runaway === undefined) Decision.unsafeLog(slot.fiber, decision)
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
              // Stopped (its handler interrupted), this fiber cannot wait any more: replaced.
              if (slot.stopped) return
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
          const decided = yield* Deferred.make<Decision.Decision>()
          // A stopped handler leaves its fiber interrupted: the decision is kept as it is made,
          // and returned then. A daemon, so that returning does not wait for the fiber, which may
          // still hold its slot for a runaway handler; interrupting the caller interrupts it.
          const fiber = yield* Effect.forkDaemon(
            Effect.uninterruptibleMask((restore) =>
              Effect.withFiberRuntime<Decision.Decision>((fiber) =>
                Effect.gen(() =>
                  process(
                    delivery,
                    { fiber, stopped: false },
                    restore,
                    (d) => Deferred.unsafeDone(decided, Effect.succeed(d)),
                  )
                )
              )
            ).pipe(Effect.locally(FiberRef.currentLogAnnotations, baseAnnotations)),
          )
          return yield* Effect.raceFirst(
            Deferred.await(decided),
            Effect.flatMap(Fiber.await(fiber), (exit) =>
              Exit.isSuccess(exit)
                ? Effect.succeed(exit.value)
                : Effect.orDie(Effect.failCause(exit.cause))),
          ).pipe(Effect.onInterrupt(() => Fiber.interrupt(fiber)))
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
        const waiting = [...onClosing]
        onClosing.clear()
        for (const wake of waiting) wake()
        return FiberSet.clear(fibers)
      }),
    })
  })
