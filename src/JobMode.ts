/**
 * Job mode (`WORKER_MODE=job`): a worker that takes a bounded number of deliveries, finishes
 * them and exits, as a Kubernetes Job or a KEDA `ScaledJob` expects. Prefetch is 1 (see
 * `Settings`); this module counts deliveries, watches for idleness and for a broker that stays
 * out of reach, and counts the tasks the broker takes back unsettled.
 *
 * @since 0.1.0
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as MutableRef from "effect/MutableRef"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as SubscriptionRef from "effect/SubscriptionRef"
import type { WorkerSettings } from "./Settings.ts"
import type { ConnectionStatus, Delivery } from "./Transport.ts"
import { isLive, Transport } from "./Transport.ts"
import { BrokerUnreachable, TasksTakenBack } from "./WorkerError.ts"

/**
 * The broker stayed out of reach for `WORKER_JOB_CONNECT_TIMEOUT_S`; see
 * {@link WorkerError.BrokerUnreachable}.
 *
 * @since 0.1.0
 * @category errors
 */
export { BrokerUnreachable }

/**
 * The broker took back deliveries of the job before it settled them; see
 * {@link WorkerError.TasksTakenBack}.
 *
 * @since 0.3.0
 * @category errors
 */
export { TasksTakenBack }

/**
 * The transport, stopping its intake (then running `onLimit`) once `maxTasks` deliveries have
 * arrived. Every delivery counts, poison and over-limit ones included: a job's budget is
 * deliveries, not successes. Its prefetch stays at most 1, whatever raises the concurrency
 * (`setConcurrency`, an adaptive increase), so that a job never holds more than it will run.
 *
 * @since 0.1.0
 * @category combinators
 */
export const limitIntake = (
  transport: Transport["Service"],
  maxTasks: number,
  onLimit: Effect.Effect<void> = Effect.void,
): Transport["Service"] => {
  let taken = 0
  return Transport.of({
    ...transport,
    setCapacity: (capacity) => transport.setCapacity(Math.min(capacity, 1)),
    take: Effect.flatMap(transport.take, (delivery): Effect.Effect<Option.Option<Delivery>> => {
      if (Option.isNone(delivery)) return Effect.succeed(delivery)
      taken += 1
      return taken < maxTasks
        ? Effect.succeed(delivery)
        : Effect.as(Effect.andThen(transport.stopIntake, onLimit), delivery)
    }),
  })
}

/**
 * The transport, counting in `takenBack` each delivery whose lease is lost before the worker
 * settles it: the broker took its task back (a connection or channel lost, a lease expired), what
 * its handler came to was thrown away, and it runs again elsewhere. A delivery the worker settled
 * (a task concluded, retried or requeued) is no longer listened to: on RabbitMQ the deliveries of a
 * channel share one loss, which a channel closed after an ack still reports.
 *
 * @since 0.3.0
 * @category combinators
 */
export const countTakenBack = (
  transport: Transport["Service"],
  takenBack: MutableRef.MutableRef<number>,
): Transport["Service"] =>
  Transport.of({
    ...transport,
    take: Effect.map(transport.take, (taken) => {
      if (Option.isNone(taken)) return taken
      const delivery = taken.value
      const stop = delivery.lease.onLost(() => MutableRef.increment(takenBack))
      const settling = <E>(settle: Effect.Effect<void, E>) => Effect.tap(settle, Effect.sync(stop))
      return Option.some({
        ...delivery,
        ack: settling(delivery.ack),
        requeue: settling(delivery.requeue),
        release: settling(delivery.release),
      })
    }),
  })

/**
 * Fails with {@link TasksTakenBack} if `takenBack` ({@link countTakenBack}) counts any: how a job
 * whose consuming has ended says that a task it took was not settled, so that its process exits 1
 * and Kubernetes shows the pod failed, where a job that settled every task (whatever the task came
 * to) exits 0.
 *
 * @since 0.3.0
 * @category combinators
 */
export const failIfTakenBack = (
  takenBack: MutableRef.MutableRef<number>,
): Effect.Effect<void, TasksTakenBack> =>
  Effect.suspend(() => {
    const count = MutableRef.get(takenBack)
    return count === 0 ? Effect.void : Effect.fail(new TasksTakenBack({ count }))
  })

/**
 * Completes once the worker has held no delivery, while connected, for `timeout`; polled a few
 * times per timeout (at most every 250 ms). Idleness counts from the first poll that sees it, so
 * the job is never cut short: it may wait up to one poll longer than `timeout`.
 *
 * @since 0.1.0
 * @category combinators
 */
export const awaitIdle = (
  inFlight: Effect.Effect<number>,
  status: SubscriptionRef.SubscriptionRef<ConnectionStatus>,
  timeout: Duration.Duration,
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const timeoutMillis = Duration.toMillis(timeout)
    // `undefined` while busy. Not the last busy poll: the work may have ended just before the
    // next one, and counting from the busy poll would end the job up to a poll early.
    let idleSince: number | undefined = yield* Clock.currentTimeMillis
    const idleLongEnough = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const busy = (yield* inFlight) > 0 || (yield* SubscriptionRef.get(status)) !== "connected"
      if (busy) idleSince = undefined
      else idleSince ??= now
      return idleSince !== undefined && now - idleSince >= timeoutMillis
    })
    yield* idleLongEnough.pipe(
      Effect.repeat({
        schedule: Schedule.spaced(Duration.millis(Math.min(250, timeoutMillis / 4))),
        until: (idle) => idle,
      }),
    )
  })

/**
 * Fails once the connection has been down (not {@link isLive}) for `timeout` without a break: a
 * resource alarm or a stall, which readiness fails on, is not the broker out of reach.
 *
 * @since 0.1.0
 * @category combinators
 */
export const failWhenUnreachable = (
  status: SubscriptionRef.SubscriptionRef<ConnectionStatus>,
  timeout: Duration.Duration,
): Effect.Effect<never, BrokerUnreachable> =>
  SubscriptionRef.changes(status).pipe(
    // Only a change of liveness restarts the count: a status published again while down (each
    // failed reconnection attempt) or from one down state to another is the same outage.
    Stream.map(isLive),
    Stream.changes,
    Stream.switchMap((live) => live ? Stream.never : Stream.fromEffect(Effect.sleep(timeout))),
    Stream.runHead,
    Effect.andThen(Effect.fail(new BrokerUnreachable({ after: timeout }))),
  )

/**
 * The transport a worker of `settings` consumes: in job mode, {@link limitIntake} with
 * `WORKER_JOB_MAX_TASKS` (running `onLimit` once the last is taken); else `transport` itself.
 *
 * @since 0.2.0
 * @category combinators
 */
export const intake = (
  transport: Transport["Service"],
  settings: Pick<WorkerSettings, "mode" | "jobMaxTasks">,
  onLimit: Effect.Effect<void>,
): Transport["Service"] =>
  settings.mode === "job" ? limitIntake(transport, settings.jobMaxTasks, onLimit) : transport

/**
 * `connected`; in job mode raced against {@link failWhenUnreachable} with
 * `WORKER_JOB_CONNECT_TIMEOUT_S`: a job waits for its broker only so long.
 *
 * @since 0.2.0
 * @category combinators
 */
export const whenConnected = <E>(
  connected: Effect.Effect<void, E>,
  status: SubscriptionRef.SubscriptionRef<ConnectionStatus>,
  settings: Pick<WorkerSettings, "mode" | "jobConnectTimeout">,
): Effect.Effect<void, E | BrokerUnreachable> =>
  settings.mode === "job"
    ? Effect.raceFirst(connected, failWhenUnreachable(status, settings.jobConnectTimeout))
    : connected

/**
 * How a job's consuming ends, besides `consuming` itself (intake stopped, a failure): once idle
 * for `WORKER_JOB_IDLE_TIMEOUT_S` (the job is done), or its broker out of reach for
 * `WORKER_JOB_CONNECT_TIMEOUT_S`. Outside job mode, `consuming` alone.
 *
 * @since 0.2.0
 * @category combinators
 */
export const consumingEnds = <E>(
  consuming: Effect.Effect<void, E>,
  inFlight: Effect.Effect<number>,
  status: SubscriptionRef.SubscriptionRef<ConnectionStatus>,
  settings: Pick<WorkerSettings, "mode" | "jobIdleTimeout" | "jobConnectTimeout">,
): Effect.Effect<void, E | BrokerUnreachable> => {
  if (settings.mode !== "job") return consuming
  const done = awaitIdle(inFlight, status, settings.jobIdleTimeout).pipe(
    Effect.tap(() =>
      Effect.logInfo(`Idle for ${Duration.format(settings.jobIdleTimeout)}: the job is done`)
    ),
  )
  return Effect.raceFirst(
    Effect.raceFirst(consuming, done),
    failWhenUnreachable(status, settings.jobConnectTimeout),
  )
}
