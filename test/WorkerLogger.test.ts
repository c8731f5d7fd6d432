import { describe, expect, it, vi } from "@effect/vitest"
import { Cause, Data, Effect, Logger, type LogLevel, Schema } from "effect"
import * as WorkerHarness from "../src/testing.ts"
import * as Worker from "../src/Worker.ts"
import { FatalError } from "../src/WorkerError.ts"
import * as WorkerLogger from "../src/WorkerLogger.ts"

const line = (options: {
  readonly message?: unknown
  readonly level?: LogLevel.LogLevel
  readonly annotations?: Record<string, unknown>
  readonly cause?: Cause.Cause<unknown>
  readonly errorText?: boolean
  readonly redact?: ReadonlyArray<string>
}) =>
  JSON.parse(WorkerLogger.format({
    date: new Date("2026-11-29T12:00:00.000Z"),
    logLevel: options.level ?? "Info",
    message: options.message ?? "hello",
    annotations: options.annotations ?? {},
    cause: options.cause ?? Cause.empty,
    errorText: options.errorText,
    redact: options.redact,
  }))

describe("WorkerLogger", () => {
  it("writes ts, level, logger and msg first, then task_id, service and attempt, then the rest", () => {
    const text = WorkerLogger.format({
      date: new Date("2026-11-29T12:00:00.000Z"),
      logLevel: "Info",
      message: "Delivery settled: outcome=success action=conclude attempt=1/5",
      annotations: { outcome: "success", attempt: 1, service: "count-words", task_id: "t-1" },
      cause: Cause.empty,
    })
    expect(Object.keys(JSON.parse(text))).toEqual([
      "ts",
      "level",
      "logger",
      "msg",
      "task_id",
      "service",
      "attempt",
      "outcome",
    ])
    expect(JSON.parse(text)).toMatchObject({
      ts: "2026-11-29T12:00:00.000Z",
      level: "INFO",
      logger: WorkerLogger.DEFAULT_LOGGER_NAME,
      task_id: "t-1",
      attempt: 1,
    })
    expect(text).not.toContain("\n")
  })

  it("names levels as Python does", () => {
    expect(line({ level: "Warn" }).level).toBe("WARNING")
    expect(line({ level: "Fatal" }).level).toBe("CRITICAL")
    expect(line({ level: "Debug" }).level).toBe("DEBUG")
    expect(line({ level: "Error" }).level).toBe("ERROR")
  })

  it("takes `logger` from the annotations and joins a message of several parts", () => {
    const l = line({ message: ["a", 2, { b: 1 }], annotations: { logger: "handler" } })
    expect(l.logger).toBe("handler")
    expect(l.msg).toBe('a 2 {"b":1}')
    expect(l).not.toHaveProperty("annotations")
  })

  it("gives a cause's kinds, and its first error's message and stack, with secrets redacted", () => {
    const secret = "payload-marker-4711"
    const cause = Cause.combine(
      Cause.fail(new TypeError(`boom at amqp://guest:${secret}@host`)),
      Cause.die(new FatalError({ code: "X", message: "second" })),
    )
    const l = line({ cause, redact: [secret] })
    expect(l.error_type).toBe("TypeError, FatalError")
    expect(l.error_message).toBe("boom at amqp://guest:***@host")
    expect(String(l.error_stack)).toContain("TypeError: boom at amqp://guest:***@host")
    expect(JSON.stringify(l)).not.toContain(secret)
    // An interruption alone has no error to name.
    expect(line({ cause: Cause.interrupt() }).error_type).toBe("Interrupted")
  })

  it("error_message is the message alone: error_type beside it names the error", () => {
    class QuotaExceeded extends Data.Error<{ readonly message: string }> {}
    const errors: ReadonlyArray<readonly [unknown, string, string]> = [
      [new Error("secret"), "Error", "secret"],
      [new RangeError("too far"), "RangeError", "too far"],
      [new FatalError({ code: "X", message: "Not allowed." }), "FatalError", "Not allowed."],
      // Named "Error" by Effect, whatever its class: the kind is the class.
      [new QuotaExceeded({ message: "over" }), "QuotaExceeded", "over"],
      [new Error(""), "Error", ""],
      ["a string failure", "string", "a string failure"],
      [{ code: 1 }, "Object", "a non-Error value (Object)"],
    ]
    for (const [error, type, message] of errors) {
      const l = line({ cause: Cause.fail(error) })
      expect([l.error_type, l.error_message]).toEqual([type, message])
    }
  })

  it("with errorText off (WORKER_LOG_ERROR_TEXT=false), a cause's kinds only, never its text", () => {
    const secret = "payload-marker-4711"
    const l = line({ cause: Cause.die(new TypeError(secret)), errorText: false })
    expect(l.error_type).toBe("TypeError")
    expect(JSON.stringify(l)).not.toContain(secret)
  })

  it("keeps a line whose annotation JSON cannot write", () => {
    const l = line({ annotations: { big: 10n } })
    expect(l.big).toBe("10")
    expect(l.msg).toBe("hello")
  })

  it.effect("its layer replaces the default logger: one JSON line per log call on stdout", () =>
    Effect.gen(function* () {
      const spy = vi.spyOn(console, "log").mockImplementation(() => {})
      try {
        yield* Effect.logInfo("one").pipe(
          Effect.annotateLogs({ task_id: "t-9" }),
          Effect.provide(WorkerLogger.layer),
        )
        yield* Effect.logWarning("two").pipe(Effect.provide(WorkerLogger.layer))
        const written = spy.mock.calls.map(([text]) => JSON.parse(String(text)))
        expect(written.map((l) => [l.level, l.msg, l.task_id])).toEqual([
          ["INFO", "one", "t-9"],
          ["WARNING", "two", undefined],
        ])
      } finally {
        spy.mockRestore()
      }
    }).pipe(
      Effect.provide(
        Logger.layer([Logger.make(({ message }) => seen.push(String(message)))]),
      ),
    ))

  it.effect("its layer keeps Effect's tracer logger: a line logged in a span is an event of it", () =>
    Effect.gen(function* () {
      const spy = vi.spyOn(console, "log").mockImplementation(() => {})
      try {
        const span = yield* Effect.logInfo("in a span").pipe(
          Effect.andThen(Effect.currentSpan),
          Effect.annotateLogs({ task_id: "t-10" }),
          Effect.withSpan("a task"),
          Effect.provide(WorkerLogger.layer),
        )
        expect(spy).toHaveBeenCalledTimes(1)
        const events = (span as unknown as {
          readonly events: ReadonlyArray<readonly [string, bigint, Record<string, unknown>]>
        }).events
        expect(events.map(([name, , attributes]) => [name, attributes.task_id])).toEqual([
          ["in a span", "t-10"],
        ])
      } finally {
        spy.mockRestore()
      }
    }))

  const seen: Array<string> = []
  it.effect("a worker run inside an app keeps the app's logger: the SDK adds none", () =>
    Effect.gen(function* () {
      const spy = vi.spyOn(console, "log")
      try {
        const worker = Worker.make({
          name: "logger-probe",
          input: Schema.Struct({}),
          output: Schema.Struct({}),
          timeout: "5 seconds",
          handler: () => Effect.as(Effect.logInfo("from the handler"), {}),
        })
        // Asked for: the harness logs nothing by default.
        const harness = yield* WorkerHarness.make(worker, { logLevel: "info" })
        const run = yield* harness.submit({})
        run.assertSucceeded()
        expect(seen.some((m) => m.includes("from the handler"))).toBe(true)
        expect(seen.some((m) => m.includes("Delivery settled: outcome=success"))).toBe(true)
        expect(spy).not.toHaveBeenCalled()
      } finally {
        spy.mockRestore()
      }
    }).pipe(
      Effect.provide(
        Logger.layer([Logger.make(({ message }) => seen.push(String(message)))]),
      ),
    ))
})
