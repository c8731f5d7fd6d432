import { describe, expect, it } from "@effect/vitest"
import * as NodeSdk from "@effect/opentelemetry/NodeSdk"
import { SpanKind, SpanStatusCode } from "@opentelemetry/api"
import {
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base"
import { Context, Effect, Logger, Option, References, Tracer } from "effect"
import {
  DELIVERY_SPAN,
  formatTraceparent,
  HANDLER_SPAN,
  parseTraceparent,
} from "../src/internal/delivery/tracing.ts"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as Settings from "../src/Settings.ts"
import * as WorkerHarness from "../src/testing.ts"
import * as Worker from "../src/Worker.ts"
import { FatalError } from "../src/WorkerError.ts"
import { memoryEnvironment } from "./support/environment.ts"
import { waitUntil } from "./support/logs.ts"
import { envelope, textOf, utf8 } from "./support/builders.ts"
import { countWords, Text, Words } from "./support/countWords.ts"

/** A `count-words` worker whose handler counts inside a span of its own, `count`. */
const counting = Worker.make({
  name: "count-words",
  input: Text,
  output: Words,
  timeout: "10 seconds",
  handler: ({ text }) =>
    text === "fail"
      ? Effect.fail(new FatalError({ code: "EMPTY_TEXT", message: "There is nothing to count." }))
      : Effect.succeed({ words: countWords(text) }).pipe(Effect.withSpan("count")),
})

/** The app's OpenTelemetry SDK, its spans kept in memory. */
const otel = () => {
  const exporter = new InMemorySpanExporter()
  const layer = NodeSdk.layer(() => ({
    resource: { serviceName: "tracing-test" },
    spanProcessor: new SimpleSpanProcessor(exporter),
  }))
  const spans = () => exporter.getFinishedSpans()
  const named = (name: string) => spans().filter((s) => s.name === name)
  const one = (name: string): ReadableSpan => {
    const found = named(name)
    expect(found.map((s) => s.name)).toEqual([name])
    return found[0]!
  }
  return { exporter, layer, spans, named, one }
}

const idsOf = (span: ReadableSpan) => span.spanContext()
const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId

const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
const PARENT_ID = "00f067aa0ba902b7"

/** Runs `worker` on the MemoryBroker (the pool, as in production) until `count` messages are out. */
const runOnBroker = (
  messages: ReadonlyArray<{ readonly body: string; readonly headers?: Record<string, unknown> }>,
  count: number,
) =>
  Effect.gen(function* () {
    const broker = yield* MemoryBroker.MemoryBroker
    const settings = yield* Settings.Settings
    yield* Worker.consume(counting)
    for (const m of messages) {
      yield* broker.publish(settings.inQueue, m.body, m.headers ? { headers: m.headers } : {})
    }
    yield* waitUntil(
      () => Effect.map(broker.published(settings.outQueue), (out) => out.length >= count),
      `${count} messages are published`,
    )
    return yield* broker.published(settings.outQueue)
  })

describe("Tracing", () => {
  it.live("a delivery is one consumer span with the task's attributes; the handler and each publish are its children, the handler's own spans the handler's", () => {
    const { layer, one, spans } = otel()
    return Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(counting)
      const run = yield* harness.submit({ text: "a b c" }, { taskId: "t-1" })
      run.assertSucceeded()

      const delivery = one(DELIVERY_SPAN)
      expect(delivery.kind).toBe(SpanKind.CONSUMER)
      expect(delivery.parentSpanContext).toBeUndefined()
      expect(delivery.attributes).toMatchObject({
        "task.id": "t-1",
        "task.attempt": 1,
        "task.delivery_limit": 5,
        "task.outcome": "success",
        "task.action": "conclude",
        "messaging.operation.type": "process",
        "messaging.destination.name": harness.settings.inQueue,
      })
      expect(delivery.attributes["task.code"]).toBeUndefined()
      // Unset, not OK: OpenTelemetry leaves OK to the application (@effect/opentelemetry 4.1.5 on).
      expect(delivery.status.code).toBe(SpanStatusCode.UNSET)

      const traceId = idsOf(delivery).traceId
      const handler = one(HANDLER_SPAN)
      const started = one("publish started")
      const success = one("publish success")
      const count = one("count")
      for (const child of [handler, started, success]) {
        expect(idsOf(child).traceId).toBe(traceId)
        expect(parentOf(child)).toBe(idsOf(delivery).spanId)
      }
      expect(parentOf(count)).toBe(idsOf(handler).spanId)
      expect(started.kind).toBe(SpanKind.PRODUCER)
      expect(started.attributes).toMatchObject({
        "task.id": "t-1",
        "messaging.destination.name": harness.settings.outQueue,
      })
      // In order: started published, then the handler, then the conclusion, within the delivery.
      const start = (s: ReadableSpan) => s.startTime[0] * 1e9 + s.startTime[1]
      expect(start(started)).toBeLessThanOrEqual(start(handler))
      expect(start(handler)).toBeLessThanOrEqual(start(success))
      expect(spans()).toHaveLength(5)

      // Each published message names its publish span, in the delivery's trace.
      const out = yield* harness.broker.published(harness.settings.outQueue)
      expect(out.map((m) => m.headers?.traceparent)).toEqual([
        `00-${traceId}-${idsOf(started).spanId}-01`,
        `00-${traceId}-${idsOf(success).spanId}-01`,
      ])
    }).pipe(Effect.scoped, Effect.provide(layer))
  })

  it.live("the producer's traceparent is the delivery's parent, and its trace goes on in the messages the worker publishes", () => {
    const { layer, one } = otel()
    return Effect.gen(function* () {
      const out = yield* runOnBroker([{
        body: envelope("t-remote", { text: "one two" }),
        headers: { traceparent: `00-${TRACE_ID}-${PARENT_ID}-01`, other: 1 },
      }], 2)
      const delivery = one(DELIVERY_SPAN)
      expect(idsOf(delivery).traceId).toBe(TRACE_ID)
      expect(parentOf(delivery)).toBe(PARENT_ID)
      expect(delivery.parentSpanContext?.isRemote).toBe(true)
      expect(delivery.attributes["task.id"]).toBe("t-remote")
      expect(parentOf(one(HANDLER_SPAN))).toBe(idsOf(delivery).spanId)
      expect(out.map((m) => JSON.parse(textOf(m.body)).data.message_type))
        .toEqual(["started", "success"])
      expect(out.map((m) => m.headers?.traceparent)).toEqual([
        `00-${TRACE_ID}-${idsOf(one("publish started")).spanId}-01`,
        `00-${TRACE_ID}-${idsOf(one("publish success")).spanId}-01`,
      ])
    }).pipe(
      Effect.scoped,
      Effect.provide(memoryEnvironment(counting)),
      Effect.provide(layer),
    )
  })

  it.live("an invalid traceparent is ignored: the delivery's parent is then the app's span when the worker started", () => {
    const { layer, named } = otel()
    return Effect.gen(function* () {
      const app = yield* Effect.currentSpan.pipe(Effect.orDie)
      yield* runOnBroker([
        {
          body: envelope("t-upper", { text: "a" }),
          headers: { traceparent: `00-${TRACE_ID.toUpperCase()}-${PARENT_ID}-01` },
        },
        { body: envelope("t-none", { text: "b" }) },
      ], 4)
      const deliveries = named(DELIVERY_SPAN)
      expect(deliveries).toHaveLength(2)
      for (const delivery of deliveries) {
        expect(idsOf(delivery).traceId).toBe(app.traceId)
        expect(parentOf(delivery)).toBe(app.spanId)
      }
    }).pipe(
      Effect.withSpan("app"),
      Effect.scoped,
      Effect.provide(memoryEnvironment(counting)),
      Effect.provide(layer),
    )
  })

  it.live("each delivery without a parent starts a trace of its own", () => {
    const { layer, named } = otel()
    return Effect.gen(function* () {
      yield* runOnBroker([{ body: envelope("t-a", { text: "a" }) }, {
        body: envelope("t-b", { text: "b" }),
      }], 4)
      const deliveries = named(DELIVERY_SPAN)
      expect(deliveries).toHaveLength(2)
      for (const delivery of deliveries) expect(delivery.parentSpanContext).toBeUndefined()
      expect(idsOf(deliveries[0]!).traceId).not.toBe(idsOf(deliveries[1]!).traceId)
      // A handler's spans stay in their own delivery's trace.
      expect(named("count")).toHaveLength(2)
      for (const count of named("count")) {
        const handler = named(HANDLER_SPAN).find((h) => idsOf(h).spanId === parentOf(count))
        expect(handler).toBeDefined()
        expect(idsOf(count).traceId).toBe(idsOf(handler!).traceId)
      }
    }).pipe(
      Effect.scoped,
      Effect.provide(memoryEnvironment(counting)),
      Effect.provide(layer),
    )
  })

  it.live("the lines a traced delivery logs are in its trace, a delivery that does not run too", () => {
    const { layer } = otel()
    const lines: Array<{ readonly task: unknown; readonly traceId: string | undefined }> = []
    const logger = Logger.make(({ fiber }) => {
      const span = Context.getOption(fiber.context, Tracer.ParentSpan)
      lines.push({
        task: fiber.getRef(References.CurrentLogAnnotations).task_id,
        traceId: Option.isSome(span) ? span.value.traceId : undefined,
      })
    })
    const other = "0af7651916cd43dd8448eb211c80319c"
    return Effect.gen(function* () {
      yield* runOnBroker([
        {
          body: envelope("t-runs", { text: "a" }),
          headers: { traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` },
        },
        {
          body: JSON.stringify({ task_id: "t-invalid", data: {} }),
          headers: { traceparent: `00-${other}-${PARENT_ID}-01` },
        },
      ], 3)
      const traceOf = (
        task: string,
      ) => [...new Set(lines.filter((l) => l.task === task).map((l) => l.traceId))]
      expect(traceOf("t-runs")).toEqual([TRACE_ID])
      expect(traceOf("t-invalid")).toEqual([other])
    }).pipe(
      Effect.scoped,
      Effect.provide(memoryEnvironment(counting)),
      Effect.provide(Logger.layer([logger])),
      Effect.provide(layer),
    )
  })

  it.live("a task that fails: the delivery's span is an error with its outcome and code, the handler's has the handler's error", () => {
    const { layer, one } = otel()
    return Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(counting)
      const run = yield* harness.submit({ text: "fail" }, { taskId: "t-fail", deliveryCount: 2 })
      run.assertFailed({ code: "EMPTY_TEXT" })
      const delivery = one(DELIVERY_SPAN)
      expect(delivery.attributes).toMatchObject({
        "task.id": "t-fail",
        "task.attempt": 3,
        "task.outcome": "failure",
        "task.action": "conclude",
        "task.code": "EMPTY_TEXT",
      })
      expect(delivery.status.code).toBe(SpanStatusCode.ERROR)
      const handler = one(HANDLER_SPAN)
      expect(handler.status).toMatchObject({
        code: SpanStatusCode.ERROR,
        message: "There is nothing to count.",
      })
      expect(parentOf(one("publish failure"))).toBe(idsOf(delivery).spanId)
    }).pipe(Effect.scoped, Effect.provide(layer))
  })

  it.live("poison is a delivery span alone: no handler, nothing published", () => {
    const { layer, one, spans } = otel()
    return Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(counting)
      yield* harness.submitRaw("not json")
      const delivery = one(DELIVERY_SPAN)
      expect(delivery.attributes).toMatchObject({
        "task.outcome": "poison",
        "task.action": "ack",
        "task.reason": "not_json",
      })
      expect(delivery.status.code).toBe(SpanStatusCode.ERROR)
      expect(spans()).toHaveLength(1)
    }).pipe(Effect.scoped, Effect.provide(layer))
  })

  it.live("under Effect's native tracer the engine makes no span and publishes no traceparent", () =>
    Effect.gen(function* () {
      let parent: Option.Option<unknown> = Option.none()
      const harness = yield* WorkerHarness.make(Worker.make({
        ...counting,
        handler: () =>
          Effect.map(Effect.option(Effect.currentParentSpan), (span) => {
            parent = span
            return { words: 0 }
          }),
      }))
      const run = yield* harness.submit({ text: "a" })
      run.assertSucceeded()
      expect(Option.isNone(parent)).toBe(true)
      const out = yield* harness.broker.published(harness.settings.outQueue)
      expect(out.map((m) => m.headers)).toEqual([undefined, undefined])
    }).pipe(Effect.scoped))

  it.live("with tracing disabled the engine makes no span", () => {
    const { layer, spans } = otel()
    return Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(counting)
      ;(yield* harness.submit({ text: "a" })).assertSucceeded()
      const out = yield* harness.broker.published(harness.settings.outQueue)
      expect(out.map((m) => m.headers)).toEqual([undefined, undefined])
      expect(spans().filter((s) => s.name !== "count")).toEqual([])
    }).pipe(Effect.withTracerEnabled(false), Effect.scoped, Effect.provide(layer))
  })
})

describe("traceparent", () => {
  it("reads version 00 and later versions; refuses what the W3C spec calls invalid", () => {
    expect(parseTraceparent(`00-${TRACE_ID}-${PARENT_ID}-01`)).toMatchObject({
      _tag: "ExternalSpan",
      traceId: TRACE_ID,
      spanId: PARENT_ID,
      sampled: true,
    })
    expect(parseTraceparent(`00-${TRACE_ID}-${PARENT_ID}-00`)?.sampled).toBe(false)
    expect(parseTraceparent(`cc-${TRACE_ID}-${PARENT_ID}-01-what-comes-later`)?.traceId)
      .toBe(TRACE_ID)
    for (
      const invalid of [
        undefined,
        42,
        utf8(`00-${TRACE_ID}-${PARENT_ID}-01`),
        "",
        `00-${TRACE_ID.toUpperCase()}-${PARENT_ID}-01`,
        `00-${"0".repeat(32)}-${PARENT_ID}-01`,
        `00-${TRACE_ID}-${"0".repeat(16)}-01`,
        `ff-${TRACE_ID}-${PARENT_ID}-01`,
        `00-${TRACE_ID}-${PARENT_ID}-01-extra`,
        `cc-${TRACE_ID}-${PARENT_ID}-01extra`,
        `00-${TRACE_ID.slice(1)}-${PARENT_ID}-01`,
        ` 00-${TRACE_ID}-${PARENT_ID}-01`,
      ]
    ) {
      expect(parseTraceparent(invalid)).toBeUndefined()
    }
  })

  it("names a span by its W3C ids, and nothing for ids that are not", () => {
    const span = parseTraceparent(`00-${TRACE_ID}-${PARENT_ID}-01`)!
    expect(formatTraceparent(span)).toBe(`00-${TRACE_ID}-${PARENT_ID}-01`)
    expect(formatTraceparent({ ...span, sampled: false })).toBe(`00-${TRACE_ID}-${PARENT_ID}-00`)
    expect(formatTraceparent({ ...span, traceId: "native" })).toBeUndefined()
  })
})
