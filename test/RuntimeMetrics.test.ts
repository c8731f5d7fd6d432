import { describe, expect, it } from "@effect/vitest"
import process from "node:process"
import { Effect, Metric } from "effect"
import { TestClock } from "effect/testing"
import { VERSION } from "../src/internal/version.ts"
import * as Prometheus from "../src/Prometheus.ts"
import * as RuntimeMetrics from "../src/RuntimeMetrics.ts"
import { family, parse, value } from "./support/prometheus.ts"

const isDeno = "Deno" in globalThis

const scrape = Effect.map(Prometheus.exposition, parse)

/** Keeps the CPU busy until the process has spent `ms` more milliseconds of CPU time. */
const burnCpu = (ms: number) => {
  const used = () => {
    const { system, user } = process.cpuUsage()
    return (user + system) / 1000
  }
  const end = used() + ms
  while (used() < end) { /* busy */ }
}

/** The minor collections an exposition counts. */
const minorCollections = (text: string): number =>
  Number(/^nodejs_gc_duration_seconds_count\{kind="minor"\} (\d+)$/m.exec(text)?.[1])

/**
 * Allocates until `exposition` counts a minor collection, which the runtime reports some time
 * after it (a fixed wait would race a loaded machine), for at most 3 s: the last exposition. Where
 * the runtime reports none, after one round.
 */
const afterCollections = (exposition: Effect.Effect<string>) =>
  Effect.gen(function* () {
    let text = ""
    let kept = 0
    for (let tries = 0; tries < 60; tries++) {
      for (let round = 0; round < 20; round++) {
        const keep: Array<{ readonly i: number }> = []
        for (let i = 0; i < 50_000; i++) keep.push({ i })
        kept = keep.length
      }
      yield* Effect.sleep("50 millis")
      text = yield* exposition
      if (!RuntimeMetrics.reportsGc || minorCollections(text) > 0) break
    }
    expect(kept).toBe(50_000)
    return text
  })

describe("RuntimeMetrics", () => {
  it("names the runtime: deno or node, with its version", () => {
    expect(RuntimeMetrics.runtime).toMatch(isDeno ? /^deno \d+\.\d+\.\d+/ : /^node \d+\.\d+\.\d+/)
    expect(RuntimeMetrics.reportsGc).toBe(!isDeno)
  })

  it.effect("samples at once, then on its schedule: sdk info, lag, CPU, memory, heap", () =>
    Effect.gen(function* () {
      yield* RuntimeMetrics.make({ interval: "5 seconds" })
      const first = yield* scrape

      expect(family(first, "worker_sdk_info").type).toBe("GAUGE")
      expect(value(first, "worker_sdk_info", { version: VERSION, runtime: RuntimeMetrics.runtime }))
        .toBe(1)
      expect(value(first, "event_loop_lag_seconds", { component: "worker" })).toBe(0)
      expect(family(first, "process_cpu_seconds_total").type).toBe("COUNTER")
      const cpu = value(first, "process_cpu_seconds_total")
      expect(cpu).toBeGreaterThan(0)
      expect(cpu).toBeCloseTo(
        value(first, "process_cpu_user_seconds_total") +
          value(first, "process_cpu_system_seconds_total"),
        6,
      )
      const rss = value(first, "process_resident_memory_bytes")
      expect(rss).toBeGreaterThan(1e6)
      expect(rss).toBeLessThan(1e11)
      const used = value(first, "nodejs_heap_size_used_bytes")
      expect(used).toBeGreaterThan(1e5)
      expect(used).toBeLessThanOrEqual(value(first, "nodejs_heap_size_total_bytes"))
      expect(value(first, "nodejs_external_memory_bytes")).toBeGreaterThanOrEqual(0)
      const start = value(first, "process_start_time_seconds")
      expect(start).toBeLessThanOrEqual(Date.now() / 1000 + 1)
      expect(start).toBeGreaterThan(Date.now() / 1000 - 24 * 3600)
      expect(value(first, "nodejs_active_resources_total")).toBeGreaterThanOrEqual(0)
      // The SDK's unlabelled metrics are there from the start, at zero.
      expect(value(first, "worker_task_retries_total")).toBe(0)
      expect(value(first, "worker_tasks_in_flight")).toBeGreaterThanOrEqual(0)
      expect(family(first, "worker_task_duration_seconds").type).toBe("HISTOGRAM")

      burnCpu(30)
      yield* TestClock.adjust("4 seconds")
      expect(value(yield* scrape, "process_cpu_seconds_total")).toBe(cpu)
      yield* TestClock.adjust("1 second")
      const second = yield* scrape
      expect(value(second, "process_cpu_seconds_total")).toBeGreaterThanOrEqual(cpu + 0.02)
    }))

  it.effect("sample, on demand, counts the resources keeping the loop alive", () =>
    Effect.gen(function* () {
      const timers = [setTimeout(() => {}, 60_000), setTimeout(() => {}, 60_000)]
      yield* RuntimeMetrics.sample
      const families = yield* scrape
      timers.forEach(clearTimeout)
      expect(value(families, "nodejs_active_resources", { type: "Timeout" }))
        .toBeGreaterThanOrEqual(2)
      expect(value(families, "nodejs_active_resources_total")).toBe(
        family(families, "nodejs_active_resources").metrics.reduce(
          (n, m) => n + Number(m.value),
          0,
        ),
      )
    }))

  it.live("samples into the registry it runs with, garbage collections included", () =>
    Effect.gen(function* () {
      const registry: Metric.MetricRegistry = new Map()
      const own = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
        Effect.provideService(effect, Metric.MetricRegistry, registry)
      // Another sampler, on the default registry, shares the process' one gc observer.
      yield* RuntimeMetrics.make()
      yield* own(RuntimeMetrics.make())
      const text = yield* afterCollections(own(Prometheus.exposition))
      const families = parse(text)
      expect(
        value(families, "worker_sdk_info", { version: VERSION, runtime: RuntimeMetrics.runtime }),
      )
        .toBe(1)
      expect(value(families, "worker_task_retries_total")).toBe(0)
      if (RuntimeMetrics.reportsGc) {
        expect(minorCollections(text)).toBeGreaterThan(0)
        // The default registry hears the same pauses, from an earlier start.
        expect(minorCollections(yield* Prometheus.exposition)).toBeGreaterThanOrEqual(
          minorCollections(text),
        )
      }
    }).pipe(Effect.scoped))

  it.live("garbage collections, where the runtime reports them", () =>
    Effect.gen(function* () {
      yield* RuntimeMetrics.make()
      const text = yield* afterCollections(Prometheus.exposition)
      if (RuntimeMetrics.reportsGc) {
        expect(family(parse(text), "nodejs_gc_duration_seconds").type).toBe("HISTOGRAM")
        expect(minorCollections(text)).toBeGreaterThan(0)
      } else {
        expect(text).not.toContain("nodejs_gc_duration_seconds")
      }
    }).pipe(Effect.scoped))
})
