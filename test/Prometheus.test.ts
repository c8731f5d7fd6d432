import { readFileSync } from "node:fs"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Layer, Metric, Schema } from "effect"
import * as Concurrency from "../src/Concurrency.ts"
import * as Probes from "../src/Probes.ts"
import * as Prometheus from "../src/Prometheus.ts"
import * as RuntimeMetrics from "../src/RuntimeMetrics.ts"
import * as WorkerHarness from "../src/testing.ts"
import * as Worker from "../src/Worker.ts"
import { family, lines, parse, type ParsedFamily, value } from "./support/prometheus.ts"

// Effect's registry is global to the file's process: every test declares metrics of its own.

describe("Prometheus", () => {
  it.effect("counters and gauges: one family each, every label set a series, exact values", () =>
    Effect.gen(function* () {
      const requests = Metric.counter("p1_requests_total", { description: "Requests handled" })
      yield* Metric.update(Metric.withAttributes(requests, { method: "get" }), 3)
      yield* Metric.update(Metric.withAttributes(requests, { method: "post" }), 1)
      yield* Metric.update(
        Metric.withAttributes(Metric.withAttributes(requests, { method: "get" }), { code: "500" }),
        1,
      )
      const big = Metric.counter("p1_bytes_total", { bigint: true })
      yield* Metric.update(big, 12345678901234567890n)
      const temperature = Metric.gauge("p1_temperature", { description: "Degrees" })
      yield* Metric.update(Metric.withAttributes(temperature, { room: "a" }), -2.5)
      yield* Metric.update(Metric.withAttributes(temperature, { room: "b" }), 1e21)

      const text = yield* Prometheus.exposition
      const families = parse(text)
      expect(family(families, "p1_requests_total")).toMatchObject({
        type: "COUNTER",
        help: "Requests handled",
      })
      expect(value(families, "p1_requests_total", { method: "get" })).toBe(3)
      expect(value(families, "p1_requests_total", { method: "post" })).toBe(1)
      expect(value(families, "p1_requests_total", { method: "get", code: "500" })).toBe(1)
      expect(family(families, "p1_requests_total").metrics).toHaveLength(3)
      expect(lines(text, "p1_bytes_total")).toEqual(["p1_bytes_total 12345678901234567890"])
      expect(family(families, "p1_temperature").type).toBe("GAUGE")
      expect(value(families, "p1_temperature", { room: "a" })).toBe(-2.5)
      expect(value(families, "p1_temperature", { room: "b" })).toBe(1e21)
      // Labels sorted by name, series by labels.
      expect(lines(text, "p1_requests_total")).toEqual([
        `p1_requests_total{code="500",method="get"} 1`,
        `p1_requests_total{method="get"} 3`,
        `p1_requests_total{method="post"} 1`,
      ])
      // No HELP line without a description: the TYPE line alone.
      expect(text).not.toContain("# HELP p1_bytes_total")
      expect(text).toContain("# TYPE p1_bytes_total counter\n")
    }))

  it.effect("a histogram: cumulative buckets up to +Inf, _sum and _count, per label set", () =>
    Effect.gen(function* () {
      const latency = Metric.histogram("p2_latency_seconds", {
        description: "Latency",
        boundaries: Metric.boundariesFromIterable([1, 2, 5]),
      })
      for (const v of [0.5, 1, 3, 10]) yield* Metric.update(latency, v)
      const sized = Metric.histogram("p2_size_bytes", {
        boundaries: Metric.boundariesFromIterable([0.25, 10]),
      })
      yield* Metric.update(Metric.withAttributes(sized, { kind: "a" }), 0.1)
      yield* Metric.update(Metric.withAttributes(sized, { kind: "b" }), 7)
      yield* Metric.update(Metric.withAttributes(sized, { kind: "b" }), 70)

      const text = yield* Prometheus.exposition
      const families = parse(text)
      expect(family(families, "p2_latency_seconds")).toEqual({
        name: "p2_latency_seconds",
        help: "Latency",
        type: "HISTOGRAM",
        metrics: [{
          buckets: { "1": "2", "2": "2", "5": "3", "+Inf": "4" },
          sum: "14.5",
          count: "4",
        }],
      })
      // The parser folds the series of a labelled histogram into one: read the lines.
      expect(family(families, "p2_size_bytes").type).toBe("HISTOGRAM")
      expect(text).toContain(
        [
          "# TYPE p2_size_bytes histogram",
          `p2_size_bytes_bucket{kind="a",le="0.25"} 1`,
          `p2_size_bytes_bucket{kind="a",le="10"} 1`,
          `p2_size_bytes_bucket{kind="a",le="+Inf"} 1`,
          `p2_size_bytes_sum{kind="a"} 0.1`,
          `p2_size_bytes_count{kind="a"} 1`,
          `p2_size_bytes_bucket{kind="b",le="0.25"} 0`,
          `p2_size_bytes_bucket{kind="b",le="10"} 1`,
          `p2_size_bytes_bucket{kind="b",le="+Inf"} 2`,
          `p2_size_bytes_sum{kind="b"} 77`,
          `p2_size_bytes_count{kind="b"} 2`,
          "",
        ].join("\n"),
      )
    }))

  it.effect("a summary: its quantiles, _sum and _count; a quantile with no data is NaN", () =>
    Effect.gen(function* () {
      const options = { maxAge: "1 minute", maxSize: 100, quantiles: [0.5, 0.9] } as const
      const rtt = Metric.summary("p3_rtt_seconds", { description: "RTT", ...options })
      for (let i = 1; i <= 10; i++) yield* Metric.update(rtt, i)
      const idle = Metric.summary("p3_idle_seconds", options)
      yield* Metric.value(idle)

      const state = yield* Metric.value(rtt)
      const q = (p: number) => String(state.quantiles.find(([x]) => x === p)![1]!)
      const families = parse(yield* Prometheus.exposition)
      expect(family(families, "p3_rtt_seconds")).toEqual({
        name: "p3_rtt_seconds",
        help: "RTT",
        type: "SUMMARY",
        metrics: [{ quantiles: { "0.5": q(0.5), "0.9": q(0.9) }, sum: "55", count: "10" }],
      })
      expect(Number(q(0.5))).toBeGreaterThanOrEqual(5)
      expect(Number(q(0.5))).toBeLessThanOrEqual(6)
      expect(family(families, "p3_idle_seconds").metrics).toEqual([{
        quantiles: { "0.5": "NaN", "0.9": "NaN" },
        sum: "0",
        count: "0",
      }])
    }))

  it.effect("a frequency: a counter with one series per word, in the label key", () =>
    Effect.gen(function* () {
      const words = Metric.frequency("p4_words_total", { description: "Words seen" })
      for (const w of ["b", "a", "b", "b"]) {
        yield* Metric.update(Metric.withAttributes(words, { lang: "en" }), w)
      }
      yield* Metric.update(Metric.withAttributes(words, { key: "shadowed" }), "c")

      const text = yield* Prometheus.exposition
      const families = parse(text)
      expect(family(families, "p4_words_total").type).toBe("COUNTER")
      expect(value(families, "p4_words_total", { lang: "en", key: "a" })).toBe(1)
      expect(value(families, "p4_words_total", { lang: "en", key: "b" })).toBe(3)
      expect(value(families, "p4_words_total", { key: "c" })).toBe(1)
      expect(lines(text, "p4_words_total")).toEqual([
        `p4_words_total{key="a",lang="en"} 1`,
        `p4_words_total{key="b",lang="en"} 3`,
        `p4_words_total{key="c"} 1`,
      ])
    }))

  it.effect("escapes label values and help texts, maps names onto Prometheus' charset", () =>
    Effect.gen(function* () {
      const awkward = `C:\\dir\\"quoted"\nnext line ünïcödé {},=`
      const metric = Metric.counter("p5.odd-name total", {
        description: 'Help with a \\ backslash\nand a second line "quoted"',
      })
      yield* Metric.update(Metric.withAttributes(metric, { path: awkward }), 1)
      yield* Metric.update(Metric.withAttributes(metric, { "bad-label.name": "x" }), 1)
      yield* Metric.update(Metric.gauge("9p5_leading_digit"), 1)

      const text = yield* Prometheus.exposition
      const families = parse(text)
      expect(family(families, "p5_odd_name_total").help).toBe(
        'Help with a \\ backslash\nand a second line "quoted"',
      )
      expect(text).toContain(
        `# HELP p5_odd_name_total Help with a \\\\ backslash\\nand a second line "quoted"\n`,
      )
      expect(value(families, "p5_odd_name_total", { path: awkward })).toBe(1)
      expect(value(families, "p5_odd_name_total", { bad_label_name: "x" })).toBe(1)
      expect(lines(text, "p5_odd_name_total")).toContain(
        `p5_odd_name_total{path="C:\\\\dir\\\\\\"quoted\\"\\nnext line ünïcödé {},="} 1`,
      )
      expect(value(families, "_9p5_leading_digit")).toBe(1)
    }))

  it.effect("formats +Inf, -Inf and NaN", () =>
    Effect.gen(function* () {
      const g = Metric.gauge("p6_special")
      yield* Metric.update(Metric.withAttributes(g, { v: "pinf" }), Infinity)
      yield* Metric.update(Metric.withAttributes(g, { v: "ninf" }), -Infinity)
      yield* Metric.update(Metric.withAttributes(g, { v: "nan" }), NaN)
      const text = yield* Prometheus.exposition
      expect(lines(text, "p6_special")).toEqual([
        `p6_special{v="nan"} NaN`,
        `p6_special{v="ninf"} -Inf`,
        `p6_special{v="pinf"} +Inf`,
      ])
      const families = parse(text)
      expect(value(families, "p6_special", { v: "pinf" })).toBe(Infinity)
      expect(value(families, "p6_special", { v: "ninf" })).toBe(-Infinity)
      expect(value(families, "p6_special", { v: "nan" })).toBeNaN()
    }))

  it.effect("one type per family and one sample per series, whatever the registry holds", () =>
    Effect.gen(function* () {
      // Same name, other types: the family stays a counter and the gauge is left out.
      yield* Metric.update(Metric.counter("p7_clash"), 1)
      yield* Metric.update(Metric.gauge("p7_clash"), 42)
      // Same name and labels, other descriptions: one series, the first help text.
      yield* Metric.update(Metric.counter("p7_dup_total", { description: "A" }), 1)
      yield* Metric.update(Metric.counter("p7_dup_total", { description: "B" }), 5)

      const text = yield* Prometheus.exposition
      const families = parse(text)
      expect(family(families, "p7_clash")).toEqual({
        name: "p7_clash",
        help: "",
        type: "COUNTER",
        metrics: [{ value: "1" }],
      })
      expect(family(families, "p7_dup_total")).toEqual({
        name: "p7_dup_total",
        help: "A",
        type: "COUNTER",
        metrics: [{ value: "1" }],
      })
    }))

  it.effect("deterministic: families sorted by name, the same text twice", () =>
    Effect.gen(function* () {
      yield* Metric.update(Metric.counter("p8_b_total"), 1)
      yield* Metric.update(Metric.counter("p8_a_total"), 1)
      const first = yield* Prometheus.exposition
      const second = yield* Prometheus.exposition
      expect(second).toBe(first)
      const names = parse(first).map((f) => f.name)
      expect(names).toEqual([...names].sort())
      expect(Prometheus.render([])).toBe("")
    }))

  it("a handler's own Effect metric appears beside the SDK's, with no task label", async () => {
    const handled = Metric.counter("p9_handler_words_total", { description: "Words counted" })
    const worker = Worker.make({
      name: "p9-metrics",
      input: Schema.Struct({ text: Schema.String }),
      output: Schema.Struct({ words: Schema.Number }),
      timeout: "5 seconds",
      handler: (input) =>
        Effect.gen(function* () {
          const words = input.text.split(" ").length
          yield* Metric.update(Metric.withAttributes(handled, { source: "handler" }), words)
          return { words }
        }),
    })
    await using harness = await WorkerHarness.start(worker)
    const run = await harness.submit({ text: "one two three" }, { taskId: "task-p9" })
    run.assertSucceeded()

    const text = await Effect.runPromise(Prometheus.exposition)
    const families = parse(text)
    expect(value(families, "p9_handler_words_total", { source: "handler" })).toBe(3)
    expect(value(families, "worker_tasks_total", { status: "success" })).toBe(1)
    expect(family(families, "worker_task_duration_seconds").type).toBe("HISTOGRAM")
    // No such label (a poison reason is named `no_task_id`), and never the task's id.
    expect(text).not.toMatch(/[{,](task_id|client_id|service)=|task-p9/)
  })

  describe("the SDK's series, from the start", () => {
    /** The metric names docs/deployment.md's "Metrics" section lists (the README links it). */
    const listed = (() => {
      const page = readFileSync(new URL("../docs/deployment.md", import.meta.url), "utf8")
      const start = page.indexOf("\n## Metrics\n")
      if (start === -1) throw new Error("docs/deployment.md has no Metrics section")
      const section = page.slice(start, page.indexOf("\n## ", start + 1))
      const names = [...section.matchAll(/`([a-z_]+)(?:\{[a-z_,]*\})?`/g)].map((m) => m[1]!)
      // "process_cpu_seconds_total (and its user and system parts)".
      return [...names, "process_cpu_user_seconds_total", "process_cpu_system_seconds_total"]
    })()

    // Every label value the SDK knows before any task; `code` is the handlers' own.
    const known: ReadonlyArray<readonly [string, string, ReadonlyArray<string>]> = [
      ["worker_tasks_total", "status", [
        "success",
        "failure",
        "poison",
        "retry",
        "publish_failed",
        "shutdown_requeued",
        "cancelled",
        "engine_error",
      ]],
      ["worker_messages_published_total", "message_type", [
        "started",
        "progress",
        "success",
        "failure",
      ]],
      ["worker_publish_failures_total", "message_type", [
        "started",
        "progress",
        "success",
        "failure",
      ]],
      ["worker_poison_messages_total", "reason", [
        "too_large",
        "not_utf8",
        "not_json",
        "not_object",
        "no_task_id",
        "invalid_envelope",
      ]],
      ["worker_progress_dropped_total", "reason", [
        "invalid",
        "regressed",
        "superseded",
        "concluded",
        "publish_failed",
        "too_large",
      ]],
    ]

    /** The SDK's own series, every one at zero: no task has run. */
    const expectZeros = (text: string, families: ReadonlyArray<ParsedFamily>) => {
      for (const [name, label, values] of known) {
        for (const v of values) {
          expect(value(families, name, { [label]: v }), `${name} ${v}`).toBe(0)
        }
        expect(family(families, name).metrics).toHaveLength(values.length)
      }
      for (const name of ["worker_task_retries_total", "worker_ack_failures_total"]) {
        expect(value(families, name)).toBe(0)
      }
      expect(value(families, "worker_shutdown_requeued_total")).toBe(0)
      expect(value(families, "worker_tasks_in_flight")).toBe(0)
      expect(lines(text, "worker_task_duration_seconds_count")).toEqual([
        "worker_task_duration_seconds_count 0",
      ])
      expect(text).not.toContain("worker_task_failures_total")
    }

    const worker = Worker.make({
      name: "p10-from-the-start",
      input: Schema.Struct({}),
      output: Schema.Struct({}),
      timeout: "5 seconds",
      concurrency: Concurrency.adaptive({ min: 1, max: 8, initial: 2 }),
      handler: () => Effect.succeed({}),
    })

    it.effect("a started worker's /metrics lists all the names docs/deployment.md lists, in the app's registry", () =>
      Effect.gen(function* () {
        const registry: Metric.MetricRegistry = new Map()
        const text = yield* Effect.gen(function* () {
          const probes = yield* Layer.build(Worker.layerMemory(worker)).pipe(
            Effect.map((context) => context.mapUnsafe.get(Probes.WorkerProbes.key)),
          ) as Effect.Effect<Probes.WorkerProbes["Service"]>
          return yield* probes.metrics
        }).pipe(
          Effect.provideService(Metric.MetricRegistry, registry),
          Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromUnknown({})),
        )
        const families = parse(text)
        const names = new Set(
          families.map((f) => f.name).concat(
            // The parser names a histogram's family by its samples' prefix.
            families.filter((f) => f.type === "HISTOGRAM").map((f) => f.name),
          ),
        )
        const expected = listed.filter((name) =>
          name !== "worker_task_failures_total" &&
          (name !== "nodejs_gc_duration_seconds" || RuntimeMetrics.reportsGc)
        )
        // The page lists the SDK's series: a section that lost its list would check nothing.
        expect(listed).toEqual(
          expect.arrayContaining(["worker_tasks_total", "nodejs_heap_size_used_bytes"]),
        )
        expect(expected.filter((name) => !names.has(name))).toEqual([])
        expectZeros(text, families)
        if (RuntimeMetrics.reportsGc) {
          for (const kind of ["minor", "major", "incremental", "weakcb"]) {
            expect(lines(text, "nodejs_gc_duration_seconds_count").join("\n")).toContain(
              `{kind="${kind}"}`,
            )
          }
        }
      }))

    it.effect("the harness registers them too, in the registry the test provides", () =>
      Effect.gen(function* () {
        const registry: Metric.MetricRegistry = new Map()
        const text = yield* Effect.andThen(WorkerHarness.make(worker), Prometheus.exposition).pipe(
          Effect.provideService(Metric.MetricRegistry, registry),
        )
        expectZeros(text, parse(text))
      }))
  })
})
