/**
 * Threaded handlers (`Thread.handler`) on the MemoryBroker, against baselines measured in the same
 * run:
 *
 *   node bench/threads.ts [tasks]      (Node 24, which strips the types)
 *   deno run -A bench/threads.ts [tasks]
 *
 * 1. The thread hop: a no-op handler run inline and on a thread, at a concurrency of the machine's
 *    cores; the difference per task is what a thread costs a task.
 * 2. CPU-bound work: tasks of 200 ms of busy CPU on threads, at a concurrency of the cores, against
 *    the ideal (cores / 0.2 s tasks a second), and the same handler inline (one core at most).
 *
 * Decision lines are INFO: the runs log at WARNING so that the figures measure the work.
 */
import { availableParallelism } from "node:os"
import process from "node:process"
import { Effect, References, Schedule, Schema } from "effect"
import { MemoryBroker, Settings, Thread, Worker } from "../src/index.ts"
import { memoryBroker } from "./memory.ts"

const TASKS = Number(process.argv[2] ?? 5_000)
const CPU_TASKS = 20
const BURN_MS = 200
const CORES = availableParallelism()
const MODULE = new URL("./threadHandlers.mjs", import.meta.url)

const Input = Schema.Struct({ n: Schema.Number, ms: Schema.Number })
const Output = Schema.Struct({ ok: Schema.Boolean })
const define = (handler: Worker.Handler<typeof Input.Type, typeof Output.Type, never>) =>
  Worker.make({ name: "bench", input: Input, output: Output, timeout: "1 minute", handler })

const burnInline = (ms: number) => {
  const until = Date.now() + ms
  while (Date.now() < until) {
    // busy
  }
  return { ok: true }
}

const encoder = new TextEncoder()

/** Seconds to run `tasks` tasks of `ms` each through `worker`, at a concurrency of the cores. */
const run = (
  worker: Worker.Worker<typeof Input.Type, unknown, typeof Output.Type, never>,
  tasks: number,
  ms: number,
) =>
  Effect.gen(function* () {
    const broker = yield* MemoryBroker.MemoryBroker
    for (let n = 0; n < tasks; n++) {
      yield* broker.publish(
        "bench_queue_in",
        encoder.encode(`{"task_id": "t-${n}", "data": {"body": {"n": ${n}, "ms": ${ms}}}}`),
      )
    }
    const start = performance.now()
    yield* Worker.consume(worker)
    yield* Effect.gen(function* () {
      return (yield* broker.ready("bench_queue_in")) + (yield* broker.unacked("bench_queue_in"))
    }).pipe(Effect.repeat({ schedule: Schedule.spaced("1 millis"), until: (left) => left === 0 }))
    return (performance.now() - start) / 1000
  }).pipe(
    Effect.scoped,
    Effect.provide(memoryBroker()),
    Effect.provide(
      Settings.layer({ name: "bench", timeout: threaded.timeout }, { concurrency: CORES }),
    ),
    Effect.provideService(References.MinimumLogLevel, "Warn"),
  )

const inline = define(() => Effect.succeed({ ok: true }))
const threaded = define(Thread.handler(MODULE, "noop"))
const cpuInline = define((input) => Effect.sync(() => burnInline(input.ms)))
const cpuThreaded = define(Thread.handler(MODULE, "burn"))

const main = Effect.gen(function* () {
  yield* run(threaded, 200, 0) // warm-up
  const inlineSeconds = yield* run(inline, TASKS, 0)
  const threadSeconds = yield* run(threaded, TASKS, 0)
  const hop = ((threadSeconds - inlineSeconds) / TASKS) * 1e6
  const cpuInlineSeconds = yield* run(cpuInline, CPU_TASKS, BURN_MS)
  const cpuThreadSeconds = yield* run(cpuThreaded, CPU_TASKS, BURN_MS)
  const ideal = CORES / (BURN_MS / 1000)
  const deno = (globalThis as { Deno?: { version: { deno: string } } }).Deno
  const runtime = deno === undefined ? `node ${process.version}` : `deno ${deno.version.deno}`
  console.log(`${runtime}, ${CORES} cores, concurrency ${CORES}`)
  console.log(
    `no-op, ${TASKS} tasks: inline ${((inlineSeconds / TASKS) * 1e6).toFixed(0)} µs/task, ` +
      `threaded ${((threadSeconds / TASKS) * 1e6).toFixed(0)} µs/task: the hop ${
        hop.toFixed(0)
      } µs`,
  )
  const rate = (seconds: number) => CPU_TASKS / seconds
  console.log(
    `${BURN_MS} ms of CPU, ${CPU_TASKS} tasks: threaded ${
      rate(cpuThreadSeconds).toFixed(2)
    } tasks/s ` +
      `(${(rate(cpuThreadSeconds) / ideal).toFixed(2)} of the ideal ${ideal.toFixed(1)}), inline ` +
      `${rate(cpuInlineSeconds).toFixed(2)} tasks/s (${
        (rate(cpuInlineSeconds) / ideal).toFixed(2)
      })`,
  )
})

Effect.runPromise(main).catch((error) => {
  console.error(error)
  process.exit(1)
})
