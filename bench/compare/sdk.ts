/**
 * The SDK in a worker process of `bench/compare.ts`, as `bench/loops.ts` runs it: `Worker.serve`
 * on `AmqpTransport` with the run's concurrency, the mode's handler, and its decision lines
 * counted by a logger that prints nothing.
 */
import { Effect, Fiber, Layer, Logger, Schema } from "effect"
import * as AmqpTransport from "../../src/AmqpTransport.ts"
import { Settings, Worker } from "../../src/index.ts"
import { type Contender, holding, type Mode, TIMER_MS } from "./protocol.ts"
import { tally } from "../tally.ts"

const handlerOf = (mode: Mode, held: ReturnType<typeof holding>) => {
  const ok = { ok: true }
  switch (mode) {
    case "timer":
      return () => Effect.as(Effect.sleep(TIMER_MS), ok)
    case "held":
      return () => Effect.as(Effect.promise(held.hold), ok)
    default:
      return () => Effect.succeed(ok)
  }
}

export const contender: Contender = async (run, ready) => {
  const settled = tally(run.tasks)
  const held = holding(run.tasks)
  let started!: () => void
  const consuming = new Promise<void>((resolve) => (started = resolve))
  const counter = Logger.make(({ message }) => {
    const line = String(Array.isArray(message) ? message[0] : message)
    if (line.startsWith("Delivery settled")) settled.settle()
    else if (line.startsWith(`Worker ${run.name} started in`)) started()
  })
  const worker = Worker.make({
    name: run.name,
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ ok: Schema.Boolean }),
    timeout: "1 minute",
    handler: handlerOf(run.mode, held),
  })
  const settings = Settings.layer({ name: worker.name, timeout: worker.timeout }, {
    brokerUrl: run.url,
    concurrency: run.concurrency,
  })
  const fiber = Effect.runFork(
    Worker.serve(worker).pipe(
      Effect.provide(AmqpTransport.layer.pipe(Layer.provideMerge(settings))),
      Effect.provide(Logger.layer([counter])),
    ),
  )
  const failed = Effect.runPromise(Fiber.join(fiber)).then(() => {
    throw new Error("the worker stopped before its run ended")
  })
  try {
    await Promise.race([consuming, failed])
    if (run.mode === "held") held.before()
    ready()
    await Promise.race([settled.all, failed])
    return { ...settled.run(), heap: run.mode === "held" ? held.perTask() : undefined }
  } finally {
    await Effect.runPromise(Fiber.interrupt(fiber))
    failed.catch(() => {})
  }
}
