/**
 * The shortcut a delivery sets its annotations, services, scope and span with gives what
 * `Effect.provideService`, `Effect.provideContext` and `Effect.annotateLogs` would: the same log
 * lines, the same services; and it merges, keeping what the fiber runs with (its loggers, log
 * level, clock, metric registry), which the handler's context must not replace.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Context, Effect, Fiber, Metric, Option, References, Scope, Tracer } from "effect"
import type { DeliveryFiber } from "../../../src/internal/delivery/context.ts"
import { deliveryBase, enterDelivery } from "../../../src/internal/delivery/fiberContext.ts"
import { captureLogs, type LogLine } from "../../support/logs.ts"

class Database extends Context.Service<Database, { readonly name: string }>()("test/Database") {}

/**
 * What a handler sees: its log lines (a debug one too), its services, its scope, its span, and
 * the fiber's clock and metric registry. `Database` and the scope are in the fiber's context by
 * the shortcut under test, which the compiler cannot see.
 */
const observe = (lines: ReadonlyArray<LogLine>) =>
  Effect.gen(function* () {
    const start = lines.length
    yield* Effect.logInfo("inside the handler")
    yield* Effect.logDebug("a detail")
    return {
      lines: lines.slice(start),
      database: (yield* Database).name,
      scope: yield* Scope.Scope,
      span: Option.map(yield* Effect.option(Effect.currentParentSpan), (span) => span.spanId),
      clock: yield* Clock.Clock,
      registry: yield* Metric.MetricRegistry,
    }
  }) as unknown as Effect.Effect<{
    readonly lines: ReadonlyArray<LogLine>
    readonly database: string
    readonly scope: Scope.Scope
    readonly span: Option.Option<string>
    readonly clock: Clock.Clock
    readonly registry: unknown
  }>

const annotationsOf = (taskId: string) => ({ service: "svc", task_id: taskId, attempt: 1 })

const handlerContextOf = (name: string) => Context.make(Database, { name })

const spanOf = (spanId: string) =>
  Tracer.externalSpan({ traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId, sampled: true })

interface Delivery {
  readonly taskId: string
  readonly scope: Scope.Scope
  readonly span: Tracer.AnySpan | undefined
}

/**
 * Runs the deliveries given, in order, on a fiber of their own, as a pool fiber does (a delivery
 * fiber made once, with the engine's handler context); what the last one sees.
 */
const viaShortcut = (
  lines: ReadonlyArray<LogLine>,
  handlerContext: Context.Context<Database>,
  deliveries: ReadonlyArray<Delivery>,
) =>
  Effect.withFiber((fiber) => {
    const df: DeliveryFiber = {
      fiber,
      base: deliveryBase(fiber.context, handlerContext),
      stopped: false,
    }
    for (const d of deliveries) enterDelivery(df, annotationsOf(d.taskId), d.scope, d.span)
    return observe(lines)
  }).pipe(Effect.forkChild, Effect.flatMap(Fiber.join))

/** What the Effect way gives: the same values provided around the handler. */
const viaProvide = (
  lines: ReadonlyArray<LogLine>,
  handlerContext: Context.Context<Database>,
  d: Delivery,
) =>
  observe(lines).pipe(
    (effect) => (d.span === undefined ? effect : Effect.withParentSpan(effect, d.span)),
    Effect.provideService(Scope.Scope, d.scope),
    Effect.provideContext(handlerContext),
    Effect.annotateLogs(annotationsOf(d.taskId)),
  )

describe("enterDelivery", () => {
  it.effect("gives what Effect.provideService, provideContext and annotateLogs give, and keeps the fiber's loggers, log level, clock and registry", () => {
    const { layer, lines } = captureLogs()
    return Effect.gen(function* () {
      const scope = Scope.makeUnsafe()
      const delivery = { taskId: "t-1", scope, span: spanOf("00f067aa0ba902b7") }
      const handlerContext = handlerContextOf("db-1")
      const expected = yield* viaProvide(lines, handlerContext, delivery)
      const actual = yield* viaShortcut(lines, handlerContext, [delivery])
      expect(actual).toEqual(expected)
      expect(actual.lines).toEqual([
        {
          level: "Info",
          message: "inside the handler",
          annotations: { service: "svc", task_id: "t-1", attempt: 1 },
        },
        { level: "Debug", message: "a detail", annotations: annotationsOf("t-1") },
      ])
      expect(actual.database).toBe("db-1")
      expect(actual.scope).toBe(scope)
      expect(actual.span).toEqual(Option.some("00f067aa0ba902b7"))
      expect(actual.clock).toBe(yield* Clock.Clock)
      expect(actual.registry).toBe(yield* Metric.MetricRegistry)
    }).pipe(
      Effect.provide(layer),
      Effect.provideService(References.MinimumLogLevel, "Debug"),
      Effect.provideService(Metric.MetricRegistry, new Map()),
    )
  })

  it.effect("the next delivery's values replace the last's on the same fiber", () => {
    const { layer, lines } = captureLogs()
    return Effect.gen(function* () {
      const handlerContext = handlerContextOf("db-1")
      const first = { taskId: "t-1", scope: Scope.makeUnsafe(), span: spanOf("00f067aa0ba902b7") }
      const second = { taskId: "t-2", scope: Scope.makeUnsafe(), span: undefined }
      const actual = yield* viaShortcut(lines, handlerContext, [first, second])
      const expected = yield* viaProvide(lines, handlerContext, second)
      expect(actual).toEqual(expected)
      expect(actual.scope).toBe(second.scope)
      expect(actual.span).toEqual(Option.none())
      expect(actual.lines.map((l) => l.annotations.task_id)).toEqual(["t-2"])
    }).pipe(Effect.provide(layer))
  })

  it.effect("the fiber's own references win over those the handler's context caught when the engine was made", () => {
    const { layer, lines } = captureLogs()
    return Effect.gen(function* () {
      const own = yield* Clock.Clock
      const caught: Clock.Clock = { ...own, currentTimeMillisUnsafe: () => 0 }
      const handlerContext = Context.add(handlerContextOf("db-1"), Clock.Clock, caught)
      const actual = yield* viaShortcut(lines, handlerContext, [
        { taskId: "t-1", scope: Scope.makeUnsafe(), span: undefined },
      ])
      expect(actual.clock).toBe(own)
      expect(actual.database).toBe("db-1")
    }).pipe(Effect.provide(layer))
  })
})
