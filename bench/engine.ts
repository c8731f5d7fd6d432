/**
 * The delivery engine on the MemoryBroker, against a baseline measured in the same run.
 *
 *   deno task bench      (deno run -A --v8-flags=--expose-gc bench/engine.ts [tasks])
 *   node --expose-gc bench/engine.ts [tasks]      (Node 24, which strips the types)
 *
 * 1. Throughput with a no-op handler. The baseline is the minimal loop on the same broker —
 *    consume, decode the envelope, publish `started` and `success`, ack — with none of the
 *    engine's guarantees; the ratio says what the engine costs on top of it.
 * 2. Memory per in-flight task: 10 000 tasks held at once by a handler that waits.
 *
 * Decision lines are INFO: the runs log at WARNING so that the figures measure the engine, not
 * the console.
 */
import process from "node:process"
import { Deferred, Effect, Option, References, Schedule, Schema } from "effect"
import { MemoryBroker, Settings, Worker } from "../src/index.ts"
import { memoryBroker } from "./memory.ts"
import { settleMinimally } from "./minimalLoop.ts"

const TASKS = Number(process.argv[2] ?? 100_000)
const HELD = 10_000
const CONCURRENCY = 50

const encoder = new TextEncoder()
const envelope = (i: number) =>
  encoder.encode(
    `{"task_id": "task-${i}", "data": {"message_type": "submission", "body": {"n": ${i}}}}`,
  )

const gc = (globalThis as { gc?: () => void }).gc
const heapUsed = () => {
  gc?.()
  gc?.()
  return process.memoryUsage().heapUsed
}

const deno = (globalThis as { Deno?: { version: { deno: string } } }).Deno
const runtime = deno === undefined ? `node ${process.version}` : `deno ${deno.version.deno}`

const noop = Worker.make({
  name: "bench",
  input: Schema.Struct({ n: Schema.Number }),
  output: Schema.Struct({ ok: Schema.Boolean }),
  timeout: "30 seconds",
  handler: () => Effect.succeed({ ok: true }),
})

const settingsFor = (concurrency: number) =>
  Settings.layer({ name: "bench", timeout: noop.timeout }, { concurrency })

const preload = (broker: MemoryBroker.MemoryBroker["Service"], n: number) =>
  Effect.forEach(
    Array.from({ length: n }, (_, i) => i),
    (i) => broker.publish("bench_queue_in", envelope(i)),
    {
      discard: true,
    },
  )

const drained = (broker: MemoryBroker.MemoryBroker["Service"]) =>
  Effect.gen(function* () {
    return (yield* broker.ready("bench_queue_in")) + (yield* broker.unacked("bench_queue_in")) === 0
  }).pipe(Effect.repeat({ schedule: Schedule.spaced("1 millis"), until: (done) => done }))

const timed = <E, R>(effect: Effect.Effect<unknown, E, R>) =>
  Effect.gen(function* () {
    const start = performance.now()
    yield* effect
    return (performance.now() - start) / 1000
  })

const baseline = Effect.gen(function* () {
  const broker = yield* MemoryBroker.MemoryBroker
  yield* preload(broker, TASKS)
  const transport = yield* broker.transport({
    inQueue: "bench_queue_in",
    outQueue: "bench_queue_out",
    capacity: CONCURRENCY,
  })
  const seconds = yield* timed(
    Effect.gen(function* () {
      for (let i = 0; i < TASKS; i++) {
        yield* settleMinimally(transport, Option.getOrThrow(yield* transport.take))
      }
    }),
  )
  return TASKS / seconds
}).pipe(Effect.scoped, Effect.provide(MemoryBroker.layer({ retainPublished: false })))

const engine = Effect.gen(function* () {
  const broker = yield* MemoryBroker.MemoryBroker
  yield* preload(broker, TASKS)
  const seconds = yield* timed(
    Effect.gen(function* () {
      yield* Worker.consume(noop)
      yield* drained(broker)
    }),
  )
  return TASKS / seconds
}).pipe(
  Effect.scoped,
  Effect.provide(memoryBroker()),
  Effect.provide(settingsFor(CONCURRENCY)),
)

const held = Effect.gen(function* () {
  const release = yield* Deferred.make<void>()
  const waiting = Worker.make({
    ...noop,
    handler: () => Effect.as(Deferred.await(release), { ok: true }),
  })
  const broker = yield* MemoryBroker.MemoryBroker
  yield* preload(broker, HELD)
  const before = heapUsed()
  const running = yield* Worker.consume(waiting)
  yield* running.inFlight.pipe(
    Effect.repeat({ schedule: Schedule.spaced("5 millis"), until: (n) => n === HELD }),
  )
  const after = heapUsed()
  yield* Deferred.succeed(release, undefined)
  yield* drained(broker)
  return (after - before) / HELD
}).pipe(
  Effect.scoped,
  Effect.provide(memoryBroker()),
  Effect.provide(settingsFor(HELD)),
)

const main = Effect.gen(function* () {
  yield* engine // warm-up: JIT the engine's paths before measuring either loop
  const rawRate = yield* baseline
  const engineRate = yield* engine
  const bytesPerTask = yield* held
  const round = (n: number) => Math.round(n).toLocaleString("en-US")
  console.log(`tasks: ${TASKS}, concurrency ${CONCURRENCY}, ${process.platform} ${runtime}`)
  console.log(`baseline (raw broker loop): ${round(rawRate)} tasks/s`)
  console.log(
    `engine (no-op handler):     ${round(engineRate)} tasks/s   ratio ${
      (engineRate / rawRate).toFixed(2)
    }`,
  )
  console.log(
    `memory per in-flight task (${HELD} held): ${round(bytesPerTask)} bytes${
      gc ? "" : " (no --expose-gc: noisy)"
    }`,
  )
})

await Effect.runPromise(main.pipe(Effect.provideService(References.MinimumLogLevel, "Warn")))
