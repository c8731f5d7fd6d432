/**
 * Test a worker through the real engine on the embedded MemoryBroker: no broker, no Docker.
 * `WorkerHarness.make` for Effect tests (a scoped resource), `WorkerHarness.start` for plain
 * `async` tests on Deno and Node, and `makeTaskContext` to call a handler directly.
 *
 * @since 0.1.0
 */
import * as Clock from "effect/Clock"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as References from "effect/References"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { DeliveryHandle } from "./internal/delivery/take.ts"
import * as MemoryBroker from "./MemoryBroker.ts"
import { decodeEnvelope, type MessageType, type WireMessage } from "./Protocol.ts"
import * as Settings from "./Settings.ts"
import * as TaskContext from "./TaskContext.ts"
import { Transport } from "./Transport.ts"
import type { Worker } from "./WorkerDefinition.ts"
import type { ServicesError, SettingsError } from "./WorkerError.ts"
import * as WorkerLogger from "./WorkerLogger.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"
import * as WorkerProgram from "./WorkerProgram.ts"

/**
 * One delivery's run, as the platform and the broker saw it. `O` is the worker's output type.
 *
 * @since 0.1.0
 * @category models
 */
export interface TaskRun<O = unknown> {
  /** The task id, when the message had one. */
  readonly taskId: string | undefined
  /** The messages published for the task, decoded. */
  readonly messages: ReadonlyArray<WireMessage>
  /** The same messages, as the bytes on the wire. */
  readonly raw: ReadonlyArray<Uint8Array>
  readonly messageTypes: ReadonlyArray<MessageType>
  /**
   * What became of the inbound message: acked; given back as a failed attempt (`REJECTED_REQUEUE`,
   * a retry: since 0.3.0) or unprocessed (`NACKED_REQUEUE`, a shutdown); or neither (a lost
   * lease).
   */
  readonly outcome: "ACKED" | "REJECTED_REQUEUE" | "NACKED_REQUEUE" | "NONE"
  /**
   * The `success` response, if any, read back with the worker's `output` schema: the handler's
   * result as the platform can decode it (the JSON it receives is in `messages` and `raw`).
   * Undefined too if that schema cannot decode what it encoded.
   */
  readonly response: O | undefined
  /** The `failure` error, if any. */
  readonly error: { readonly code: string; readonly message: string } | undefined
  /** Throws a {@link HarnessAssertionError} unless the task concluded with `success`. */
  readonly assertSucceeded: () => void
  /**
   * Throws a {@link HarnessAssertionError} unless the task concluded with `failure` (with
   * `code`, when given).
   */
  readonly assertFailed: (expected?: { readonly code?: string }) => void
}

/**
 * Options of a harness.
 *
 * @since 0.1.0
 * @category models
 */
export interface HarnessOptions {
  /** Settings given in code. The retry backoff defaults to a millisecond here; the rest to production defaults. */
  readonly settingsOverrides?: Settings.SettingsOverrides
  /**
   * The least severe line the worker logs, as `LOG_LEVEL` spells it in the settings table.
   * Default `"none"`: a test prints nothing, as a run's `messages`, `outcome` and `error` (and
   * the assertions' messages) say what became of its task. `"error"` shows an unexpected
   * error's message and stack, `"info"` the decision line of every delivery. The lines go to
   * the loggers the harness runs with: Effect's default one, or those a test provides
   * (`Logger.layer`). Wins over `settingsOverrides.logLevel` (a `LogLevel`, `"Info"`).
   */
  readonly logLevel?: "debug" | "info" | "warning" | "error" | "critical" | "none" | undefined
  /**
   * `"live"` (default) runs the engine on the real clock, so that retries and timeouts need no
   * `TestClock.adjust`; `"ambient"` uses the caller's clock (a `TestClock` in `it.effect`).
   */
  readonly clock?: "live" | "ambient"
  /**
   * The handler's and the hooks' services in this test, built instead of the definition's own
   * `layer` (which is then never built): fakes of a database or a client. It provides the
   * worker's requirements too, so that a worker made without its `layer` can be tested.
   * Since 0.3.0.
   */
  readonly layer?: Layer.Layer<any, unknown, never> | undefined
}

/**
 * Options of one submission.
 *
 * @since 0.1.0
 * @category models
 */
export interface SubmitOptions {
  readonly taskId?: string
  readonly clientId?: string
  readonly inputRefs?: ReadonlyArray<string>
  /** Earlier deliveries (`x-delivery-count`): 2 makes this the third attempt. */
  readonly deliveryCount?: number
}

/**
 * A harness for Effect tests, for a worker whose input is `I` as encoded (the `data.body` the
 * platform sends) and whose output type is `O`.
 *
 * @since 0.1.0
 * @category models
 */
export interface WorkerHarness<I = unknown, O = unknown> {
  /** Submits a task whose body is `body`; `submitRaw` sends anything else. */
  submit(body: I, options?: SubmitOptions): Effect.Effect<TaskRun<O>>
  submitRaw(
    bytes: Uint8Array | string,
    options?: { readonly deliveryCount?: number },
  ): Effect.Effect<TaskRun<O>>
  /** Makes the next publish (of `type`, when given) fail, as an unconfirmed publish would. */
  readonly failNextPublish: (type?: MessageType) => Effect.Effect<void>
  readonly settings: Settings.WorkerSettings
  readonly broker: MemoryBroker.MemoryBroker["Service"]
}

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/**
 * What a run's `assertSucceeded()` or `assertFailed()` throws when the task did not end so: the
 * messages, outcome and error it did end with, for the test's report.
 *
 * @since 0.3.0
 * @category errors
 */
export class HarnessAssertionError extends Error {
  override readonly name: "HarnessAssertionError" = "HarnessAssertionError"
}

const describeRun = (run: Pick<TaskRun, "messageTypes" | "outcome" | "error">): string =>
  `messages [${run.messageTypes.join(", ")}], outcome ${run.outcome}` +
  (run.error === undefined ? "" : `, error ${run.error.code}: ${run.error.message}`)

const toRun = <O>(
  output: Schema.Codec<O, any>,
  taskId: string | undefined,
  published: ReadonlyArray<{ readonly raw: Uint8Array; readonly message: WireMessage }>,
  outcome: TaskRun["outcome"],
): TaskRun<O> => {
  const raw = published.map((p) => p.raw)
  const messages = published.map((p) => p.message)
  const terminal = messages.findLast((m) =>
    m.data.message_type === "success" || m.data.message_type === "failure"
  )
  const run = {
    taskId,
    messages,
    raw,
    messageTypes: messages.map((m) => m.data.message_type),
    outcome,
    response: terminal?.data.message_type === "success"
      ? Result.getOrUndefined(Schema.decodeUnknownResult(output)(terminal.data.response))
      : undefined,
    error: terminal?.data.message_type === "failure" ? terminal.data.error_message : undefined,
  }
  return {
    ...run,
    assertSucceeded: () => {
      if (terminal?.data.message_type !== "success" || outcome !== "ACKED") {
        throw new HarnessAssertionError(`Expected the task to succeed; got ${describeRun(run)}`)
      }
    },
    assertFailed: (expected) => {
      if (terminal?.data.message_type !== "failure" || outcome !== "ACKED") {
        throw new HarnessAssertionError(`Expected the task to fail; got ${describeRun(run)}`)
      }
      if (expected?.code !== undefined && run.error?.code !== expected.code) {
        throw new HarnessAssertionError(
          `Expected failure code ${expected.code}; got ${describeRun(run)}`,
        )
      }
    },
  }
}

let sequence = 0

/** The task id the bytes carry, as the worker reads it: none for poison. */
const taskIdOf = (bytes: Uint8Array): string | undefined => {
  const decoded = decodeEnvelope(bytes)
  switch (decoded._tag) {
    case "Task":
      return decoded.envelope.taskId
    case "InvalidEnvelope":
      return decoded.taskId
    case "Poison":
      return undefined
  }
}

/**
 * The harness's settings: the overrides and the defaults only, with a millisecond of backoff
 * unless the test sets either bound, and the log level read as `LOG_LEVEL` is.
 */
const readSettings = <A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options: HarnessOptions,
): Effect.Effect<Settings.WorkerSettings, SettingsError> => {
  const given = options.settingsOverrides ?? {}
  const { logLevel: _effectLevel, ...withoutLevel } = given
  return Settings.make(
    { name: worker.name, timeout: worker.timeout, concurrency: worker.concurrency },
    {
      ...(given.retryBackoffBase === undefined && given.retryBackoffMax === undefined
        ? { retryBackoffBase: Duration.millis(1), retryBackoffMax: Duration.millis(1) }
        : {}),
      ...(options.logLevel === undefined ? given : withoutLevel),
    },
  ).pipe(
    // The test's process environment (IN_QUEUE_NAME, WORKER_TASK_TIMEOUT_S, …) is not the
    // worker's: only the overrides and the defaults count. The level's name is read as the
    // variable is, by the settings' own LOG_LEVEL row; an override in Effect's terms wins over
    // it, as over the environment, unless `logLevel` is given.
    Effect.provideService(
      ConfigProvider.ConfigProvider,
      ConfigProvider.fromUnknown({ LOG_LEVEL: options.logLevel ?? "none" }),
    ),
  )
}

/**
 * Makes a harness for `worker` in the current scope. With a `layer`, the test's services stand
 * for the definition's own, all of them: the worker's requirements and what its `layer` provides
 * (`RL`) are the harness's, less what the test's layer provides.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: {
  <A, I, O, R, RL = never>(
    worker: Worker<A, I, O, R, RL>,
    options?: Omit<HarnessOptions, "layer">,
  ): Effect.Effect<WorkerHarness<I, O>, SettingsError | ServicesError, Scope.Scope | R>
  <A, I, O, R, RL, ROut>(
    worker: Worker<A, I, O, R, RL>,
    options: Omit<HarnessOptions, "layer"> & {
      readonly layer: Layer.Layer<ROut, unknown, never>
    },
  ): Effect.Effect<
    WorkerHarness<I, O>,
    SettingsError | ServicesError,
    Scope.Scope | Exclude<R | RL, ROut>
  >
} = <A, I, O>(worker: Worker<A, I, O, unknown>, options: HarnessOptions = {}) =>
  Effect.gen(function* () {
    const settings = yield* readSettings(worker, options)
    // The worker's log settings and the harness's clock, for the engine's lines and the
    // handler's alike: the handler's services (and `ctx.logger`), like the engine's own timers
    // (a time limit, a retry's backoff), are taken from the context the program is built in.
    const asWorker = <X, E, R2>(effect: Effect.Effect<X, E, R2>): Effect.Effect<X, E, R2> => {
      const logged = effect.pipe(
        Effect.provideService(References.MinimumLogLevel, settings.logLevel),
        Effect.provideService(WorkerLogger.CurrentErrorText, settings.logErrorText),
      )
      return options.clock === "ambient"
        ? logged
        : Effect.provideService(logged, Clock.Clock, Clock.Clock.defaultValue())
    }
    // The SDK's series at zero before any task, in the registry the test runs with, as a
    // started worker's `/metrics` shows them.
    yield* WorkerMetrics.register
    const broker = yield* MemoryBroker.make()
    // Capacity 0: the harness takes each message itself, one delivery per submission.
    const transport = yield* broker.transport({
      inQueue: settings.inQueue,
      outQueue: settings.outQueue,
      capacity: 0,
    })
    // The worker program every runner uses; the harness hands it each delivery itself.
    const program = yield* asWorker(Layer.build(
      WorkerProgram.layer(worker).pipe(
        // The definition's services, as every runner builds them (`Worker.make({ layer })`),
        // or the test's instead.
        Layer.provideMerge(
          WorkerProgram.layerServices(
            options.layer === undefined ? worker : { ...worker, layer: options.layer },
          ),
        ),
        Layer.provide(Layer.succeed(Settings.Settings, settings)),
        Layer.provide(Layer.succeed(Transport, transport)),
      ),
    ))
    const engine = Context.get(program, DeliveryHandle)

    const deliver = (bytes: Uint8Array, taskId: string | undefined, deliveryCount: number) =>
      asWorker(Effect.gen(function* () {
        const submitted = yield* broker.publish(settings.inQueue, bytes, { deliveryCount }).pipe(
          Effect.orDie,
        )
        const delivery = Option.getOrThrow(yield* broker.get(settings.inQueue))
        let outcome: TaskRun["outcome"] = "NONE"
        yield* engine.handle({
          ...delivery,
          ack: Effect.map(delivery.ack, () => void (outcome = "ACKED")),
          requeue: Effect.map(delivery.requeue, () => void (outcome = "REJECTED_REQUEUE")),
          release: Effect.map(delivery.release, () => void (outcome = "NACKED_REQUEUE")),
        })
        // The harness keeps the queue empty: a requeued message is not run again by itself.
        yield* broker.purge(settings.inQueue)
        const published = yield* broker.published(settings.outQueue, { after: submitted.id })
        const decoded = published
          .map((m) => ({ raw: m.body, message: JSON.parse(decoder.decode(m.body)) as WireMessage }))
          .filter(({ message }) => taskId === undefined || message.task_id === taskId)
        return toRun(worker.output, taskId, decoded, outcome)
      }))

    const harness: WorkerHarness<I, O> = {
      settings,
      broker,
      failNextPublish: (type) =>
        broker.failNextPublish({ queue: settings.outQueue, ...(type ? { type } : {}) }),
      submit: (body, o = {}) =>
        Effect.suspend(() => {
          const taskId = o.taskId ?? `task-${++sequence}`
          const envelope: Record<string, unknown> = { task_id: taskId }
          if (o.clientId !== undefined) envelope.client_id = o.clientId
          const data: Record<string, unknown> = { message_type: "submission", body }
          if (o.inputRefs !== undefined) data.input_refs = o.inputRefs
          envelope.data = data
          return deliver(encoder.encode(JSON.stringify(envelope)), taskId, o.deliveryCount ?? 0)
        }),
      submitRaw: (bytes, o = {}) =>
        Effect.suspend(() => {
          const raw = typeof bytes === "string" ? encoder.encode(bytes) : bytes
          return deliver(raw, taskIdOf(raw), o.deliveryCount ?? 0)
        }),
    }
    return harness
  }) as Effect.Effect<WorkerHarness<I, O>, SettingsError | ServicesError, any>

/**
 * A harness for `async` tests, for a worker whose input is `I` as encoded (the `data.body` the
 * platform sends) and whose output type is `O`; `close` (or `await using`) releases it.
 *
 * @since 0.1.0
 * @category models
 */
export interface AsyncWorkerHarness<I = unknown, O = unknown> extends AsyncDisposable {
  /** Submits a task whose body is `body`; `submitRaw` sends anything else. */
  submit(body: I, options?: SubmitOptions): Promise<TaskRun<O>>
  submitRaw(
    bytes: Uint8Array | string,
    options?: { readonly deliveryCount?: number },
  ): Promise<TaskRun<O>>
  readonly failNextPublish: (type?: MessageType) => Promise<void>
  readonly published: () => Promise<ReadonlyArray<Uint8Array>>
  readonly close: () => Promise<void>
}

/**
 * Starts a harness for plain `async` tests.
 *
 * @since 0.1.0
 * @category constructors
 */
export const start: {
  <A, I, O, RL = never>(
    worker: Worker<A, I, O, never, RL>,
    options?: Omit<HarnessOptions, "clock" | "layer">,
  ): Promise<AsyncWorkerHarness<I, O>>
  /**
   * With the test's services, for all the handler needs: the worker's requirements `R` and what
   * the definition's own `layer` provides `RL` (that layer is not built).
   */
  <A, I, O, R, RL = never>(
    worker: Worker<A, I, O, R, RL>,
    options: Omit<HarnessOptions, "clock" | "layer"> & {
      readonly layer: Layer.Layer<R | RL, unknown, never>
    },
  ): Promise<AsyncWorkerHarness<I, O>>
} = async <A, I, O>(
  worker: Worker<A, I, O, unknown>,
  options: Omit<HarnessOptions, "clock"> = {},
): Promise<AsyncWorkerHarness<I, O>> => {
  const scope = Scope.makeUnsafe()
  const made = make(worker, options as Omit<HarnessOptions, "layer">) as Effect.Effect<
    WorkerHarness<I, O>,
    SettingsError | ServicesError,
    Scope.Scope
  >
  const harness = await Effect.runPromise(Scope.provide(made, scope))
  const run = <X>(effect: Effect.Effect<X>) => Effect.runPromise(effect)
  const close = () => run(Scope.close(scope, Exit.void))
  return {
    submit: (body, o) => run(harness.submit(body, o)),
    submitRaw: (bytes, o) => run(harness.submitRaw(bytes, o)),
    failNextPublish: (type) => run(harness.failNextPublish(type)),
    published: () =>
      run(
        Effect.map(
          harness.broker.published(harness.settings.outQueue),
          (ms) => ms.map((m) => m.body),
        ),
      ),
    close,
    [Symbol.asyncDispose]: close,
  }
}

/**
 * What a handler reported through `ctx.progress`, unthrottled.
 *
 * @since 0.1.0
 * @category models
 */
export interface ProgressRecorder {
  readonly updates: ReadonlyArray<
    { readonly fraction: number; readonly payload: Readonly<Record<string, unknown>> | undefined }
  >
  readonly fractions: () => ReadonlyArray<number>
}

/**
 * A context to call a handler directly, with a recorder of its progress and the means to fire
 * its signal.
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeTaskContext = (info: Partial<TaskContext.TaskInfo> = {}): {
  readonly ctx: TaskContext.TaskContext
  readonly recorder: ProgressRecorder
  readonly abort: (reason?: string) => void
} => {
  const updates: Array<
    { fraction: number; payload: Readonly<Record<string, unknown>> | undefined }
  > = []
  const { abort, context } = TaskContext.make(
    {
      taskId: info.taskId ?? `task-${++sequence}`,
      attempt: info.attempt ?? 1,
      deliveryLimit: info.deliveryLimit ?? 5,
      deliveries: info.deliveries,
      clientId: info.clientId,
      inputRefs: info.inputRefs ?? [],
      deadline: info.deadline,
      workerId: info.workerId,
    },
    (fraction, payload) =>
      TaskContext.awaitable(
        Effect.sync(() => void updates.push({ fraction, payload })),
        Context.empty(),
      ),
    (info) => TaskContext.makeLogger({ ...info, service: "test" }, Context.empty()),
  )
  return {
    ctx: context,
    recorder: { updates, fractions: () => updates.map((u) => u.fraction) },
    abort: (reason = "aborted by the test") => abort(reason),
  }
}
