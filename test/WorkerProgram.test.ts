/**
 * The worker program is one composition of the concerns' layers, and a test replaces a concern
 * through it: here the progress throttle, and the transport.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Schema } from "effect"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as ProgressThrottle from "../src/ProgressThrottle.ts"
import * as Settings from "../src/Settings.ts"
import { Transport } from "../src/Transport.ts"
import * as Worker from "../src/Worker.ts"
import { MissingServiceError } from "../src/WorkerError.ts"
import * as WorkerProgram from "../src/WorkerProgram.ts"
import { memoryEnvironment, publishedTypes } from "./support/environment.ts"
import { waitUntil } from "./support/logs.ts"
import { envelope } from "./support/builders.ts"

const worker = Worker.make({
  name: "program",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ length: Schema.Number }),
  timeout: "10 seconds",
  handler: ({ text }, ctx) =>
    Effect.gen(function* () {
      yield* ctx.progress(0.5, { stage: "half" })
      return { length: text.length }
    }),
})

describe("WorkerProgram", () => {
  it.effect("a throttle given to the composition replaces the SDK's own", () => {
    const reports: Array<{ taskId: string; fraction: number }> = []
    const recording = Layer.succeed(
      ProgressThrottle.ProgressThrottle,
      ProgressThrottle.ProgressThrottle.of({
        open: (taskId) =>
          Effect.succeed({
            report: (fraction) => Effect.sync(() => void reports.push({ taskId, fraction })),
            close: Effect.void,
          }),
      }),
    )
    return Effect.gen(function* () {
      const broker = yield* MemoryBroker.MemoryBroker
      const settings = yield* Settings.Settings
      yield* WorkerProgram.consume(worker, { throttle: recording })
      yield* broker.publish(settings.inQueue, envelope("t-1", { text: "abc" })).pipe(Effect.orDie)
      const types = publishedTypes(broker, settings.outQueue, "t-1")
      yield* waitUntil(() => Effect.map(types, (t) => t.includes("success")), "t-1 concludes")
      expect(reports).toEqual([{ taskId: "t-1", fraction: 0.5 }])
      // The recording throttle published nothing: no progress message went out.
      expect(yield* types).toEqual(["started", "success"])
    }).pipe(Effect.scoped, Effect.provide(memoryEnvironment(worker)))
  })

  it.effect("a transport given to the composition carries every delivery and publish", () => {
    const seen: Array<string> = []
    return Effect.gen(function* () {
      const broker = yield* MemoryBroker.MemoryBroker
      const settings = yield* Settings.Settings
      const inner = yield* broker.transport({
        inQueue: settings.inQueue,
        outQueue: settings.outQueue,
        capacity: 1,
      })
      const watched = Transport.of({
        ...inner,
        publish: (body, type) =>
          Effect.andThen(Effect.sync(() => seen.push(type)), inner.publish(body, type)),
      })
      yield* WorkerProgram.consume(worker).pipe(Effect.provideService(Transport, watched))
      yield* broker.publish(settings.inQueue, envelope("t-2", { text: "abc" })).pipe(Effect.orDie)
      yield* waitUntil(() => seen.includes("success"), "t-2 concludes")
      expect(seen).toEqual(["started", "progress", "success"])
    }).pipe(
      Effect.scoped,
      Effect.provide(
        Layer.merge(
          MemoryBroker.layer(),
          Settings.layer({ name: worker.name, timeout: worker.timeout }),
        ),
      ),
    )
  })

  it.live("a handler asking for a service the worker was not given: requeued, no terminal message, consuming ends", () => {
    class Database extends Context.Service<Database, { readonly save: () => void }>()(
      "app/Database",
    ) {}
    let calls = 0
    const needy = Worker.make({
      name: "needy",
      input: Schema.Struct({ text: Schema.String }),
      output: Schema.Struct({ length: Schema.Number }),
      timeout: "10 seconds",
      handler: ({ text }) =>
        Effect.map(Database, (db) => {
          calls++
          db.save()
          return { length: text.length }
        }),
    })
    // As plain JavaScript would bring it to the CLI: its types unchecked.
    const unprovided = needy as unknown as Worker.Worker<
      { text: string },
      { text: string },
      { length: number },
      never
    >
    return Effect.gen(function* () {
      const broker = yield* MemoryBroker.MemoryBroker
      const settings = yield* Settings.Settings
      yield* broker.publish(settings.inQueue, envelope("t-3", { text: "abc" })).pipe(Effect.orDie)
      yield* broker.publish(settings.inQueue, envelope("t-4", { text: "abc" })).pipe(Effect.orDie)
      const running = yield* WorkerProgram.consume(unprovided)
      const exit = yield* Effect.exit(running.await)
      expect(exit).toEqual(Exit.fail(new MissingServiceError({ service: "app/Database" })))
      expect(calls).toBe(0)
      // No task concluded because of it: both still queued, nothing but `started` published.
      yield* waitUntil(
        () => Effect.map(broker.unacked(settings.inQueue), (n) => n === 0),
        "the delivery is settled",
      )
      expect(yield* broker.ready(settings.inQueue)).toBe(2)
      expect(yield* publishedTypes(broker, settings.outQueue, "t-3")).toEqual(["started"])
      expect(yield* publishedTypes(broker, settings.outQueue, "t-4")).toEqual([])
    }).pipe(Effect.scoped, Effect.provide(memoryEnvironment(needy, { concurrency: 1 })))
  })
})
