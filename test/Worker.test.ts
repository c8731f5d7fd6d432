import { describe, expect, it } from "@effect/vitest"
import { Config, ConfigProvider, Context, Duration, Effect, Fiber, Layer, References } from "effect"
import { TestClock } from "effect/testing"
import * as Net from "node:net"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as Probes from "../src/Probes.ts"
import * as Settings from "../src/Settings.ts"
import * as WorkerHarness from "../src/testing.ts"
import type * as Lifecycle from "../src/Lifecycle.ts"
import * as Worker from "../src/Worker.ts"
import { memoryEnvironment } from "./support/environment.ts"
import * as Transient from "../src/Transient.ts"
import { RetryableError, WorkerDefinitionError } from "../src/WorkerError.ts"
import { envelope, textOf, wireOf } from "./support/builders.ts"
import { countWords, Text, Words } from "./support/countWords.ts"

const valid: Worker.WorkerDefinition<
  typeof Text.Type,
  typeof Text.Encoded,
  typeof Words.Type,
  never
> = {
  name: "count-words",
  input: Text,
  output: Words,
  timeout: "30 seconds",
  handler: ({ text }) => Effect.succeed({ words: countWords(text) }),
}

/** `valid` with some fields replaced, whatever their types. */
const definition = (
  changes: globalThis.Record<string, unknown>,
): Worker.WorkerDefinition<any, any, any, never> =>
  ({ ...valid, ...changes }) as unknown as Worker.WorkerDefinition<any, any, any, never>

const environment = memoryEnvironment

/** The messages on the output queue, decoded. */
const outbound = Effect.gen(function* () {
  const broker = yield* MemoryBroker.MemoryBroker
  const settings = yield* Settings.Settings
  const messages = yield* broker.published(settings.outQueue)
  return messages.map((m) => wireOf(m.body))
})

/** Steps the TestClock by `step` until `check` holds, at most `limit` steps. */
const stepUntil = (
  check: Effect.Effect<boolean, never, MemoryBroker.MemoryBroker | Settings.Settings>,
  step: Duration.Input,
  limit: number,
) =>
  Effect.gen(function* () {
    for (let i = 0; i < limit; i++) {
      if (yield* check) return i
      yield* TestClock.adjust(step)
    }
    return yield* Effect.die(new Error("the condition never held"))
  })

describe("Worker", () => {
  describe("definition errors", () => {
    const cases: ReadonlyArray<readonly [string, globalThis.Record<string, unknown>, string]> = [
      [
        "no name",
        { name: undefined },
        "The worker needs a name of letters, digits, '.', '_' or '-' (at most 200 characters), such as \"count-words\".",
      ],
      [
        "a name with a space",
        { name: "count words" },
        "The worker needs a name of letters, digits, '.', '_' or '-' (at most 200 characters), such as \"count-words\".",
      ],
      [
        "a name of 201 characters",
        { name: "w".repeat(201) },
        "The worker needs a name of letters, digits, '.', '_' or '-' (at most 200 characters), such as \"count-words\".",
      ],
      [
        "a timeout that is not a duration",
        { timeout: "soon" },
        'The worker "count-words" needs a finite, positive timeout, such as "30 seconds".',
      ],
      [
        "a zero timeout",
        { timeout: "0 seconds" },
        'The worker "count-words" needs a finite, positive timeout, such as "30 seconds".',
      ],
      [
        "a negative timeout",
        { timeout: -5 },
        'The worker "count-words" needs a finite, positive timeout, such as "30 seconds".',
      ],
      [
        "an infinite timeout",
        { timeout: Duration.infinity },
        'The worker "count-words" needs a finite, positive timeout, such as "30 seconds".',
      ],
      [
        "no timeout",
        { timeout: undefined },
        'The worker "count-words" needs a finite, positive timeout, such as "30 seconds".',
      ],
      [
        "an input that is not a Schema",
        { input: { text: "string" } },
        'The worker "count-words" needs an input Schema.',
      ],
      [
        "an output that is not a Schema",
        { output: undefined },
        'The worker "count-words" needs an output Schema.',
      ],
      [
        "a handler that is not a function",
        { handler: "count" },
        'The worker "count-words" needs a handler function.',
      ],
      [
        "a zero concurrency",
        { concurrency: 0 },
        'The worker "count-words" has a concurrency that is not a positive integer.',
      ],
      [
        "a fractional concurrency",
        { concurrency: 2.5 },
        'The worker "count-words" has a concurrency that is not a positive integer.',
      ],
      [
        "a NaN concurrency",
        { concurrency: Number.NaN },
        'The worker "count-words" has a concurrency that is not a positive integer.',
      ],
      [
        "a retryOn that is not a function",
        { retryOn: "ECONNRESET" },
        'The worker "count-words" has a retryOn that is not a function or a list of functions, ' +
        "such as Transient.network.",
      ],
      [
        "a retryOn list with something else in it",
        { retryOn: [Transient.network, 503] },
        'The worker "count-words" has a retryOn that is not a function or a list of functions, ' +
        "such as Transient.network.",
      ],
    ]

    for (const [what, changes, message] of cases) {
      it(`Worker.make throws WorkerDefinitionError for ${what}`, () => {
        let thrown: unknown
        try {
          Worker.make(definition(changes))
        } catch (e) {
          thrown = e
        }
        expect(thrown).toBeInstanceOf(WorkerDefinitionError)
        const error = thrown as WorkerDefinitionError
        expect(error.message).toBe(message)
        // One sentence: no line breaks, one full stop at the end.
        expect(error.message).not.toContain("\n")
        expect(error.message.endsWith(".")).toBe(true)
      })

      it.effect(`Worker.validate fails with the same error for ${what}`, () =>
        Effect.gen(function* () {
          const error = yield* Effect.flip(Worker.validate(definition(changes)))
          expect(error).toBeInstanceOf(WorkerDefinitionError)
          expect(error.message).toBe(message)
        }))
    }

    it("a definition that is not an object", () => {
      expect(() => Worker.make(null as unknown as typeof valid)).toThrow(
        new WorkerDefinitionError({ message: "The worker definition must be an object." }),
      )
    })

    it("a valid definition makes a worker with its timeout decoded", () => {
      const worker = Worker.make({ ...valid, concurrency: 4 })
      expect(worker._tag).toBe("Worker")
      expect(worker.name).toBe("count-words")
      expect(Duration.toMillis(worker.timeout)).toBe(30_000)
      expect(worker.concurrency).toBe(4)
      expect(Worker.make(valid).concurrency).toBeUndefined()
    })
  })

  describe("retryOn", () => {
    it("none by default; one rule or a list, kept in order", () => {
      expect(Worker.make(valid).retryOn).toEqual([])
      expect(Worker.make({ ...valid, retryOn: Transient.network }).retryOn).toEqual([
        Transient.network,
      ])
      const http = Transient.httpStatus([503])
      expect(Worker.make({ ...valid, retryOn: [http, Transient.network] }).retryOn).toEqual([
        http,
        Transient.network,
      ])
    })
  })

  describe("hooks and readiness probes", () => {
    const hook = Effect.void
    const fn = async (_signal: AbortSignal) => {}

    it("default to none", () => {
      const worker = Worker.make(valid)
      expect(worker.onStartup).toEqual([])
      expect(worker.onShutdown).toEqual([])
      expect(worker.readiness).toEqual({})
    })

    it("one hook or a list, Effects or functions, kept in order", () => {
      const worker = Worker.make({ ...valid, onStartup: fn, onShutdown: [hook, fn] })
      expect(worker.onStartup).toEqual([fn])
      expect(worker.onShutdown).toEqual([hook, fn])
    })

    it("readiness probes by name", () => {
      const probe = () => true
      const worker = Worker.make({ ...valid, readiness: { model: probe, "cache.v2": hook } })
      expect(worker.readiness).toEqual({ model: probe, "cache.v2": hook })
    })

    const cases: ReadonlyArray<readonly [string, globalThis.Record<string, unknown>, string]> = [
      [
        "an onStartup that is not a hook",
        { onStartup: "connect" },
        'The worker "count-words" has an onStartup that is not an Effect, a function or a list of them.',
      ],
      [
        "an onShutdown list with something else in it",
        { onShutdown: [hook, 42] },
        'The worker "count-words" has an onShutdown that is not an Effect, a function or a list of them.',
      ],
      [
        'a probe named "broker", which the SDK reports itself',
        { readiness: { broker: hook } },
        'The worker "count-words" has a readiness probe named "broker": use letters, digits, ' +
        "'.', '_' or '-', and neither \"broker\" nor \"draining\", which the SDK reports itself.",
      ],
      [
        'a probe named "draining"',
        { readiness: { draining: hook } },
        'The worker "count-words" has a readiness probe named "draining": use letters, digits, ' +
        "'.', '_' or '-', and neither \"broker\" nor \"draining\", which the SDK reports itself.",
      ],
      [
        "a probe name with a space",
        { readiness: { "my model": hook } },
        'The worker "count-words" has a readiness probe named "my model": use letters, digits, ' +
        "'.', '_' or '-', and neither \"broker\" nor \"draining\", which the SDK reports itself.",
      ],
      [
        "a probe that is not a hook",
        { readiness: { model: true } },
        'The worker "count-words" has a readiness probe "model" that is not an Effect or a function.',
      ],
    ]

    for (const [what, changes, message] of cases) {
      it(`Worker.make throws WorkerDefinitionError for ${what}`, () => {
        expect(() => Worker.make(definition(changes))).toThrow(
          new WorkerDefinitionError({ message }),
        )
        expect(message).not.toContain("\n")
        expect(message.endsWith(".")).toBe(true)
      })
    }
  })

  describe("a handler's requirements", () => {
    class Dictionary extends Context.Service<Dictionary, {
      readonly isWord: (word: string) => boolean
    }>()("test/Dictionary") {}

    const dictionaryWorker = Worker.make({
      name: "count-words",
      input: Text,
      output: Words,
      timeout: "30 seconds",
      handler: ({ text }) =>
        Effect.map(Dictionary, (dictionary) => ({
          words: text.split(/\s+/).filter(dictionary.isWord).length,
        })),
    })

    it("are the worker's R, and so the requirements of Worker.serve", () => {
      type Equals<X, Y> = [X] extends [Y] ? ([Y] extends [X] ? true : false) : false
      const exact: Equals<Worker.Requirements<typeof dictionaryWorker>, Dictionary> = true
      expect(exact).toBe(true)
      const served: Effect.Effect<
        void,
        Lifecycle.StartError | Lifecycle.ConsumingError,
        Dictionary
      > = Worker
        .serve(dictionaryWorker)
      // @ts-expect-error: Worker.serve needs the handler's Dictionary too
      const unprovided: Effect.Effect<
        void,
        Lifecycle.StartError | Lifecycle.ConsumingError,
        never
      > = served
      expect(Effect.isEffect(unprovided)).toBe(true)
    })

    it("a definition's layer provides them: no longer the worker's R, so Worker.run takes it", () => {
      type Equals<X, Y> = [X] extends [Y] ? ([Y] extends [X] ? true : false) : false
      const provided = Worker.make({
        ...dictionaryWorker,
        layer: Layer.succeed(Dictionary, { isWord: () => true }),
      })
      const none: Equals<Worker.Requirements<typeof provided>, never> = true
      expect(none).toBe(true)
      // Type checks only: never called.
      const runs = () => Worker.run(provided)
      // @ts-expect-error: a worker whose handler needs what it does not provide, run as the process
      const refused = () => Worker.run(dictionaryWorker)
      expect([typeof runs, typeof refused]).toEqual(["function", "function"])
    })

    it.live("a definition's layer is built once a life, before the startup hooks, released after the shutdown hooks", () =>
      Effect.gen(function* () {
        const events: Array<string> = []
        const worker = Worker.make({
          name: "with-services",
          input: Text,
          output: Words,
          timeout: "5 seconds",
          handler: ({ text }) =>
            Effect.map(Dictionary, (dictionary) => {
              events.push("task")
              return { words: text.split(/\s+/).filter(dictionary.isWord).length }
            }),
          onStartup: () => void events.push("startup"),
          onShutdown: () => void events.push("shutdown"),
          layer: Layer.effect(
            Dictionary,
            Effect.acquireRelease(
              Effect.sync(() => {
                events.push("built")
                return { isWord: (word: string) => /^[a-z]+$/.test(word) }
              }),
              () => Effect.sync(() => void events.push("released")),
            ),
          ),
        })
        yield* Effect.scoped(Effect.gen(function* () {
          const broker = Context.get(
            yield* Layer.build(Worker.layerMemory(worker)),
            MemoryBroker.MemoryBroker,
          )
          yield* broker.publish(
            "with-services_queue_in",
            `{"task_id":"t-1","data":{"message_type":"submission","body":{"text":"a 2 c"}}}`,
          ).pipe(Effect.orDie)
          const success =
            `{"task_id":"t-1","data":{"message_type":"success","response":{"words":2}}}`
          let published: ReadonlyArray<string> = []
          for (let i = 0; i < 100 && !published.includes(success); i++) {
            yield* Effect.sleep("20 millis")
            published = (yield* broker.published("with-services_queue_out")).map((m) =>
              textOf(m.body)
            )
          }
          expect(published).toContain(success)
        }))
        expect(events).toEqual(["built", "startup", "task", "shutdown", "released"])
      }).pipe(Effect.provideService(References.MinimumLogLevel, "Warn")))

    it("a layer that is not one: a definition error", () => {
      expect(() =>
        Worker.make({
          ...valid,
          layer: { not: "a layer" } as unknown as Layer.Layer<never>,
        })
      ).toThrow(/has a layer that is not an Effect Layer/)
    })

    it.effect("are given to the handler when provided", () =>
      Effect.gen(function* () {
        const harness = yield* WorkerHarness.make(dictionaryWorker).pipe(
          Effect.provideService(Dictionary, { isWord: (word) => /^[a-z]+$/.test(word) }),
        )
        const run = yield* harness.submit({ text: "one 2 three f0ur five" })
        run.assertSucceeded()
        expect(run.response).toEqual({ words: 3 })
      }))
  })

  describe("Worker.serve on the MemoryBroker", () => {
    it.effect("a task retried twice concludes once, with success, on its third attempt", () => {
      const attempts: Array<number> = []
      const flaky = Worker.make({
        ...valid,
        handler: ({ text }, ctx) => {
          attempts.push(ctx.attempt)
          return ctx.attempt < 3
            ? Effect.fail(new RetryableError({ code: "NOT_YET", message: "Try again." }))
            : Effect.succeed({ words: countWords(text) })
        },
      })
      return Effect.gen(function* () {
        const broker = yield* MemoryBroker.MemoryBroker
        const settings = yield* Settings.Settings
        const serving = yield* Effect.forkChild(Worker.serve(flaky))
        yield* broker.publish(settings.inQueue, envelope("t-flaky", { text: "a b c" }))
        yield* stepUntil(
          Effect.map(outbound, (ms) => ms.some((m) => m.data.message_type === "success")),
          "10 millis",
          500,
        )
        yield* Fiber.interrupt(serving)
        expect(attempts).toEqual([1, 2, 3])
        const messages = yield* outbound
        expect(messages.every((m) => m.task_id === "t-flaky")).toBe(true)
        expect(messages.map((m) => m.data.message_type)).toEqual([
          "started",
          "started",
          "started",
          "success",
        ])
        expect(messages[3]!.data.response).toEqual({ words: 3 })
        expect(yield* broker.ready(settings.inQueue)).toBe(0)
        expect(yield* broker.unacked(settings.inQueue)).toBe(0)
      }).pipe(
        Effect.provide(
          environment(flaky, { retryBackoffBase: "1 millis", retryBackoffMax: "5 millis" }),
        ),
      )
    })

    it.effect("concurrency N runs at most N handlers at once, and every task completes", () => {
      let running = 0
      let most = 0
      const busy = Worker.make({
        ...valid,
        concurrency: 3,
        handler: ({ text }) =>
          Effect.acquireUseRelease(
            Effect.sync(() => {
              running++
              most = Math.max(most, running)
            }),
            () => Effect.sleep("1 second").pipe(Effect.as({ words: countWords(text) })),
            () => Effect.sync(() => running--),
          ),
      })
      return Effect.gen(function* () {
        const broker = yield* MemoryBroker.MemoryBroker
        const settings = yield* Settings.Settings
        const serving = yield* Effect.forkChild(Worker.serve(busy))
        for (let i = 0; i < 10; i++) {
          yield* broker.publish(settings.inQueue, envelope(`t-${i}`, { text: "x ".repeat(i) }))
        }
        const steps = yield* stepUntil(
          Effect.map(
            outbound,
            (ms) => ms.filter((m) => m.data.message_type === "success").length === 10,
          ),
          "1 second",
          20,
        )
        yield* Fiber.interrupt(serving)
        expect(most).toBe(3)
        // Ten tasks of a second, at most three at a time: at least four rounds.
        expect(steps).toBeGreaterThanOrEqual(4)
        const successes = (yield* outbound).filter((m) => m.data.message_type === "success")
        expect(new Set(successes.map((m) => m.task_id)).size).toBe(10)
        expect(
          successes.find((m) => m.task_id === "t-7")!.data.response,
        ).toEqual({ words: 7 })
        expect(yield* broker.ready(settings.inQueue)).toBe(0)
        expect(yield* broker.unacked(settings.inQueue)).toBe(0)
      }).pipe(Effect.provide(environment(busy)))
    })
  })
})

describe("Worker.layerConfig", () => {
  it.effect("a missing config key fails the layer with an error that names it", () =>
    Effect.gen(function* () {
      const worker = Worker.make({
        name: "configured",
        input: Text,
        output: Words,
        timeout: "5 seconds",
        handler: ({ text }) => Effect.succeed({ words: countWords(text) }),
      })
      const layer = Worker.layerConfig(
        worker,
        Config.all({ inQueue: Config.String("APP_WORKER_QUEUE") }),
      )
      const error = yield* Effect.flip(Layer.build(layer).pipe(Effect.scoped)).pipe(
        Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromUnknown({})),
      )
      expect(String(error.message ?? error)).toContain("APP_WORKER_QUEUE")
    }))
})

describe("Worker.layerMemory with Probes.layer", () => {
  it.live("runs on the embedded broker it provides, its probes on their own port", () =>
    Effect.gen(function* () {
      const port = yield* Effect.promise(() =>
        new Promise<number>((resolve) => {
          const server = Net.createServer().listen(0, "127.0.0.1", () => {
            const address = server.address() as Net.AddressInfo
            server.close(() => resolve(address.port))
          })
        })
      )
      const worker = Worker.make({
        name: "embedded",
        input: Text,
        output: Words,
        timeout: "5 seconds",
        handler: ({ text }) => Effect.succeed({ words: countWords(text) }),
      })
      const context = yield* Layer.build(
        Probes.layer.pipe(
          Layer.provideMerge(
            Worker.layerMemory(worker, {
              settings: { healthCheckHost: "127.0.0.1", healthCheckPort: port },
            }),
          ),
        ),
      )
      const broker = Context.get(context, MemoryBroker.MemoryBroker)
      yield* broker.publish(
        "embedded_queue_in",
        `{"task_id":"t-1","data":{"message_type":"submission","body":{"text":"a b c"}}}`,
      ).pipe(Effect.orDie)
      const success = `{"task_id":"t-1","data":{"message_type":"success","response":{"words":3}}}`
      let published: ReadonlyArray<string> = []
      for (let i = 0; i < 100 && !published.includes(success); i++) {
        yield* Effect.sleep("20 millis")
        published = (yield* broker.published("embedded_queue_out")).map((m) => textOf(m.body))
      }
      expect(published).toContain(success)
      const ready = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/ready`))
      expect(ready.status).toBe(200)
      expect(yield* Effect.promise(() => ready.json())).toMatchObject({
        components: { broker: { status: "ok" }, draining: { status: "ok" } },
      })
    }).pipe(Effect.scoped, Effect.provideService(References.MinimumLogLevel, "Warn")))
})
