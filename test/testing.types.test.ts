/**
 * The harness's types (issue 18): `submit` takes the worker's input as encoded (the `data.body`
 * the platform sends) and a run's `response` has the worker's output type, read back from the
 * wire with its `output` schema. The `@ts-expect-error` lines are checked by `deno check`.
 */
import { describe, expect, expectTypeOf, it } from "@effect/vitest"
import { Context, Effect, Layer, Schema, type Scope } from "effect"
import * as WorkerHarness from "../src/testing.ts"
import * as Worker from "../src/Worker.ts"

const worker = Worker.make({
  name: "typed",
  // Encoded, `count` is a string: the body the platform sends.
  input: Schema.Struct({ text: Schema.String, count: Schema.NumberFromString }),
  // Encoded, `at` is an ISO string: the response the platform receives.
  output: Schema.Struct({ text: Schema.String, at: Schema.DateFromString }),
  timeout: "5 seconds",
  handler: ({ count, text }) =>
    Effect.succeed({ text: text.repeat(count), at: new Date("2026-01-02T03:04:05.000Z") }),
})

describe("the harness's types", () => {
  it("start: submit takes the encoded input, response is the output", async () => {
    await using harness = await WorkerHarness.start(worker)
    expectTypeOf(harness.submit).parameter(0).toEqualTypeOf<
      { readonly text: string; readonly count: string }
    >()
    const run = await harness.submit({ text: "ab", count: "2" })
    run.assertSucceeded()
    expectTypeOf(run.response).toEqualTypeOf<
      { readonly text: string; readonly at: Date } | undefined
    >()
    expect(run.response).toEqual({ text: "abab", at: new Date("2026-01-02T03:04:05.000Z") })
    expect(run.response?.at).toBeInstanceOf(Date)
    // The wire keeps the encoded response.
    const success = run.messages.at(-1)!.data
    expect(success.message_type === "success" && success.response).toEqual({
      text: "abab",
      at: "2026-01-02T03:04:05.000Z",
    })
    const refuse = () => {
      // @ts-expect-error: the decoded input is not what the platform sends
      void harness.submit({ text: "ab", count: 2 })
      // @ts-expect-error: a field the output does not have
      void run.response?.words
    }
    expect(refuse).toBeTypeOf("function")
  })

  it("a body the schema rejects goes through a cast or submitRaw", async () => {
    await using harness = await WorkerHarness.start(worker)
    const run = await harness.submit({ text: "ab" } as never)
    run.assertFailed({ code: "INVALID_INPUT" })
    expect(run.response).toBeUndefined()
    const raw = await harness.submitRaw(
      '{"task_id":"t-raw","data":{"message_type":"submission","body":{"text":1}}}',
    )
    raw.assertFailed({ code: "INVALID_INPUT" })
  })

  it.effect("make: the Effect harness is typed alike", () =>
    Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(worker)
      expectTypeOf(harness).toEqualTypeOf<
        WorkerHarness.WorkerHarness<
          { readonly text: string; readonly count: string },
          { readonly text: string; readonly at: Date }
        >
      >()
      const run = yield* harness.submit({ text: "x", count: "3" })
      expect(run.response?.text).toBe("xxx")
      // A typed harness is still a `WorkerHarness`, as code written before the types has it.
      const untyped: WorkerHarness.WorkerHarness = harness
      expect(untyped).toBe(harness)
    }))

  it("a typed AsyncWorkerHarness is an AsyncWorkerHarness", async () => {
    const harness = await WorkerHarness.start(worker)
    const untyped: WorkerHarness.AsyncWorkerHarness = harness
    const run: WorkerHarness.TaskRun = await untyped.submit({ text: "a", count: "1" })
    run.assertSucceeded()
    await harness.close()
  })

  it("logLevel takes the names of the settings table, not Effect's", async () => {
    expectTypeOf<WorkerHarness.HarnessOptions["logLevel"]>().toEqualTypeOf<
      "debug" | "info" | "warning" | "error" | "critical" | "none" | undefined
    >()
    await using harness = await WorkerHarness.start(worker, { logLevel: "warning" })
    ;(await harness.submit({ text: "a", count: "1" })).assertSucceeded()
    const refuse = () =>
      // @ts-expect-error: Effect's level is what `settingsOverrides.logLevel` takes
      WorkerHarness.start(worker, { logLevel: "Info" })
    expect(refuse).toBeTypeOf("function")
  })

  it("a shared definition keeps its handler's types, and a worker's requirements need the test's layer", async () => {
    class Clock extends Context.Service<Clock, { readonly now: Effect.Effect<number> }>()(
      "types/Clock",
    ) {}
    const shared = Worker.define({
      input: Schema.Struct({ text: Schema.String }),
      output: Schema.Struct({ at: Schema.Number }),
      timeout: "5 seconds",
      handler: (input) => {
        expectTypeOf(input).toEqualTypeOf<{ readonly text: string }>()
        return Effect.gen(function* () {
          const clock = yield* Clock
          return { at: yield* clock.now }
        })
      },
      onIdle: () => undefined,
    })
    const needsClock = Worker.make({ ...shared, name: "needs-clock" })
    expectTypeOf<Worker.Requirements<typeof needsClock>>().toEqualTypeOf<Clock>()
    const fixed = Layer.succeed(Clock, { now: Effect.succeed(7) })
    await using harness = await WorkerHarness.start(needsClock, { layer: fixed })
    expect((await harness.submit({ text: "a" })).response).toEqual({ at: 7 })
    // A worker with its own layer: the test's replaces it, so it must give what that one gives.
    const withClock = Worker.make({
      ...shared,
      name: "with-clock",
      layer: Layer.succeed(Clock, { now: Effect.succeed(1) }),
    })
    expectTypeOf<Worker.Requirements<typeof withClock>>().toEqualTypeOf<never>()
    await using own = await WorkerHarness.start(withClock, { layer: fixed })
    expect((await own.submit({ text: "a" })).response).toEqual({ at: 7 })
    const refuse = () => {
      // @ts-expect-error: the worker requires a Clock, which nothing gives
      void WorkerHarness.start(needsClock)
      // @ts-expect-error: a layer of another service
      void WorkerHarness.start(needsClock, { layer: Layer.empty })
      // @ts-expect-error: the test's layer stands for the definition's, which gave a Clock
      void WorkerHarness.start(withClock, { layer: Layer.empty })
      // @ts-expect-error: likewise for the Effect harness: a Clock is left to the context
      const partial: Effect.Effect<unknown, unknown, Scope.Scope> = WorkerHarness.make(withClock, {
        layer: Layer.empty,
      })
      void partial
    }
    expect(refuse).toBeTypeOf("function")
  })
})
