/**
 * A delivery's spans, under the app's `Tracer` (the one in the engine's context when it was made,
 * e.g. `@effect/opentelemetry`'s): one span per delivery, from when it is taken to its
 * settlement, with a child for the handler and one per publish of the engine (`started`, the
 * terminal message). The delivery's parent is the producer's span, from a W3C `traceparent`
 * header of the message, else the app's span when the engine was made; every message the engine
 * publishes for a traced delivery carries a `traceparent` naming its publish span.
 *
 * Effect's default (native) tracer exports nothing: under it the engine makes no span at all, and
 * a delivery costs what it did before tracing (measured by `bench/engine.ts`).
 */
import type * as Cause from "effect/Cause"
import type * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Tracer from "effect/Tracer"
import * as Decision from "../../Decision.ts"
import type { MessageType } from "../../Protocol.ts"
import type { Headers, PublishOptions } from "../../Transport.ts"

/** The name of a delivery's span. */
export const DELIVERY_SPAN = "async-task.delivery"

/** The name of the handler's span, a child of the delivery's. */
export const HANDLER_SPAN = "handler"

/** The name of the span of a publish of `type` (`publish started`, `publish success`, …). */
const publishSpanName = (type: MessageType): string => `publish ${type}`

// Version 00 of W3C Trace Context, and what a later version starts with: version, trace id,
// parent id, flags, lowercase hex.
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})/
const TRACE_ID = /^[0-9a-f]{32}$/
const SPAN_ID = /^[0-9a-f]{16}$/
const ZERO_TRACE_ID = "0".repeat(32)
const ZERO_SPAN_ID = "0".repeat(16)

/**
 * The producer's span named by a W3C `traceparent` header, or `undefined` when the header is
 * absent or invalid (not a string, a malformed or all-zero id, version `ff`, or a version `00`
 * header with more after it). A later version is read as version `00`, as the spec says.
 */
export const parseTraceparent = (header: unknown): Tracer.ExternalSpan | undefined => {
  if (typeof header !== "string" || header.length < 55) return undefined
  const match = TRACEPARENT.exec(header)
  if (match === null) return undefined
  const [, version, traceId, spanId, flags] = match as unknown as [
    string,
    string,
    string,
    string,
    string,
  ]
  if (version === "ff") return undefined
  if (header.length > 55 && (version === "00" || header[55] !== "-")) return undefined
  if (traceId === ZERO_TRACE_ID || spanId === ZERO_SPAN_ID) return undefined
  return Tracer.externalSpan({
    traceId,
    spanId,
    sampled: (Number.parseInt(flags, 16) & 1) === 1,
  })
}

/** The W3C `traceparent` naming `span`, or `undefined` when its ids are not W3C ids. */
export const formatTraceparent = (span: Tracer.AnySpan): string | undefined =>
  TRACE_ID.test(span.traceId) && SPAN_ID.test(span.spanId) &&
    span.traceId !== ZERO_TRACE_ID && span.spanId !== ZERO_SPAN_ID
    ? `00-${span.traceId}-${span.spanId}-${span.sampled ? "01" : "00"}`
    : undefined

/** What the engine traces with: made once per engine. */
export interface Tracing {
  readonly tracer: Tracer.Tracer
  readonly clock: Clock.Clock
  /** The app's span when the engine was made: the parent of a delivery without a traceparent. */
  readonly parent: Option.Option<Tracer.AnySpan>
  readonly inQueue: string
  readonly outQueue: string
}

/**
 * What the engine traces with, or `undefined` when it makes no spans: the tracer is Effect's
 * native one, or tracing is disabled (`Effect.withTracerEnabled(false)`).
 */
export const makeTracing = (options: {
  readonly tracer: Tracer.Tracer
  readonly enabled: boolean
  readonly clock: Clock.Clock
  readonly services: Context.Context<never>
  readonly inQueue: string
  readonly outQueue: string
}): Tracing | undefined =>
  !options.enabled || options.tracer === Tracer.nativeTracer ? undefined : {
    tracer: options.tracer,
    clock: options.clock,
    parent: Context.getOption(options.services, Tracer.ParentSpan),
    inQueue: options.inQueue,
    outQueue: options.outQueue,
  }

/** A publish's span, and the options that put its `traceparent` on the message. */
export interface PublishTrace {
  readonly span: Tracer.Span
  readonly options: PublishOptions | undefined
}

/** The outcomes a delivery span reports as an error. */
const ERROR_OUTCOMES: ReadonlySet<Decision.Outcome> = new Set<Decision.Outcome>([
  "failure",
  "poison",
  "publish_failed",
  "engine_error",
])

/** A span under `parent`, sampled unless its parent is not (as `Effect.withSpan` has it). */
const startSpan = (
  tracing: Tracing,
  name: string,
  parent: Option.Option<Tracer.AnySpan>,
  kind: Tracer.SpanKind,
): Tracer.Span =>
  tracing.tracer.span({
    name,
    parent,
    annotations: Context.empty(),
    links: [],
    startTime: tracing.clock.currentTimeNanosUnsafe(),
    kind,
    // No parent means a new trace, not the span the fiber happens to be in.
    root: Option.isNone(parent),
    sampled: Option.isNone(parent) || parent.value.sampled,
  })

/** One delivery's spans: the delivery's, started when it is made, and its children. */
export class DeliveryTrace {
  readonly span: Tracer.Span
  private readonly tracing: Tracing
  private handler: Tracer.Span | undefined

  constructor(tracing: Tracing, headers: Headers | undefined) {
    this.tracing = tracing
    const remote = parseTraceparent(headers?.traceparent)
    const parent = remote === undefined ? tracing.parent : Option.some<Tracer.AnySpan>(remote)
    this.span = startSpan(tracing, DELIVERY_SPAN, parent, "consumer")
    this.span.attribute("messaging.operation.type", "process")
    this.span.attribute("messaging.destination.name", tracing.inQueue)
  }

  /** Starts the handler's span: the parent of the handler's own spans. */
  startHandler(): Tracer.Span {
    const span = this.child(HANDLER_SPAN, "internal")
    this.handler = span
    return span
  }

  /** Ends the handler's span with how the handler ended. */
  endHandler(exit: Exit.Exit<unknown, unknown>): void {
    const span = this.handler
    if (span === undefined) return
    this.handler = undefined
    span.end(this.tracing.clock.currentTimeNanosUnsafe(), exit)
  }

  /** Starts the span of a publish of `type`, and the `traceparent` that names it. */
  publish(type: MessageType, taskId: string | undefined): PublishTrace {
    const span = this.child(publishSpanName(type), "producer")
    span.attribute("messaging.operation.type", "send")
    span.attribute("messaging.destination.name", this.tracing.outQueue)
    if (taskId !== undefined) span.attribute("task.id", taskId)
    const traceparent = formatTraceparent(span)
    return { span, options: traceparent === undefined ? undefined : { headers: { traceparent } } }
  }

  /** Ends a publish's span with what it came to: published, or why not. */
  endPublish(publish: PublishTrace, result: "published" | string | Cause.Cause<unknown>): void {
    const exit = result === "published"
      ? Exit.void
      : typeof result === "string"
      ? Exit.fail(`The publish ended ${result}`)
      : Exit.failCause(result)
    publish.span.end(this.tracing.clock.currentTimeNanosUnsafe(), exit)
  }

  /** Ends the delivery's span with its decision (and the handler's, if a defect left it open). */
  settled(decision: Decision.Decision): void {
    this.endHandler(Exit.die("The delivery engine failed while the handler's span was open"))
    const span = this.span
    if (decision.taskId !== undefined) span.attribute("task.id", decision.taskId)
    if (decision.attempt !== undefined) {
      span.attribute("task.attempt", decision.attempt)
      span.attribute("task.delivery_limit", decision.deliveryLimit)
    }
    if (decision.deliveries !== undefined) span.attribute("task.deliveries", decision.deliveries)
    span.attribute("task.outcome", decision.outcome)
    span.attribute("task.action", decision.action)
    if (decision.code !== undefined) span.attribute("task.code", decision.code)
    if (decision.reason !== undefined) span.attribute("task.reason", decision.reason)
    span.end(
      this.tracing.clock.currentTimeNanosUnsafe(),
      ERROR_OUTCOMES.has(decision.outcome) ? Exit.fail(Decision.format(decision)) : Exit.void,
    )
  }

  private child(name: string, kind: Tracer.SpanKind): Tracer.Span {
    return startSpan(this.tracing, name, Option.some(this.span), kind)
  }
}
