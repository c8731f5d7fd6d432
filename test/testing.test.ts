import process from "node:process"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Schema } from "effect"
import { FatalError, RetryableError } from "../src/WorkerError.ts"
import * as WorkerHarness from "../src/testing.ts"
import * as Worker from "../src/Worker.ts"

const worker = Worker.make({
  name: "harnessed",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ length: Schema.Number }),
  timeout: "5 seconds",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      if (input.text === "retry") return yield* new RetryableError({ code: "LATER" })
      if (input.text === "") return yield* new FatalError({ code: "EMPTY", message: "Nothing." })
      yield* ctx.progress(0.5)
      return { length: input.text.length }
    }),
})

describe("WorkerHarness", () => {
  it("runs a worker from a plain async test and reports what the platform saw", async () => {
    await using harness = await WorkerHarness.start(worker)
    const run = await harness.submit({ text: "abc" }, {
      taskId: "t-1",
      clientId: "c",
      inputRefs: ["r"],
    })
    run.assertSucceeded()
    expect(run.taskId).toBe("t-1")
    expect(run.messageTypes).toEqual(["started", "progress", "success"])
    expect(run.response).toEqual({ length: 3 })
    expect(run.outcome).toBe("ACKED")
    expect(new TextDecoder().decode(run.raw[2])).toBe(
      `{"task_id":"t-1","data":{"message_type":"success","response":{"length":3}}}`,
    )
    expect(() => run.assertFailed()).toThrow(/Expected the task to fail/)
  })

  it("assertFailed checks the code, assertSucceeded throws on a failure", async () => {
    await using harness = await WorkerHarness.start(worker)
    const run = await harness.submit({ text: "" })
    run.assertFailed({ code: "EMPTY" })
    expect(run.error).toEqual({ code: "EMPTY", message: "Nothing." })
    expect(() => run.assertFailed({ code: "OTHER" })).toThrow(/Expected failure code OTHER/)
    expect(() => run.assertSucceeded()).toThrow(/Expected the task to succeed/)
  })

  it("a retry before the last attempt is NACKED_REQUEUE with nothing terminal; at the last, it concludes", async () => {
    await using harness = await WorkerHarness.start(worker)
    const first = await harness.submit({ text: "retry" })
    expect(first.outcome).toBe("NACKED_REQUEUE")
    expect(first.messageTypes).toEqual(["started"])
    const last = await harness.submit({ text: "retry" }, { deliveryCount: 4 })
    last.assertFailed({ code: "LATER" })
  })

  it("submitRaw runs poison through the engine: acked, nothing published", async () => {
    await using harness = await WorkerHarness.start(worker)
    const run = await harness.submitRaw("not json")
    expect(run.outcome).toBe("ACKED")
    expect(run.messages).toEqual([])
  })

  it("failNextPublish: the refused terminal publish is retried, then the task concludes", async () => {
    await using harness = await WorkerHarness.start(worker)
    await harness.failNextPublish("success")
    const run = await harness.submit({ text: "abc" })
    run.assertSucceeded()
    expect(run.messageTypes).toEqual(["started", "progress", "success"])
  })

  it("submitRaw reports the task id the bytes carry, and only that task's messages", async () => {
    await using harness = await WorkerHarness.start(worker)
    const envelope = `{"task_id":"t-raw","data":{"message_type":"submission","body":{"text":"ab"}}}`
    const run = await harness.submitRaw(envelope)
    expect(run.taskId).toBe("t-raw")
    run.assertSucceeded()
    const invalid = await harness.submitRaw(`{"task_id":"t-bad","data":{}}`)
    expect(invalid.taskId).toBe("t-bad")
    invalid.assertFailed({ code: "INVALID_MESSAGE" })
    expect((await harness.submitRaw("[]")).taskId).toBeUndefined()
  })

  it("reads no environment: only its overrides and the defaults count", async () => {
    const saved = { in: process.env.IN_QUEUE_NAME, timeout: process.env.WORKER_TASK_TIMEOUT_S }
    process.env.IN_QUEUE_NAME = "from-the-environment"
    process.env.WORKER_TASK_TIMEOUT_S = "0.001"
    try {
      await using harness = await WorkerHarness.start(worker)
      const run = await harness.submit({ text: "abc" })
      run.assertSucceeded()
      const settings = await Effect.runPromise(
        Effect.scoped(Effect.map(WorkerHarness.make(worker), (h) => h.settings)),
      )
      expect(settings.inQueue).toBe("harnessed_queue_in")
      expect(Duration.toMillis(settings.taskTimeout)).toBe(5000)
    } finally {
      for (
        const [key, value] of [["IN_QUEUE_NAME", saved.in], [
          "WORKER_TASK_TIMEOUT_S",
          saved.timeout,
        ]]
      ) {
        if (value === undefined) delete process.env[key!]
        else process.env[key!] = value
      }
    }
  })

  it.effect("overriding only the backoff base keeps the production maximum", () =>
    Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(worker, {
        settingsOverrides: { retryBackoffBase: "2 millis" },
      })
      expect(Duration.toMillis(harness.settings.retryBackoffBase)).toBe(2)
      expect(Duration.toMillis(harness.settings.retryBackoffMax)).toBe(60_000)
    }))
})
