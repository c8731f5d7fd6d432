/**
 * The runtime's and the process' metrics, sampled into the `WorkerMetrics` declared for them:
 * `worker_sdk_info`, CPU, resident memory, V8 heap, the resources keeping the event loop alive,
 * and garbage collection pauses where the runtime reports them (`event_loop_lag_seconds` is
 * `EventLoop`'s since 0.3.0). Runs on Node and Deno alike through `node:process` and
 * `node:perf_hooks`; Deno does not deliver `gc` performance entries, so there is no GC
 * histogram there.
 *
 * @since 0.1.0
 */
import process from "node:process"
import { constants, PerformanceObserver } from "node:perf_hooks"
import type * as Context from "effect/Context"
import type * as Scope from "effect/Scope"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Schedule from "effect/Schedule"
import * as EventLoop from "./EventLoop.ts"
import { VERSION } from "./internal/version.ts"
import * as Prometheus from "./Prometheus.ts"
import * as WorkerMetrics from "./WorkerMetrics.ts"

const deno = (globalThis as { readonly Deno?: { readonly version?: { readonly deno?: string } } })
  .Deno

/**
 * The runtime and its version, as `worker_sdk_info` labels it: `node 22.3.0`, `deno 2.1.4`
 * (Deno is told apart by `globalThis.Deno`, since it reports a Node version too).
 *
 * @since 0.1.0
 * @category constants
 */
export const runtime: string = deno?.version?.deno !== undefined
  ? `deno ${deno.version.deno}`
  : process.versions?.bun !== undefined
  ? `bun ${process.versions.bun}`
  : process.versions?.node !== undefined
  ? `node ${process.versions.node}`
  : "unknown"

/**
 * Whether this runtime reports garbage collections (`gc` performance entries): Node does;
 * Deno accepts the observer but never calls it.
 *
 * @since 0.1.0
 * @category constants
 */
export const reportsGc: boolean = deno === undefined &&
  (
    (PerformanceObserver as { readonly supportedEntryTypes?: ReadonlyArray<string> })
      .supportedEntryTypes ?? []
  ).includes("gc")

/**
 * The types of resources seen alive at some sample, so that a type gone since reads 0.
 */
const resourceTypes = new Set<string>()

/** Brings a counter up to a cumulative total the runtime keeps, whoever sampled it last. */
const catchUp = (
  counter: Metric.Counter<number>,
  total: number,
  context: Context.Context<never>,
): void => {
  const delta = total - counter.valueUnsafe(context).count
  if (delta > 0) counter.updateUnsafe(delta, context)
}

const sdkInfo = Metric.withAttributes(WorkerMetrics.sdkInfo, { version: VERSION, runtime })

const resourcesByType = new Map<string, Metric.Gauge<number>>()

const activeResources = (type: string): Metric.Gauge<number> => {
  let gauge = resourcesByType.get(type)
  if (gauge === undefined) {
    gauge = Metric.withAttributes(WorkerMetrics.activeResources, { type })
    resourcesByType.set(type, gauge)
  }
  return gauge
}

/** The resources keeping the event loop alive, by type, where the runtime tells. */
const sampleResources = (context: Context.Context<never>): void => {
  if (typeof process.getActiveResourcesInfo !== "function") return
  const counts = new Map<string, number>()
  for (const type of process.getActiveResourcesInfo()) {
    counts.set(type, (counts.get(type) ?? 0) + 1)
    resourceTypes.add(type)
  }
  let total = 0
  for (const type of resourceTypes) {
    const n = counts.get(type) ?? 0
    total += n
    activeResources(type).updateUnsafe(n, context)
  }
  WorkerMetrics.activeResourcesTotal.updateUnsafe(total, context)
}

/**
 * Reads the process' figures now: `worker_sdk_info`, CPU, memory, heap and active resources,
 * into the registry of the context it runs in. The periodic sampler runs it; {@link scrape} runs
 * it right before an exposition, so that `/metrics` is current.
 *
 * @since 0.1.0
 * @category metrics
 */
export const sample: Effect.Effect<void> = Effect.withFiber((fiber) => {
  const context = fiber.context
  sdkInfo.updateUnsafe(1, context)
  const cpu = process.cpuUsage()
  catchUp(WorkerMetrics.processCpuUserSeconds, cpu.user / 1e6, context)
  catchUp(WorkerMetrics.processCpuSystemSeconds, cpu.system / 1e6, context)
  catchUp(WorkerMetrics.processCpuSeconds, (cpu.user + cpu.system) / 1e6, context)
  const memory = process.memoryUsage()
  WorkerMetrics.processResidentMemory.updateUnsafe(memory.rss, context)
  WorkerMetrics.heapUsed.updateUnsafe(memory.heapUsed, context)
  WorkerMetrics.heapTotal.updateUnsafe(memory.heapTotal, context)
  WorkerMetrics.externalMemory.updateUnsafe(memory.external, context)
  WorkerMetrics.processStartTime.updateUnsafe(
    Math.round(Date.now() / 1000 - process.uptime()),
    context,
  )
  sampleResources(context)
  return Effect.void
})

const gcKinds: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: "minor",
  [constants.NODE_PERFORMANCE_GC_MAJOR]: "major",
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: "incremental",
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: "weakcb",
}

const gcByKind = new Map<string, Metric.Histogram<number>>()

const gcHistogram = (name: string): Metric.Histogram<number> => {
  let histogram = gcByKind.get(name)
  if (histogram === undefined) {
    histogram = Metric.withAttributes(WorkerMetrics.gcDuration, { kind: name })
    gcByKind.set(name, histogram)
  }
  return histogram
}

/**
 * One `gc` observer for the process however many scopes want it, disconnected when the last of
 * them closes. A pause is recorded once into each registry those scopes run with (through the
 * context of the first scope of each), never twice into one.
 */
const gcSinks = new Map<
  Metric.MetricRegistry,
  { context: Context.Context<never>; scopes: number }
>()
let gcObserver: PerformanceObserver | undefined

const recordGc = (kind: number | undefined, durationMs: number): void => {
  const histogram = gcHistogram((kind !== undefined ? gcKinds[kind] : undefined) ?? "unknown")
  for (const sink of gcSinks.values()) histogram.updateUnsafe(durationMs / 1000, sink.context)
}

const startGcObserver = (): PerformanceObserver => {
  const observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      // `detail.kind` since Node 16, `kind` before.
      const gc = entry as unknown as {
        readonly detail?: { readonly kind?: number } | null
        readonly kind?: number
      }
      recordGc(gc.detail?.kind ?? gc.kind, entry.duration)
    }
  })
  observer.observe({ entryTypes: ["gc"] })
  return observer
}

const observeGc: Effect.Effect<void, never, Scope.Scope> = reportsGc
  ? Effect.acquireRelease(
    Effect.withFiber((fiber) => {
      const registry = fiber.getRef(Metric.MetricRegistry)
      // Every kind at zero from the start, as a scraper expects the series.
      for (const kind of Object.values(gcKinds)) gcHistogram(kind).valueUnsafe(fiber.context)
      const sink = gcSinks.get(registry)
      if (sink === undefined) gcSinks.set(registry, { context: fiber.context, scopes: 1 })
      else sink.scopes++
      gcObserver ??= startGcObserver()
      return Effect.succeed(registry)
    }),
    (registry) =>
      Effect.sync(() => {
        const sink = gcSinks.get(registry)!
        if (--sink.scopes === 0) gcSinks.delete(registry)
        if (gcSinks.size === 0) {
          gcObserver?.disconnect()
          gcObserver = undefined
        }
      }),
  )
  : Effect.void

/**
 * Options of {@link make}.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** How often to sample. Default 5 s. */
  readonly interval?: Duration.Input | undefined
}

/**
 * Samples at once, then every `interval` on a `Schedule`, for as long as the scope lives.
 * Registers the SDK's metrics at zero
 * (`WorkerMetrics.register`) and, where the runtime reports them, observes garbage collections
 * into `nodejs_gc_duration_seconds`, every `kind` at zero from the start.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (options: Options = {}): Effect.Effect<void, never, Scope.Scope> =>
  Effect.gen(function* () {
    const interval = Duration.fromInputUnsafe(options.interval ?? "5 seconds")
    yield* WorkerMetrics.register
    yield* observeGc
    yield* sample
    yield* Effect.forkScoped(Effect.schedule(sample, Schedule.spaced(interval)))
  })

/**
 * What `/metrics` serves: the figures sampled ({@link sample}), the registry's exposition
 * (`Prometheus.exposition`), then the worst event loop lag started again from 0
 * (`EventLoop.scraped`), so that each scrape shows the worst since the one before.
 *
 * @since 0.3.0
 * @category metrics
 */
export const scrape: Effect.Effect<string> = sample.pipe(
  Effect.andThen(Prometheus.exposition),
  Effect.tap(EventLoop.scraped),
)

/**
 * {@link make} as a layer, for the life of the worker.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options = {}): Layer.Layer<never> =>
  Layer.effectDiscard(make(options))
