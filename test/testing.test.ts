import process from "node:process"
import { describe, expect, it, vi } from "@effect/vitest"
import {
  Clock,
  Context,
  Duration,
  Effect,
  Exit,
  Layer,
  Logger,
  type LogLevel,
  Schema,
} from "effect"
import { TestClock } from "effect/testing"
import { FatalError, RetryableError } from "../src/WorkerError.ts"
import * as WorkerHarness from "../src/testing.ts"
import * as Transient from "../src/Transient.ts"
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
      if (input.text === "crash") return yield* Effect.die(new Error("the handler's defect"))
      if (input.text === "log") {
        yield* Effect.logDebug("from the handler, at debug")
        ctx.logger.warn("from ctx.logger, at warning")
      }
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

  it.effect("gives each message the id its copies share: task, attempt, delivery, type, a progress's number", () =>
    Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(worker)
      yield* harness.submit({ text: "abc" }, { taskId: "t-1" })
      yield* harness.submit({ text: "retry" }, { taskId: "t-2", deliveryCount: 2 })
      const ids = (yield* harness.broker.published(harness.settings.outQueue))
        .map((m) => m.messageId!)
      const [first, second] = [ids[0]!.split(":")[2]!, ids[3]!.split(":")[2]!]
      expect(first).toMatch(/^[0-9a-z]{8}$/)
      expect(second).not.toBe(first)
      expect(ids).toEqual([
        `t-1:1:${first}:started`,
        `t-1:1:${first}:progress:1`,
        `t-1:1:${first}:success`,
        `t-2:3:${second}:started`,
      ])
    }))

  describe("a definition's layer", () => {
    class Greeting
      extends Context.Service<Greeting, { readonly word: string }>()("test/Greeting") {}
    const greeter = (layer: Layer.Layer<Greeting, unknown>) =>
      Worker.make({
        name: "greeter",
        input: Schema.Struct({ name: Schema.String }),
        output: Schema.Struct({ text: Schema.String }),
        timeout: "5 seconds",
        handler: ({ name }) => Effect.map(Greeting, ({ word }) => ({ text: `${word}, ${name}` })),
        layer,
      })

    it("is built for the handler, as every runner builds it", async () => {
      const built: Array<string> = []
      const layer = Layer.effect(
        Greeting,
        Effect.acquireRelease(
          Effect.sync(() => {
            built.push("built")
            return Greeting.of({ word: "Hello" })
          }),
          () => Effect.sync(() => void built.push("released")),
        ),
      )
      const harness = await WorkerHarness.start(greeter(layer))
      const run = await harness.submit({ name: "Ada" })
      run.assertSucceeded()
      expect(run.response).toEqual({ text: "Hello, Ada" })
      expect((await harness.submit({ name: "Alan" })).response).toEqual({ text: "Hello, Alan" })
      await harness.close()
      expect(built).toEqual(["built", "released"])
    })

    it("a plain function that throws Effect's words for a missing service: the task's error", async () => {
      const thrower = Worker.make({
        name: "thrower",
        input: Schema.Struct({}),
        output: Schema.Struct({}),
        timeout: "5 seconds",
        handler: () => {
          throw new Error("Service not found: payments")
        },
      })
      await using harness = await WorkerHarness.start(thrower)
      const run = await harness.submit({})
      run.assertFailed({ code: "INTERNAL_ERROR" })
      expect(run.outcome).toBe("ACKED")
    })

    it.effect("that cannot be built fails the harness with a ServicesError", () =>
      Effect.gen(function* () {
        const exit = yield* Effect.exit(
          Effect.scoped(
            WorkerHarness.make(greeter(Layer.effect(Greeting, Effect.fail("no database")))),
          ),
        )
        expect(Exit.isFailure(exit) && exit.cause.reasons[0]).toMatchObject({
          error: { _tag: "ServicesError", cause: "no database" },
        })
      }))
  })

  it("assertFailed checks the code, assertSucceeded throws on a failure", async () => {
    await using harness = await WorkerHarness.start(worker)
    const run = await harness.submit({ text: "" })
    run.assertFailed({ code: "EMPTY" })
    expect(run.error).toEqual({ code: "EMPTY", message: "Nothing." })
    expect(() => run.assertFailed({ code: "OTHER" })).toThrow(/Expected failure code OTHER/)
    expect(() => run.assertSucceeded()).toThrow(/Expected the task to succeed/)
    // The error a test meets is the harness's own, exported for it to catch.
    expect(() => run.assertSucceeded()).toThrow(WorkerHarness.HarnessAssertionError)
  })

  it("a retry before the last attempt is REJECTED_REQUEUE with nothing terminal; at the last, it concludes", async () => {
    await using harness = await WorkerHarness.start(worker)
    const first = await harness.submit({ text: "retry" })
    expect(first.outcome).toBe("REJECTED_REQUEUE")
    expect(first.messageTypes).toEqual(["started"])
    const last = await harness.submit({ text: "retry" }, { deliveryCount: 4 })
    last.assertFailed({ code: "LATER" })
  })

  it("a definition's retryOn, as a user tests it: an ECONNRESET retried, then RETRY_EXHAUSTED; a TypeError not", async () => {
    /** `fetch` as it fails on Node when the server resets the connection. */
    const resetFetch = (_url: string): Promise<string> =>
      Promise.reject(
        new TypeError("fetch failed", {
          cause: Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }),
        }),
      )
    const fetching = Worker.make({
      name: "fetching",
      input: Schema.Struct({ url: Schema.String }),
      output: Schema.Struct({ length: Schema.Number }),
      timeout: "5 seconds",
      retryOn: Transient.network,
      handler: async ({ url }) => {
        if (url === "bug") throw new TypeError("url.trim is not a function")
        return { length: (await resetFetch(url)).length }
      },
    })
    await using harness = await WorkerHarness.start(fetching)
    const first = await harness.submit({ url: "https://example.org" })
    expect(first.outcome).toBe("REJECTED_REQUEUE")
    const last = await harness.submit({ url: "https://example.org" }, { deliveryCount: 4 })
    last.assertFailed({ code: "RETRY_EXHAUSTED" })
    const bug = await harness.submit({ url: "bug" })
    bug.assertFailed({ code: "INTERNAL_ERROR" })
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

  describe("its log", () => {
    /** The lines a test's own logger receives, by level and message. */
    const captured = <A, E, R>(
      body: (lines: Array<readonly [LogLevel.LogLevel, string]>) => Effect.Effect<A, E, R>,
    ) => {
      const lines: Array<readonly [LogLevel.LogLevel, string]> = []
      return body(lines).pipe(
        Effect.provide(
          Logger.layer([
            Logger.make(({ logLevel, message }) =>
              void lines.push([logLevel, [message].flat().map(String).join(" ")])
            ),
          ]),
        ),
      )
    }
    const submitAll = (harness: WorkerHarness.WorkerHarness<{ readonly text: string }>) =>
      Effect.forEach(["abc", "", "retry", "crash", "log"], (text) => harness.submit({ text }))

    it.effect("is quiet by default: not a line, whatever the tasks do", () =>
      captured((lines) =>
        Effect.gen(function* () {
          const runs = yield* submitAll(yield* WorkerHarness.make(worker))
          expect(runs.map((run) => run.messageTypes.at(-1))).toEqual([
            "success",
            "failure",
            "started",
            "failure",
            "success",
          ])
          expect(lines).toEqual([])
        })
      ))

    it("WorkerHarness.start prints nothing by default", async () => {
      const spies = (["log", "info", "warn", "error", "debug"] as const).map((method) =>
        vi.spyOn(console, method)
      )
      try {
        await using harness = await WorkerHarness.start(worker)
        for (const text of ["abc", "crash", "log"]) await harness.submit({ text })
        for (const spy of spies) expect(spy).not.toHaveBeenCalled()
      } finally {
        for (const spy of spies) spy.mockRestore()
      }
    })

    it.effect("logLevel as LOG_LEVEL spells it: the lines at that level and above", () =>
      captured((lines) =>
        Effect.gen(function* () {
          const at = (logLevel: NonNullable<WorkerHarness.HarnessOptions["logLevel"]>) =>
            Effect.gen(function* () {
              lines.length = 0
              yield* submitAll(yield* WorkerHarness.make(worker, { logLevel }))
              return lines.map(([level]) => level)
            })
          const info = yield* at("info")
          expect(lines.filter(([, m]) => m.startsWith("Delivery settled:"))).toHaveLength(5)
          expect(info.filter((level) => level === "Error")).toHaveLength(1)
          expect(lines.some(([, m]) => m === "from ctx.logger, at warning")).toBe(true)
          expect(info).not.toContain("Debug")
          expect(yield* at("debug")).toContain("Debug")
          expect(new Set(yield* at("warning"))).toEqual(new Set(["Warn", "Error"]))
          // An unexpected error's line, with its message: what a failing test needs to be read.
          expect(yield* at("error")).toEqual(["Error"])
          expect(yield* at("critical")).toEqual([])
          expect(yield* at("none")).toEqual([])
        })
      ))

    it.effect("every name of the settings table, read as LOG_LEVEL is", () =>
      Effect.gen(function* () {
        const names = {
          debug: "Debug",
          info: "Info",
          warning: "Warn",
          error: "Error",
          critical: "Fatal",
          none: "None",
        } as const
        for (const [logLevel, level] of Object.entries(names)) {
          const harness = yield* WorkerHarness.make(worker, {
            logLevel: logLevel as keyof typeof names,
          })
          expect(harness.settings.logLevel).toBe(level)
        }
        expect((yield* WorkerHarness.make(worker)).settings.logLevel).toBe("None")
        // From JavaScript, a name the table does not know fails as LOG_LEVEL would.
        const error = yield* Effect.flip(
          WorkerHarness.make(worker, { logLevel: "verbose" as "info" }),
        )
        expect(error.message).toContain("must be debug, info, warning, error, critical or none")
      }))

    it.effect("settingsOverrides.logLevel, Effect's level, is honoured too; logLevel wins", () =>
      captured((lines) =>
        Effect.gen(function* () {
          const none = yield* WorkerHarness.make(worker, {
            settingsOverrides: { logLevel: "None" },
          })
          yield* none.submit({ text: "abc" })
          expect(lines).toEqual([])
          const info = yield* WorkerHarness.make(worker, {
            settingsOverrides: { logLevel: "Info" },
          })
          yield* info.submit({ text: "abc" })
          expect(lines.map(([, m]) => m)).toEqual([
            expect.stringMatching(/^Delivery settled: outcome=success/),
          ])
          const both = yield* WorkerHarness.make(worker, {
            logLevel: "none",
            settingsOverrides: { logLevel: "Info" },
          })
          expect(both.settings.logLevel).toBe("None")
        })
      ))
  })
})

/** A service the handler below requires: a directory of users. */
class Directory extends Context.Service<Directory, {
  readonly nameOf: (id: string) => Effect.Effect<string>
}>()("test/Directory") {}

/** A definition written apart from `make`, as a worker and its tests share it. */
const greeting = Worker.define({
  input: Schema.Struct({ id: Schema.String }),
  output: Schema.Struct({ greeting: Schema.String }),
  timeout: "5 seconds",
  // Typed by `define`: `input.id` is a string, the Effect requires the Directory.
  handler: (input) =>
    Effect.gen(function* () {
      const directory = yield* Directory
      return { greeting: `Hello, ${yield* directory.nameOf(input.id)}` }
    }),
  onIdle: Effect.void,
})

const fakeDirectory = Layer.succeed(Directory, {
  nameOf: (id) => Effect.succeed(`fake ${id}`),
})

describe("a harness given the services of the test", () => {
  it("provides a worker's requirements: a worker made without its layer", async () => {
    const worker = Worker.make({ ...greeting, name: "greeting" })
    await using harness = await WorkerHarness.start(worker, { layer: fakeDirectory })
    const run = await harness.submit({ id: "ada" })
    run.assertSucceeded()
    expect(run.response).toEqual({ greeting: "Hello, fake ada" })
  })

  it("replaces the definition's own layer, which is never built", async () => {
    let built = 0
    const live = Layer.effect(Directory)(Effect.sync(() => {
      built++
      return { nameOf: (id: string) => Effect.succeed(`live ${id}`) }
    }))
    const worker = Worker.make({ ...greeting, name: "greeting", layer: live })
    await using harness = await WorkerHarness.start(worker, { layer: fakeDirectory })
    const run = await harness.submit({ id: "ada" })
    expect(run.response).toEqual({ greeting: "Hello, fake ada" })
    expect(built).toBe(0)
    // Without the test's layer, the definition's own is the one built.
    await using own = await WorkerHarness.start(worker)
    expect((await own.submit({ id: "ada" })).response).toEqual({ greeting: "Hello, live ada" })
    expect(built).toBe(1)
  })

  it.effect("make: the test's layer takes the service out of the harness's requirements", () =>
    Effect.gen(function* () {
      const worker = Worker.make({ ...greeting, name: "greeting" })
      const harness = yield* WorkerHarness.make(worker, { layer: fakeDirectory })
      const run = yield* harness.submit({ id: "grace" })
      expect(run.response).toEqual({ greeting: "Hello, fake grace" })
    }).pipe(Effect.scoped))
})

describe("a task's deadline and worker id", () => {
  it.effect("ctx.deadline is when its time limit ends; ctx.workerId is HOSTNAME and the process id", () =>
    Effect.gen(function* () {
      const seen: Array<{ now: number; deadline: number; workerId: string }> = []
      const timed = Worker.make({
        name: "deadline",
        input: Schema.Struct({}),
        output: Schema.Struct({}),
        timeout: "90 seconds",
        handler: (_, ctx) =>
          Effect.map(Clock.currentTimeMillis, (now) => {
            seen.push({ now, deadline: ctx.deadline, workerId: ctx.workerId })
            return {}
          }),
      })
      yield* TestClock.adjust("1 hour")
      const harness = yield* WorkerHarness.make(timed, {
        clock: "ambient",
        settingsOverrides: { hostname: "count-words-7d9f" },
      })
      ;(yield* harness.submit({})).assertSucceeded()
      // WORKER_TASK_TIMEOUT_S wins over the definition's, and so moves the deadline.
      const shorter = yield* WorkerHarness.make(timed, {
        clock: "ambient",
        settingsOverrides: { taskTimeout: "10 seconds" },
      })
      ;(yield* shorter.submit({})).assertSucceeded()
      expect(seen.map(({ deadline, now }) => deadline - now)).toEqual([90_000, 10_000])
      expect(seen[0]!.now).toBe(3_600_000)
      expect(seen[0]!.workerId).toBe(`count-words-7d9f:${process.pid}`)
    }).pipe(Effect.scoped))

  it("a context made to call a handler directly has no deadline unless given one", () => {
    expect(WorkerHarness.makeTaskContext().ctx.deadline).toBe(Number.POSITIVE_INFINITY)
    const { ctx } = WorkerHarness.makeTaskContext({ deadline: 1_000, workerId: "w-1" })
    expect([ctx.deadline, ctx.workerId]).toEqual([1_000, "w-1"])
  })
})
