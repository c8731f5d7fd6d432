/**
 * A recorded run: one delivery of each kind the engine settles, through the harness, and what it
 * left behind — every log line at warning and above, every decision line, every message on the
 * output queue (its id, type and exact bytes) and the change of every worker counter — compared
 * with `recorded/run.txt`. The file was written by the engine before it was laid out by stage
 * (issue 38) and must not change with a change of layout: a difference is a change of behaviour.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as Prometheus from "../../../src/Prometheus.ts"
import * as WorkerHarness from "../../../src/testing.ts"
import type { TaskContext } from "../../../src/TaskContext.ts"
import * as Worker from "../../../src/Worker.ts"
import { FatalError, RetryableError } from "../../../src/WorkerError.ts"
import { textOf } from "../../support/builders.ts"
import { type LogLine, withLogs } from "../../support/logs.ts"

const Input = Schema.Struct({ mode: Schema.String })

/** What the handler does, by the task's `mode`. */
const behave = (mode: string, ctx: TaskContext) =>
  Effect.gen(function* () {
    switch (mode) {
      case "fatal":
        return yield* new FatalError({ code: "EMPTY_TEXT", message: "Nothing to count." })
      case "bad-code":
        return yield* new FatalError({ code: "not-a-code", message: "lower case" })
      case "retry":
        return yield* new RetryableError({ code: "UPSTREAM_DOWN", message: "Down." })
      case "retry-own-delay":
        return yield* new RetryableError({ code: "UPSTREAM_DOWN", delay: "5 millis" })
      case "retry-bad-delay":
        return yield* new RetryableError({ delay: -3 })
      case "transient":
        return yield* Effect.die(new TypeError("fetch failed"))
      case "internal":
        return yield* Effect.die(new Error("boom"))
      case "hang":
        return yield* Effect.never
      case "wrong-output":
        return { words: "many" } as unknown as { words: number }
      case "not-json":
        return { words: 1n } as unknown as { words: number }
      case "large":
        return { words: 1, padding: "x".repeat(20_000) } as unknown as { words: number }
      case "progress":
        yield* ctx.progress(0.5, { stage: "half" })
        return { words: 2 }
      default:
        return { words: 1 }
    }
  })

const worker = Worker.make({
  name: "recorded",
  input: Input,
  output: Schema.Struct({ words: Schema.Number, padding: Schema.optional(Schema.String) }),
  timeout: "200 millis",
  handler: ({ mode }, ctx) => behave(mode, ctx),
  retryOn: (e) => e instanceof TypeError,
})

/** The tasks submitted one after another: id, the handler's mode, the earlier deliveries. */
const SCENARIOS: ReadonlyArray<readonly [string, string, number?]> = [
  ["t-success", "ok"],
  ["t-progress", "progress"],
  ["t-fatal", "fatal"],
  ["t-bad-code", "bad-code"],
  ["t-retry", "retry"],
  ["t-retry-last", "retry", 4],
  ["t-retry-own-delay", "retry-own-delay"],
  ["t-retry-bad-delay", "retry-bad-delay"],
  ["t-transient", "transient"],
  ["t-transient-last", "transient", 4],
  ["t-internal", "internal"],
  ["t-timeout", "hang"],
  ["t-wrong-output", "wrong-output"],
  ["t-not-json", "not-json"],
  ["t-past-limit", "ok", 5],
]

/** A line as the record keeps it: level, message and annotations, in a stable order. */
const lineOf = (line: LogLine): string => {
  const annotations = Object.keys(line.annotations).sort().map((k) =>
    `${k}=${JSON.stringify(line.annotations[k])}`
  )
  return `${line.level} ${line.message} {${annotations.join(" ")}}`
}

/** The worker counters' values, by series. */
const counters = Effect.map(Prometheus.exposition, (text) => {
  const values = new Map<string, number>()
  for (const line of text.split("\n")) {
    if (!line.startsWith("worker_") || line.includes("_bucket") || line.includes("_sum")) continue
    if (line.includes("_count") || line.startsWith("worker_tasks_in_flight")) continue
    const at = line.lastIndexOf(" ")
    values.set(line.slice(0, at), Number(line.slice(at + 1)))
  }
  return values
})

/** A message id with the delivery's own random id (`deliveryIdOf`) masked. */
const maskId = (id: string | undefined): string =>
  id === undefined ? "-" : id.replace(/^([^:]*:\d+:)[0-9a-z]{8}:/, "$1<delivery>:")

describe("a recorded run", () => {
  it.effect("settles each kind of delivery as recorded before the engine was laid out by stage", () =>
    withLogs((logs) =>
      Effect.gen(function* () {
        const before = yield* counters
        // The host's name is in `started`: one for every machine the record is compared on.
        const hostname = "recorded-host"
        const harness = yield* WorkerHarness.make(worker, {
          logLevel: "info",
          settingsOverrides: { hostname },
        })
        const small = yield* WorkerHarness.make(worker, {
          logLevel: "info",
          settingsOverrides: { hostname, maxOutputBytes: 16384 },
        })
        const runs: Array<string> = []
        const submit = (
          h: typeof harness,
          taskId: string,
          mode: string,
          deliveryCount?: number,
        ) =>
          Effect.map(
            h.submit({ mode }, {
              taskId,
              ...(deliveryCount === undefined ? {} : { deliveryCount }),
            }),
            (run) => runs.push(`${taskId}: ${run.outcome} [${run.messageTypes.join(", ")}]`),
          )
        for (const [taskId, mode, deliveryCount] of SCENARIOS) {
          yield* submit(harness, taskId, mode, deliveryCount)
        }
        yield* submit(small, "t-large", "large")
        yield* harness.failNextPublish("started")
        yield* submit(harness, "t-started-refused", "ok")
        yield* harness.failNextPublish("success")
        yield* submit(harness, "t-success-refused", "ok")
        const invalid = yield* harness.submit({ text: 3 } as unknown as { mode: string }, {
          taskId: "t-invalid-input",
        })
        runs.push(`t-invalid-input: ${invalid.outcome} [${invalid.messageTypes.join(", ")}]`)
        for (
          const raw of [
            JSON.stringify({ task_id: "t-malformed", data: { message_type: "submission" } }),
            "not json",
            "",
          ]
        ) {
          const run = yield* harness.submitRaw(raw)
          runs.push(`raw ${JSON.stringify(raw)}: ${run.outcome} [${run.messageTypes.join(", ")}]`)
        }
        const after = yield* counters
        const changed = [...after].filter(([series, value]) => value !== (before.get(series) ?? 0))
          .map(([series, value]) => `${series} +${value - (before.get(series) ?? 0)}`)
        const wire = [harness, small].flatMap((h) => h.broker.published(h.settings.outQueue))
        const messages = (yield* Effect.all(wire)).flat().map((m) =>
          `${maskId(m.messageId)} ${m.type ?? "-"} ${textOf(m.body)}`
        )
        const record = [
          "# runs",
          ...runs,
          "# log lines (warning and above, and decisions)",
          ...logs.lines.filter((l) =>
            l.level !== "Info" && l.level !== "Debug" || l.message.startsWith("Delivery settled:")
          ).map(lineOf),
          "# wire",
          ...messages,
          "# counters",
          ...changed.sort(),
          "",
        ].join("\n")
        yield* Effect.promise(() => expect(record).toMatchFileSnapshot("recorded/run.txt"))
      })
    ))
})
