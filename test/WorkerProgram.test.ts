/**
 * The worker program is one composition of the concerns' layers, and a test replaces a concern
 * through it: here the progress throttle, and the transport.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import * as MemoryBroker from "../src/MemoryBroker.ts"
import * as ProgressThrottle from "../src/ProgressThrottle.ts"
import * as Settings from "../src/Settings.ts"
import { Transport } from "../src/Transport.ts"
import * as Worker from "../src/Worker.ts"
import * as WorkerProgram from "../src/WorkerProgram.ts"
import { memoryEnvironment, publishedTypes } from "./support/environment.ts"
import { waitUntil } from "./support/logs.ts"

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

const envelope = (taskId: string) =>
  JSON.stringify({ task_id: taskId, data: { message_type: "submission", body: { text: "abc" } } })

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
      yield* broker.publish(settings.inQueue, envelope("t-1")).pipe(Effect.orDie)
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
      yield* broker.publish(settings.inQueue, envelope("t-2")).pipe(Effect.orDie)
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
})
