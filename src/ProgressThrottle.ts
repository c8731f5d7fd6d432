/**
 * Progress reports the latest state, not an event stream: at most one message per interval per
 * task, a newer update replaces a held one, the held one goes out when the interval ends unless
 * the task concluded first, and a fraction never goes back.
 *
 * @since 0.1.0
 */
import type * as Scope from "effect/Scope"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Random from "effect/Random"
import * as Result from "effect/Result"
import { encodeUtf8, utf8Exceeds } from "./internal/codec/utf8.ts"
import { deliveryIdOf, messageIdOf } from "./internal/delivery/decide.ts"
import { encodeMessageText } from "./Protocol.ts"
import { Settings } from "./Settings.ts"
import { Transport } from "./Transport.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"

/**
 * One task's progress channel.
 *
 * @since 0.1.0
 * @category models
 */
export interface TaskProgress {
  /** Records the newest state; never fails and never waits for a publish. */
  readonly report: (
    fraction: number,
    payload?: Readonly<Record<string, unknown>>,
  ) => Effect.Effect<void>
  /** The task concluded: drop what is held, and wait out a publish under way. */
  readonly close: Effect.Effect<void>
}

interface ProgressThrottleShape {
  /**
   * Opens the progress channel of `taskId`; with `isLost`, nothing more is published once it
   * says the task's lease is lost (the broker has the task back: it is fenced). Its messages
   * are numbered for their ids, `<task_id>:<attempt>:<delivery_id>:progress:<n>`: the `attempt`
   * (default 1) and the `deliveryId` of the delivery whose task reports (since 0.3.0; default,
   * one the channel draws itself, since a channel is one delivery's). With `after`, nothing is
   * published until it succeeds (the task's `started` confirmed): what is reported meanwhile is
   * held as the latest state, and dropped if it fails (since 0.3.0).
   */
  readonly open: (
    taskId: string,
    options?: {
      readonly isLost?: (() => boolean) | undefined
      readonly attempt?: number | undefined
      readonly deliveryId?: string | undefined
      readonly after?: Effect.Effect<void, unknown> | undefined
    },
  ) => Effect.Effect<TaskProgress, never, Scope.Scope>
}

const ProgressThrottleService: Context.ServiceClass<
  ProgressThrottle,
  "@async-task/worker/ProgressThrottle",
  ProgressThrottleShape
> = Context.Service<ProgressThrottle, ProgressThrottleShape>()(
  "@async-task/worker/ProgressThrottle",
)

/**
 * Opens throttled progress channels.
 *
 * @since 0.1.0
 * @category services
 */
export class ProgressThrottle extends ProgressThrottleService {}

const drop = (
  reason: "invalid" | "regressed" | "superseded" | "concluded" | "publish_failed" | "too_large",
) => Metric.update(WorkerMetrics.progressDropped(reason), 1)

/** A progress message larger than the output takes: dropped, the task goes on. */
const tooLarge = (taskId: string) =>
  Effect.logWarning("A progress message larger than the output takes was dropped").pipe(
    Effect.annotateLogs({ task_id: taskId }),
    Effect.andThen(drop("too_large")),
  )

/**
 * A throttle publishing through `publish` at most once per `interval` per task; a progress
 * message larger than `maxBytes` (default: no limit; the worker's is `WORKER_MAX_OUTPUT_BYTES`,
 * since 0.3.0) is dropped with a warning.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  interval: Duration.Input,
  publish: Transport["Service"]["publish"],
  maxBytes: number = Infinity,
): ProgressThrottle["Service"] => {
  const intervalMillis = Duration.toMillis(Duration.fromInputUnsafe(interval))
  return ProgressThrottle.of({
    open: (taskId, options) =>
      Effect.gen(function* () {
        const scope = yield* Effect.scope
        let highest = -1
        let held: Uint8Array | undefined
        let lastSentAt = -Infinity
        let closed = false
        let sending = false
        let sender: Fiber.Fiber<void> | undefined
        const task = {
          taskId,
          attempt: options?.attempt,
          deliveryId: options?.deliveryId ?? deliveryIdOf(yield* Random.next),
        }
        let sent = 0

        const publishHeld = Effect.suspend(() => {
          const body = held
          if (body === undefined) return Effect.void
          held = undefined
          if (options?.isLost?.() === true) return drop("concluded")
          return Effect.flatMap(Clock.currentTimeMillis, (now) => {
            lastSentAt = now
            return publish(body, "progress", {
              messageId: messageIdOf(task, "progress", ++sent),
            }).pipe(
              Effect.tap(() => Metric.update(WorkerMetrics.messagesPublished("progress"), 1)),
              Effect.catch((error) =>
                error.reason === "too_large"
                  ? tooLarge(taskId)
                  : Effect.logWarning("A progress message was not published; the task goes on")
                    .pipe(
                      Effect.annotateLogs({ task_id: taskId, reason: error.reason }),
                      Effect.andThen(drop("publish_failed")),
                    )
              ),
              // close interrupts the wait for the interval, but waits out a publish under way.
              Effect.uninterruptible,
            )
          })
        })

        // Whether progress may be published: once `after` succeeded; never if it failed.
        let after = options?.after
        let mayPublish = true
        const cleared = Effect.suspend(() => {
          if (after === undefined) return Effect.succeed(mayPublish)
          return Effect.map(Effect.exit(after), (exit) => {
            after = undefined
            mayPublish = Exit.isSuccess(exit)
            return mayPublish
          })
        })

        const send = Effect.gen(function* () {
          if (!(yield* cleared)) {
            sending = false
            if (held === undefined) return
            held = undefined
            return yield* drop("publish_failed")
          }
          for (;;) {
            const wait = lastSentAt + intervalMillis - (yield* Clock.currentTimeMillis)
            if (wait > 0) yield* Effect.sleep(Duration.millis(wait))
            if (held === undefined) {
              sending = false
              return
            }
            yield* publishHeld
          }
        })

        const report: TaskProgress["report"] = (fraction, payload) =>
          Effect.suspend(() => {
            if (closed) return drop("concluded")
            if (
              typeof fraction !== "number" || !Number.isFinite(fraction) || fraction < 0 ||
              fraction >= 1
            ) {
              return Effect.logWarning("A progress fraction outside [0, 1) was dropped").pipe(
                Effect.annotateLogs({ task_id: taskId }),
                Effect.andThen(drop("invalid")),
              )
            }
            if (fraction < highest) return drop("regressed")
            let encoded: Result.Result<string, { readonly message: string }>
            try {
              encoded = encodeMessageText({
                type: "progress",
                task_id: taskId,
                progress: fraction,
                payload,
              })
            } catch {
              // A payload whose getters throw, or a revoked Proxy: dropped like any non-JSON.
              encoded = Result.fail({ message: "it cannot be read" })
            }
            if (Result.isFailure(encoded)) {
              return Effect.logWarning(`A progress payload was dropped: ${encoded.failure.message}`)
                .pipe(
                  Effect.annotateLogs({ task_id: taskId }),
                  Effect.andThen(drop("invalid")),
                )
            }
            if (utf8Exceeds(encoded.success, maxBytes)) return tooLarge(taskId)
            // `started` was refused: nothing of this delivery's progress may follow it.
            if (after === undefined && !mayPublish) return drop("publish_failed")
            highest = fraction
            const superseded = held !== undefined
            held = encodeUtf8(encoded.success)
            if (sending) return superseded ? drop("superseded") : Effect.void
            sending = true
            const started = Effect.forkIn(send, scope).pipe(
              Effect.tap((fiber) => Effect.sync(() => (sender = fiber))),
            )
            return started
          })

        // An update already due when the task concludes goes out first (the sender may not have
        // run yet); one still held back by the interval is dropped: the terminal message is the 100%.
        const close = Effect.suspend(() => {
          if (closed) return Effect.void
          closed = true
          const stop = sending && sender !== undefined ? Fiber.interrupt(sender) : Effect.void
          return Effect.andThen(
            stop,
            Effect.flatMap(Effect.zip(cleared, Clock.currentTimeMillis), ([may, now]) => {
              if (held === undefined) return Effect.void
              if (may && lastSentAt + intervalMillis <= now) return publishHeld
              held = undefined
              return drop("concluded")
            }),
          )
        }).pipe(Effect.asVoid)

        yield* Effect.addFinalizer(() => close)
        return { report, close }
      }),
  })
}

/**
 * The throttle on the worker's transport, at `WORKER_PROGRESS_MIN_INTERVAL_S`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<ProgressThrottle, never, Settings | Transport> = Layer.effect(
  ProgressThrottle,
  Effect.gen(function* () {
    const settings = yield* Settings
    const transport = yield* Transport
    return make(settings.progressMinInterval, transport.publish, settings.maxOutputBytes)
  }),
)
