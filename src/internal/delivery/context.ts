/**
 * What every step of a delivery works with: the worker, its services, and the engine's shared
 * state. Made once per engine (`DeliveryEngine.make`); the steps are plain functions of it,
 * delegated to (`yield*`) inside one `Effect.gen` per delivery, since a combinator per step, or
 * an Effect per delivery, would cost more than the steps (see `bench/engine.ts`).
 */
import type { LeaseExpiries } from "./expiries.ts"
import type * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import type * as Deferred from "effect/Deferred"
import type * as Effect from "effect/Effect"
import type * as Fiber from "effect/Fiber"
import type * as Random from "effect/Random"
import type * as Result from "effect/Result"
import type * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import type { Limiter } from "../../Concurrency.ts"
import type { EventLoopWatch } from "../../EventLoop.ts"
import type { LeaseRenewal } from "../../LeaseRenewal.ts"
import type { ProgressThrottle } from "../../ProgressThrottle.ts"
import type { WorkerSettings } from "../../Settings.ts"
import type { TaskInfo, TaskLogger } from "../../TaskContext.ts"
import type { MessageType } from "../../Protocol.ts"
import type { Delivery, PublishOptions, Transport } from "../../Transport.ts"
import type { Worker } from "../../WorkerDefinition.ts"
import type { MissingServiceError, PublishError } from "../../WorkerError.ts"
import type { OutputGate } from "./outputGate.ts"
import type { TaskRef } from "./decide.ts"
import type { Timers } from "./timers.ts"
import type { DeliveryTrace, PublishTrace, Tracing } from "./tracing.ts"

/** The steps of a delivery, run by delegation (`yield*`) inside its one `Effect.gen`. */
export type Steps<A> = Generator<Effect.Effect<any, never, never>, A, any>

/** A restore of `Effect.uninterruptibleMask`: what it runs may be interrupted. */
export type Restore = <X, E, R>(effect: Effect.Effect<X, E, R>) => Effect.Effect<X, E, R>

/**
 * The fiber a delivery runs on (an engine fiber, or one of `handle`'s), the context each of its
 * deliveries starts from (`fiberContext.ts`), and whether the engine itself interrupted it to
 * stop the handler (a time limit, a lost lease): such a fiber stays interrupted, so it waits no
 * more interruptibly, and the engine replaces it.
 */
export interface DeliveryFiber {
  readonly fiber: Fiber.Fiber<unknown, unknown>
  readonly base: Context.Context<never>
  stopped: boolean
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

/** `started` sent ahead of its confirm: the message, the wait for its confirm, its span. */
export interface SentStarted {
  readonly out: Outgoing
  readonly confirm: Effect.Effect<void, PublishError>
  readonly traced: PublishTrace | undefined
}

/**
 * One delivery in hand, as every step of it sees it: its one record, made once per delivery
 * (`deliver.ts`), and filled in as the steps learn its task, give it a scope, and take, then give
 * back, a slot.
 */
export interface InHand {
  readonly delivery: Delivery
  readonly df: DeliveryFiber
  readonly restore: Restore
  /** When it was taken: how long it may be held counts from here. */
  readonly takenAt: number
  readonly trace: DeliveryTrace | undefined
  /** The task the message names, once it is opened. */
  task: TaskRef | undefined
  /** The task's own scope, while it runs: its handler's resources and its progress channel. */
  scope: Scope.Closeable | undefined
  /** `started`, sent and not yet confirmed, while the handler runs. */
  started: SentStarted | undefined
  /** The limiter's ticket of the slot it holds, while it holds one. */
  ticket: number | undefined
  /** How the handler ended, and how long it ran (ms), for the adaptive policy. */
  end: "success" | "congestion" | "timeout" | "other" | undefined
  took: number | undefined
  /** An `async` handler's Promise still pending after the engine stopped it. */
  runaway: Promise<unknown> | undefined
  /** When the lease was lost while the handler ran: how long it was held is told by this. */
  lostAt: number | undefined
}

/** The engine closing: deliveries that wait without being interruptible are woken by it. */
export class EngineClosing {
  closed = false
  private readonly waiters = new Set<() => void>()

  /** Calls `wake` when the engine closes (at once if it has); returns how to stop listening. */
  onClose(wake: () => void): () => void {
    if (this.closed) {
      wake()
      return () => {}
    }
    this.waiters.add(wake)
    return () => void this.waiters.delete(wake)
  }

  close(): void {
    this.closed = true
    const waiters = [...this.waiters]
    this.waiters.clear()
    for (const wake of waiters) wake()
  }
}

/** The engine of one worker, as its steps see it. */
export interface EngineContext<A, O, R> {
  readonly worker: Worker<A, any, O, R>
  readonly settings: WorkerSettings
  readonly transport: Transport["Service"]
  readonly throttle: ProgressThrottle["Service"]
  readonly renewal: LeaseRenewal["Service"]
  readonly timers: Timers
  readonly clock: Clock.Clock
  /** What each delivery's own id is drawn from (`deliveryIdOf`). */
  readonly random: Random.Random
  /** The engine's context when it was made: what a task's logger and progress run with. */
  readonly context: Context.Context<never>
  readonly limiter: Limiter
  readonly gate: OutputGate
  readonly closing: EngineClosing
  /**
   * Fails once a handler asked for a service the worker was not given: consuming ends with it
   * (a defect of the deployment, which no task can mend).
   */
  readonly halted: Deferred.Deferred<never, MissingServiceError>
  /** The handler's services, without the engine's Scope (a task gets its own). */
  readonly handlerContext: Context.Context<R>
  readonly decodeInput: (u: unknown) => Result.Result<A, Schema.SchemaError>
  readonly encodeOutput: (u: unknown) => Result.Result<unknown, Schema.SchemaError>
  readonly loggerFor: (info: TaskInfo) => TaskLogger
  /** The app's tracer, when it is not Effect's native one: then each delivery is traced. */
  readonly tracing: Tracing | undefined
  /** The log annotations of every delivery of the worker (`service`). */
  readonly baseAnnotations: Readonly<Record<string, unknown>>
  /** The tasks' `workerId`: `HOSTNAME` and the process id. */
  readonly workerId: string
  readonly timeoutMillis: number
  /** How long a delivery may be held, from when it is taken: the lease less its margins. */
  readonly holdMillis: number
  /** The broker's lease, `WORKER_CONSUMER_TIMEOUT_S`: a loss held this long is its expiry. */
  readonly leaseMillis: number
  /** The tasks whose lease the broker ended at its consumer timeout, counted here. */
  readonly expiries: LeaseExpiries
  /** The event loop's watch: a delivery whose lease was lost after a block says so. */
  readonly loop: EventLoopWatch
  /**
   * Deliveries in hand, counted and held (the event loop's WARNING names their tasks), and
   * whether the classic-queue warning was given.
   */
  readonly state: { inFlight: number; readonly inHand: Set<InHand>; warnedClassic: boolean }
}
