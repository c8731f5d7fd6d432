// Imports the BUILT package by its name, as an npm user would, and runs a worker through the
// harness: proves that dist/, the exports map and the peer dependency on effect fit together.
import assert from "node:assert/strict"
import { test } from "node:test"
import { Effect, Schema } from "effect"
import { FatalError, Worker } from "@async-task/worker"
import { decodeEnvelope, encodeMessage } from "@async-task/worker/protocol"
import * as WorkerHarness from "@async-task/worker/testing"

const worker = Worker.make({
  name: "smoke",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ words: Schema.Number }),
  timeout: "5 seconds",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      yield* ctx.progress(0.5)
      if (!input.text.trim()) {
        return yield* new FatalError({ code: "EMPTY_TEXT", message: "Nothing to count." })
      }
      return { words: input.text.trim().split(/\s+/).length }
    }),
})

test("a worker from the built package succeeds through the harness", async () => {
  const harness = await WorkerHarness.start(worker)
  try {
    const run = await harness.submit({ text: "one two three" })
    run.assertSucceeded()
    assert.deepEqual(run.response, { words: 3 })
    assert.deepEqual(run.messageTypes, ["started", "progress", "success"])
    assert.equal(run.outcome, "ACKED")
  } finally {
    await harness.close()
  }
})

test("a FatalError from the built package concludes the task", async () => {
  const harness = await WorkerHarness.start(worker)
  try {
    const run = await harness.submit({ text: "  " })
    run.assertFailed({ code: "EMPTY_TEXT" })
    assert.throws(() => run.assertSucceeded())
  } finally {
    await harness.close()
  }
})

test("an async handler from the built package", async () => {
  const asyncWorker = Worker.make({
    name: "smoke-async",
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ double: Schema.Number }),
    timeout: "5 seconds",
    handler: async (input, ctx) => {
      await ctx.progress(0.1)
      return { double: input.n * 2 }
    },
  })
  const harness = await WorkerHarness.start(asyncWorker)
  try {
    const run = await harness.submit({ n: 21 })
    run.assertSucceeded()
    assert.deepEqual(run.response, { double: 42 })
  } finally {
    await harness.close()
  }
})

test("the protocol subpath encodes and decodes", () => {
  const bytes = encodeMessage({ type: "started", task_id: "t-1", hostname: "pod-a" })
  assert.equal(
    new TextDecoder().decode(bytes),
    '{"task_id":"t-1","data":{"message_type":"started","hostname":"pod-a"}}',
  )
  assert.equal(decodeEnvelope(new TextEncoder().encode("[1]"))._tag, "Poison")
})

test("a definition error is a WorkerDefinitionError", () => {
  assert.throws(
    () =>
      Worker.make({
        name: "",
        input: Schema.String,
        output: Schema.String,
        timeout: "1 second",
        handler: () => Effect.void,
      }),
    (error) => error._tag === "WorkerDefinitionError",
  )
})
