/**
 * Every error the SDK defines, as tagged data. Handlers fail with (or, when `async`, throw)
 * {@link FatalError} and {@link RetryableError}; the rest come from the SDK itself.
 *
 * @since 0.1.0
 */
import type * as Cause from "effect/Cause"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import type * as Types from "effect/Types"
import { errorText } from "./internal/describe.ts"

/**
 * The constructor of a tagged error with `Fields`: what `Data.TaggedError(tag)` returns, spelled
 * out (JSR's fast check takes a superclass only as a name whose type is written down, never as a
 * call). Kept to this module: each error's declaration reads as Effect's types and its fields.
 */
type TaggedErrorClass<Tag extends string, Fields extends Record<string, any>> = new (
  args: Types.VoidIfEmpty<Readonly<Fields>>,
) => Cause.YieldableError & { readonly _tag: Tag } & Readonly<Fields>

const FatalErrorBase: TaggedErrorClass<"FatalError", {
  readonly code: string
  readonly message: string
}> = Data.TaggedError("FatalError")

/**
 * The task cannot succeed: conclude it now with this code and message.
 *
 * @since 0.1.0
 * @category errors
 */
export class FatalError extends FatalErrorBase {}

const RetryableErrorBase: TaggedErrorClass<"RetryableError", {
  readonly code?: string | undefined
  readonly message?: string | undefined
  readonly delay?: Duration.Input | undefined
  readonly congestion?: boolean | undefined
}> = Data.TaggedError("RetryableError")

/**
 * The task may succeed later: requeue it after a backoff, or conclude it with `code` (default
 * `RETRY_EXHAUSTED`) at its last attempt. `delay` replaces the computed backoff (seconds or a
 * Duration, capped at `WORKER_RETRY_BACKOFF_MAX_S`); `congestion` tells adaptive concurrency
 * that the downstream is saturated.
 *
 * @since 0.1.0
 * @category errors
 */
export class RetryableError extends RetryableErrorBase {}

const WorkerDefinitionErrorBase: TaggedErrorClass<"WorkerDefinitionError", {
  readonly message: string
}> = Data.TaggedError("WorkerDefinitionError")

/**
 * A worker definition the SDK cannot run (no name, a bad timeout, a missing schema or
 * handler).
 *
 * @since 0.1.0
 * @category errors
 */
export class WorkerDefinitionError extends WorkerDefinitionErrorBase {}

const SettingsErrorBase: TaggedErrorClass<"SettingsError", {
  readonly problems: ReadonlyArray<string>
}> = Data.TaggedError("SettingsError")

/**
 * Settings that do not validate; `problems` lists every one, `message` joins them.
 *
 * @since 0.1.0
 * @category errors
 */
export class SettingsError extends SettingsErrorBase {
  override get message(): string {
    return `Invalid worker settings: ${this.problems.join("; ")}`
  }
}

const LeaseLostBase: TaggedErrorClass<"LeaseLost", {
  readonly reason: "expired" | "channel_closed" | "consumer_cancelled" | "stale"
}> = Data.TaggedError("LeaseLost")

/**
 * The delivery's lease is gone (expired, its channel closed, the consumer cancelled): the
 * broker has requeued it, and this worker must neither settle it nor publish for it.
 *
 * @since 0.1.0
 * @category errors
 */
export class LeaseLost extends LeaseLostBase {
  override get message(): string {
    return `The delivery's lease was lost (${this.reason})`
  }
}

const PublishErrorBase: TaggedErrorClass<"PublishError", {
  readonly reason: "nacked" | "returned" | "closed" | "timeout" | "injected" | "too_large"
  readonly messageType: string
}> = Data.TaggedError("PublishError")

/**
 * A publish that the broker did not confirm. `too_large` (since 0.3.0): the message is larger
 * than the broker takes (RabbitMQ's `max_message_size`, learned from its refusal), and would be
 * refused again.
 *
 * @since 0.1.0
 * @category errors
 */
export class PublishError extends PublishErrorBase {
  override get message(): string {
    return `Publishing a ${this.messageType} message failed (${this.reason})`
  }
}

const TransportErrorBase: TaggedErrorClass<"TransportError", {
  readonly reason:
    | "connect"
    | "declare"
    | "consume"
    | "settle"
    | "closed"
    | "access_refused"
    | "not_allowed"
    | "precondition_failed"
    | "not_configured"
    | "invalid_url"
  readonly message: string
}> = Data.TaggedError("TransportError")

/**
 * A transport failure outside one delivery (connect, declare, consume). The configuration
 * errors: `access_refused` (the broker refused the credentials), `not_allowed` (it refused the
 * vhost: unknown, or not the user's), `precondition_failed` (a queue exists with other
 * arguments), `not_configured` (no broker URL), `invalid_url` (a broker URL amqplib cannot use).
 *
 * @since 0.1.0
 * @category errors
 */
export class TransportError extends TransportErrorBase {
  /** A configuration error (see the reasons above): retrying cannot help. */
  get isConfiguration(): boolean {
    return CONFIGURATION.has(this.reason)
  }
}

const CONFIGURATION: ReadonlySet<TransportError["reason"]> = new Set([
  "access_refused",
  "not_allowed",
  "precondition_failed",
  "not_configured",
  "invalid_url",
])

const ProbeErrorBase: TaggedErrorClass<"ProbeError", {
  readonly message: string
}> = Data.TaggedError("ProbeError")

/**
 * A readiness probe of the worker is not ready: `/ready` shows this message for the probe (any
 * other failure shows only its class name, so a probe's error text never leaks by accident).
 *
 * @since 0.1.0
 * @category errors
 */
export class ProbeError extends ProbeErrorBase {}

const ProbeServerErrorBase: TaggedErrorClass<"ProbeServerError", {
  readonly reason: "bind"
  readonly message: string
}> = Data.TaggedError("ProbeServerError")

/**
 * The probe server could not start: it could not listen on `HEALTH_CHECK_HOST:HEALTH_CHECK_PORT`
 * (the port is in use, the address is not this host's, the port needs privileges).
 *
 * @since 0.1.0
 * @category errors
 */
export class ProbeServerError extends ProbeServerErrorBase {}

const IdleHookErrorBase: TaggedErrorClass<"IdleHookError", {
  readonly cause: unknown
}> = Data.TaggedError("IdleHookError")

/**
 * The worker's `onIdle` hook failed: the worker ends with this error.
 *
 * @since 0.1.0
 * @category errors
 */
export class IdleHookError extends IdleHookErrorBase {
  override get message(): string {
    return `The onIdle hook failed: ${errorText(this.cause)}`
  }
}

const ConcurrencyErrorBase: TaggedErrorClass<"ConcurrencyError", {
  readonly value: unknown
}> = Data.TaggedError("ConcurrencyError")

/**
 * An invalid concurrency: negative, not an integer, or above 2^31 − 1.
 *
 * @since 0.1.0
 * @category errors
 */
export class ConcurrencyError extends ConcurrencyErrorBase {
  override get message(): string {
    return `A concurrency must be an integer from 0 to ${2 ** 31 - 1}, got ${String(this.value)}`
  }
}

const BrokerUnreachableBase: TaggedErrorClass<"BrokerUnreachable", {
  readonly after: Duration.Duration
}> = Data.TaggedError("BrokerUnreachable")

/**
 * The broker stayed out of reach for `WORKER_JOB_CONNECT_TIMEOUT_S`.
 *
 * @since 0.1.0
 * @category errors
 */
export class BrokerUnreachable extends BrokerUnreachableBase {
  override get message(): string {
    return `The broker stayed unreachable for ${Duration.format(this.after)}: giving up`
  }
}

const TasksTakenBackBase: TaggedErrorClass<"TasksTakenBack", {
  readonly count: number
}> = Data.TaggedError("TasksTakenBack")

/**
 * A job ended with `count` of its deliveries taken back by the broker before it settled them (its
 * connection or their lease lost): what their handlers came to was thrown away, and the tasks run
 * again elsewhere. The job's process exits 1, so that its pod shows failed.
 *
 * @since 0.3.0
 * @category errors
 */
export class TasksTakenBack extends TasksTakenBackBase {
  override get message(): string {
    const [tasks, them, their, they] = this.count === 1
      ? ["1 task", "it", "its result was", "it runs"]
      : [`${this.count} tasks`, "them", "their results were", "they run"]
    return `The broker took back ${tasks} of this job before it settled ${them} (a connection or ` +
      `lease lost): ${their} thrown away, and ${they} again`
  }
}

const MessageEncodeErrorBase: TaggedErrorClass<"MessageEncodeError", {
  readonly message: string
}> = Data.TaggedError("MessageEncodeError")

/**
 * An outbound message that the spec does not allow (a bad code, a progress out of range, a
 * response that is not a JSON object).
 *
 * @since 0.1.0
 * @category errors
 */
export class MessageEncodeError extends MessageEncodeErrorBase {}

const StartupHookErrorBase: TaggedErrorClass<"StartupHookError", {
  readonly cause: unknown
}> = Data.TaggedError("StartupHookError")

/**
 * A startup hook of the worker failed: the worker does not start (`Worker.run` exits 1).
 *
 * @since 0.1.0
 * @category errors
 */
export class StartupHookError extends StartupHookErrorBase {
  override get message(): string {
    return `A startup hook failed: ${errorText(this.cause)}`
  }
}

const MissingServiceErrorBase: TaggedErrorClass<"MissingServiceError", {
  readonly service: string
}> = Data.TaggedError("MissingServiceError")

/**
 * A handler asked for a service its worker was not given (a plain-JavaScript worker run by the
 * CLI without its `layer`, say): a defect of the deployment, not of the task. The delivery is
 * requeued, no task is concluded because of it, and the worker stops (`Worker.run` and the CLI
 * exit 2).
 *
 * @since 0.2.0
 * @category errors
 */
export class MissingServiceError extends MissingServiceErrorBase {
  override get message(): string {
    return `The handler needs the service "${this.service}", which the worker was not given: ` +
      "give it with the worker's layer (Worker.make({ layer })), or Worker.run's"
  }
}

const ServicesErrorBase: TaggedErrorClass<"ServicesError", {
  readonly cause: unknown
}> = Data.TaggedError("ServicesError")

/**
 * The worker's services (its definition's `layer`) could not be built: the worker does not start
 * (`Worker.run` exits 1).
 *
 * @since 0.2.0
 * @category errors
 */
export class ServicesError extends ServicesErrorBase {
  override get message(): string {
    return `The worker's services could not be built: ${errorText(this.cause)}`
  }
}

const ConformanceErrorBase: TaggedErrorClass<"ConformanceError", {
  readonly message: string
}> = Data.TaggedError("ConformanceError")

/**
 * Why the conformance kit could not run its battery: the broker, or a service that is not there.
 *
 * @since 0.2.0
 * @category errors
 */
export class ConformanceError extends ConformanceErrorBase {}
