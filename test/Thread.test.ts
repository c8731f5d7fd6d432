/**
 * Threaded handlers through the test harness: a real thread of the worker's pool for each task,
 * on Node and Deno alike (the suite runs on both). Real time, bounded: the work is a thread's.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, References, Schema } from "effect"
import process from "node:process"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as WorkerHarness from "../src/testing.ts"
import * as Thread from "../src/Thread.ts"
import * as Transient from "../src/Transient.ts"
import * as Worker from "../src/Worker.ts"
import { WorkerDefinitionError } from "../src/WorkerError.ts"
import { withLogs } from "./support/logs.ts"

const MODULE = new URL("./fixtures/threads/handlers.mjs", import.meta.url)
const Input = Schema.Struct({ text: Schema.String, ms: Schema.optional(Schema.Number) })
const Output = Schema.Struct({ words: Schema.Number, thread: Schema.optional(Schema.Number) })

const threaded = (
  exportName: string,
  options: {
    readonly timeout?: Duration.Input
    readonly thread?: Thread.ThreadOptions
    readonly retryOn?: ReadonlyArray<Transient.Rule>
  } = {},
) =>
  Worker.make({
    name: "threads",
    input: Input,
    output: Output,
    timeout: options.timeout ?? "20 seconds",
    retryOn: options.retryOn,
    handler: Thread.handler<typeof Input.Type, typeof Output.Type>(
      MODULE,
      exportName,
      options.thread,
    ),
  })

describe("Thread.handler", () => {
  it.effect(
    "runs the module's function on a thread: its output, progress and log lines reach the worker",
    () =>
      withLogs(({ lines }) =>
        Effect.gen(function* () {
          const harness = yield* WorkerHarness.make(threaded("count"), { logLevel: "info" })
          const run = yield* harness.submit({ text: "one two three" }, { taskId: "t-count" })
          run.assertSucceeded()
          expect(run.response?.words).toBe(3)
          // Not the main thread's id (0).
          expect(run.response?.thread).toBeGreaterThan(0)
          expect(run.messageTypes).toEqual(["started", "progress", "success"])
          expect(run.messages[1]!.data).toMatchObject({
            progress: 0.5,
            response: { stage: "counting" },
          })
          const logged = lines.find((l) => l.message === "counting on a thread")
          expect(logged?.annotations).toMatchObject({ task_id: "t-count", words_so_far: 0 })
        })
      ),
    30_000,
  )

  it.effect(
    "reuses its threads between tasks, and replaces one after maxTasks",
    () =>
      Effect.gen(function* () {
        const reused = yield* WorkerHarness.make(threaded("count"))
        const a = yield* reused.submit({ text: "a" })
        const b = yield* reused.submit({ text: "b" })
        expect(b.response?.thread).toBe(a.response?.thread)
        const recycled = yield* WorkerHarness.make(threaded("count", { thread: { maxTasks: 1 } }))
        const c = yield* recycled.submit({ text: "c" })
        const d = yield* recycled.submit({ text: "d" })
        c.assertSucceeded()
        d.assertSucceeded()
        expect(d.response?.thread).not.toBe(c.response?.thread)
      }),
    30_000,
  )

  it.effect(
    "a FatalError or RetryableError thrown on the thread keeps its meaning; anything else is INTERNAL_ERROR",
    () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(threaded("fails"))
        const fatal = yield* harness.submit({ text: "fatal" })
        fatal.assertFailed({ code: "EMPTY_TEXT" })
        expect(fatal.error?.message).toBe("Nothing.")
        const retry = yield* harness.submit({ text: "retry" })
        expect(retry.outcome).toBe("REJECTED_REQUEUE")
        const last = yield* harness.submit({ text: "retry" }, { deliveryCount: 4 })
        last.assertFailed({ code: "UPSTREAM" })
        const bug = yield* harness.submit({ text: "bug" })
        bug.assertFailed({ code: "INTERNAL_ERROR" })
        expect(bug.error?.message).toBe("The worker failed while running the task.")
      }),
    30_000,
  )

  it.effect(
    "a thread's ordinary error reaches retryOn rebuilt: an ECONNRESET retried, a TypeError not",
    () =>
      Effect.gen(function* () {
        const seen: Array<unknown> = []
        const record = (error: unknown) => {
          seen.push(error)
          return false
        }
        const harness = yield* WorkerHarness.make(
          threaded("transient", {
            retryOn: [record, Transient.network, Transient.httpStatus()],
          }),
        )
        for (const text of ["reset", "fetch", "busy"]) {
          expect((yield* harness.submit({ text })).outcome, text).toBe("REJECTED_REQUEUE")
        }
        const bug = yield* harness.submit({ text: "bug" })
        bug.assertFailed({ code: "INTERNAL_ERROR" })
        const [reset, fetched, busy, bugged] = seen as Array<Record<string, unknown>>
        expect(reset).toBeInstanceOf(Error)
        expect(reset).toMatchObject({ message: "read ECONNRESET", code: "ECONNRESET", errno: -104 })
        expect(fetched).toBeInstanceOf(TypeError)
        expect(fetched).toMatchObject({ message: "fetch failed", cause: { code: "ECONNRESET" } })
        expect(busy).toMatchObject({ status: 503, headers: { "retry-after": "2" } })
        expect(Transient.httpStatus()(busy)).toEqual(Duration.seconds(2))
        expect(bugged).toBeInstanceOf(TypeError)
        expect(bugged).toMatchObject({ message: "a bug on a thread" })
      }),
    30_000,
  )

  it.effect(
    "a handler that never yields: TASK_TIMEOUT within its timeout and a second, its thread replaced, the next task served",
    () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(threaded("forever", { timeout: "2 seconds" }))
        const before = yield* harness.submit({ text: "x" })
        const started = Date.now()
        const run = yield* harness.submit({ text: "loop" })
        run.assertFailed({ code: "TASK_TIMEOUT" })
        expect(Date.now() - started).toBeLessThan(3_000)
        const next = yield* harness.submit({ text: "x" })
        next.assertSucceeded()
        expect(next.response?.thread).not.toBe(before.response?.thread)
      }),
    30_000,
  )

  // Deno 2.9 takes `resourceLimits` but did not stop this thread past its cap within 20 s: the docs
  // say that only the container's limit holds there.
  it.effect.skipIf(process.versions.deno !== undefined)(
    "a thread past its memory cap fails its task alone, THREAD_OUT_OF_MEMORY; the pool replaces it",
    () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(threaded("hog", { thread: { maxMemoryMb: 32 } }))
        const before = yield* harness.submit({ text: "x" })
        const run = yield* harness.submit({ text: "hog" })
        run.assertFailed({ code: "THREAD_OUT_OF_MEMORY" })
        const after = yield* harness.submit({ text: "x" })
        after.assertSucceeded()
        expect(after.response?.thread).not.toBe(before.response?.thread)
      }),
    60_000,
  )

  it.live(
    "a thread that exits fails its task alone, THREAD_EXITED; one that exits while idle is not handed the next task",
    () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(threaded("exits", { timeout: "5 seconds" }))
        const run = yield* harness.submit({ text: "exit" })
        run.assertFailed({ code: "THREAD_EXITED" })
        const later = yield* harness.submit({ text: "later" })
        later.assertSucceeded()
        // Its thread exits, idle, a moment after: the next task runs on another, at once.
        yield* Effect.sleep("300 millis")
        const started = Date.now()
        const next = yield* harness.submit({ text: "x" })
        next.assertSucceeded()
        expect(next.response?.thread).not.toBe(later.response?.thread)
        expect(Date.now() - started).toBeLessThan(4_000)
      }),
    30_000,
  )

  it.live(
    "what a finished task's timer reports on its thread is not the next task's",
    () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(threaded("leaky"))
        const leak = yield* harness.submit({ text: "leak" })
        const next = yield* harness.submit({ text: "x" })
        expect(next.response?.thread).toBe(leak.response?.thread)
        expect(next.messageTypes).toEqual(["started", "success"])
      }),
    30_000,
  )

  // Each case's thread dies while a task runs on the other thread of the pool (concurrency 2):
  // only its own task fails, with the death's code; the neighbour succeeds on its thread, and a
  // task after them is served. Sequential submits elsewhere in this file cannot show "alone".
  it.live.each([
    ["exit", "THREAD_EXITED"],
    ["crash", "THREAD_CRASHED"],
    // Deno does not stop a thread past its cap (above).
    ...(process.versions.deno === undefined ? [["hog", "THREAD_OUT_OF_MEMORY"]] : []),
  ])(
    "a thread that dies (%s) fails its own task alone, %s; the task on the other thread succeeds",
    ([text, code]) =>
      Effect.gen(function* () {
        const worker = Worker.make({
          name: "threads",
          input: Input,
          output: Output,
          timeout: "20 seconds",
          concurrency: 2,
          handler: Thread.handler<typeof Input.Type, typeof Output.Type>(MODULE, "beside", {
            maxMemoryMb: 32,
          }),
        })
        yield* Effect.scoped(Effect.gen(function* () {
          const broker = Context.get(
            yield* Layer.build(Worker.layerMemory(worker)),
            MemoryBroker.MemoryBroker,
          )
          const publish = (taskId: string, body: object) =>
            broker.publish(
              "threads_queue_in",
              JSON.stringify({ task_id: taskId, data: { message_type: "submission", body } }),
            ).pipe(Effect.orDie)
          const out = Effect.map(
            broker.published("threads_queue_out"),
            (all) => all.map((m) => JSON.parse(new TextDecoder().decode(m.body))),
          )
          const until = (what: string, done: (all: Array<any>) => boolean) =>
            Effect.gen(function* () {
              for (let i = 0; i < 500; i++) {
                const all = yield* out
                if (done(all)) return all
                yield* Effect.sleep("20 millis")
              }
              throw new Error(`Timed out waiting for ${what}: ${JSON.stringify(yield* out)}`)
            })
          const terminalOf = (all: Array<any>, taskId: string) =>
            all.find((m) =>
              m.task_id === taskId &&
              (m.data.message_type === "success" || m.data.message_type === "failure")
            )
          yield* publish("t-neighbour", { text: "work", ms: 3_000 })
          // Its thread computes before the other task is published.
          yield* until(
            "the neighbour's start",
            (all) => all.some((m) => m.task_id === "t-neighbour"),
          )
          yield* publish("t-dies", { text })
          const died = yield* until("the dying task's end", (all) => !!terminalOf(all, "t-dies"))
          // Concluded while the neighbour still computes, with the death's own code.
          expect(terminalOf(died, "t-neighbour")).toBeUndefined()
          expect(terminalOf(died, "t-dies").data).toMatchObject({
            message_type: "failure",
            error_message: { code },
          })
          const both = yield* until(
            "the neighbour's end",
            (all) => !!terminalOf(all, "t-neighbour"),
          )
          const neighbour = terminalOf(both, "t-neighbour")
          expect(neighbour.data).toMatchObject({ message_type: "success", response: { words: 1 } })
          expect(both.filter((m) => m.task_id === "t-neighbour").map((m) => m.data.message_type))
            .toEqual(["started", "success"])
          // The pool serves the next task.
          yield* publish("t-next", { text: "work", ms: 0 })
          const next = terminalOf(
            yield* until("the next task", (all) => !!terminalOf(all, "t-next")),
            "t-next",
          )
          expect(next.data).toMatchObject({ message_type: "success", response: { words: 1 } })
        }))
      }).pipe(Effect.provideService(References.MinimumLogLevel, "Error")),
    60_000,
  )

  it("a relative module path, or an invalid option, is a definition error at once", () => {
    expect(() => Thread.handler("./score.ts")).toThrow(WorkerDefinitionError)
    expect(() => Thread.handler(MODULE, "count", { maxTasks: 0 })).toThrow(/maxTasks/)
  })

  it.effect(
    "a module without the export fails the worker's start, naming the module and the export",
    () =>
      Effect.gen(function* () {
        const exit = yield* Effect.exit(WorkerHarness.make(threaded("notAFunction")))
        expect(exit._tag).toBe("Failure")
        expect(String(exit)).toContain('it has no function named "notAFunction"')
      }),
    30_000,
  )

  it.live(
    "runs in an Effect app's layer (Worker.layerMemory), its threads ended with the layer",
    () =>
      Effect.gen(function* () {
        yield* Effect.scoped(Effect.gen(function* () {
          const broker = Context.get(
            yield* Layer.build(Worker.layerMemory(threaded("count"))),
            MemoryBroker.MemoryBroker,
          )
          yield* broker.publish(
            "threads_queue_in",
            `{"task_id":"t-1","data":{"message_type":"submission","body":{"text":"a b"}}}`,
          ).pipe(Effect.orDie)
          let success: unknown
          for (let i = 0; i < 200 && success === undefined; i++) {
            yield* Effect.sleep("20 millis")
            success = (yield* broker.published("threads_queue_out"))
              .map((m) => JSON.parse(new TextDecoder().decode(m.body)))
              .find((m) => m.data.message_type === "success")
          }
          expect(success).toMatchObject({ data: { response: { words: 2 } } })
        }))
      }).pipe(Effect.provideService(References.MinimumLogLevel, "Warn")),
    30_000,
  )
})
