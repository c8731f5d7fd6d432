/**
 * Adaptive concurrency against the best fixed setting, on the MemoryBroker, in one run.
 *
 *   deno run -A bench/adaptive.ts      (or: node bench/adaptive.ts, Node 24)
 *
 * The handler stands for a downstream that slows down past a knee: with `running` tasks in it,
 * a call takes BASE when running ≤ KNEE and BASE × (running / KNEE)² beyond, so the throughput
 * (running / latency) peaks at KNEE. Past LIMIT × BASE the downstream refuses the call after a
 * short while (a 429): the handler fails with `RetryableError({ congestion: true })`, the signal
 * the adaptive controller decreases on. The worker runs with the SDK's default settings (retry
 * backoff included): what a user would get.
 *
 * 1. A sweep of fixed concurrencies, RUN each: successes per second; the best one.
 * 2. Each adaptive policy, `Concurrency.adaptive({ min: 1, max: MAX })` (AIMD, on congestion) and
 *    `{ by: "latency" }`, for the same RUN: its throughput and ratio to the best fixed one.
 * 3. The same adaptive workers for LONG: where each target settles against the knee, and the
 *    handler's mean latency against the knee's (BASE).
 */
import process from "node:process"
import { Deferred, Duration, Effect, Fiber, References, Schema } from "effect"
import { Concurrency, MemoryBroker, RetryableError, Settings, Worker } from "../src/index.ts"
import { memoryBroker } from "./memory.ts"

const BASE_MS = 20
const KNEE = 16
const LIMIT = 2 // refuse past this multiple of BASE: above KNEE × √LIMIT ≈ 22.6 running
const REFUSE_MS = 5 // how long a refused call takes
const MAX = 200
const RUN_MS = 3_000
const LONG_MS = 10_000
const SWEEP = [4, 8, 12, 14, 16, 18, 20, 24, 32, 48]
const BACKLOG = 15_000

const encoder = new TextEncoder()
const envelope = (i: number) =>
  encoder.encode(
    `{"task_id": "task-${i}", "data": {"message_type": "submission", "body": {"n": ${i}}}}`,
  )

const latency = (running: number) => running <= KNEE ? BASE_MS : BASE_MS * (running / KNEE) ** 2

/** A simulated downstream, one a run: the calls in it, what it answered, and the handler. */
const downstream = () => {
  const calls = {
    running: 0,
    successes: 0,
    refused: 0,
    /** The latencies of the successful calls, summed: their mean against the knee's. */
    latencies: 0,
    handler: () =>
      Effect.suspend(() => {
        const took = latency(++calls.running)
        const answer = took > LIMIT * BASE_MS
          ? Effect.sleep(REFUSE_MS).pipe(
            Effect.andThen(Effect.sync(() => void calls.refused++)),
            Effect.andThen(
              Effect.fail(
                new RetryableError({
                  code: "DOWNSTREAM_BUSY",
                  message: "Too many requests.",
                  congestion: true,
                }),
              ),
            ),
          )
          : Effect.sleep(took).pipe(
            Effect.andThen(Effect.sync(() => {
              calls.successes++
              calls.latencies += took
            })),
            Effect.as({ ok: true }),
          )
        return Effect.ensuring(answer, Effect.sync(() => void calls.running--))
      }),
  }
  return calls
}

const definition = {
  name: "adaptive-bench",
  input: Schema.Struct({ n: Schema.Number }),
  output: Schema.Struct({ ok: Schema.Boolean }),
  timeout: "30 seconds",
} as const

interface Sample {
  readonly at: number
  readonly target: number
  readonly running: number
}

interface Result {
  readonly rate: number
  readonly refused: number
  /** The mean latency of the successful calls, ms. */
  readonly latency: number
  readonly samples: ReadonlyArray<Sample>
}

/** Workers whose scope did not close within {@link CLOSE_MS}: reported, not waited for. */
const CLOSE_MS = 5_000
let hung = 0

/**
 * Runs `policy` on a fresh broker with a backlog for `ms`; samples the target every 20 ms. The
 * worker's scope closes in the background: the figures are taken first, and a close that takes
 * longer than CLOSE_MS is counted (a bug to report) rather than hanging the bench.
 */
const measure = (policy: Concurrency.Policy, ms: number): Effect.Effect<Result, unknown> =>
  Effect.gen(function* () {
    const result = yield* Deferred.make<Result>()
    const run = Effect.gen(function* () {
      const broker = yield* MemoryBroker.MemoryBroker
      for (let i = 0; i < BACKLOG; i++) {
        yield* broker.publish("adaptive-bench_queue_in", envelope(i))
      }
      const calls = downstream()
      const samples: Array<Sample> = []
      const start = performance.now()
      const running = yield* Worker.consume(
        Worker.make({ ...definition, handler: calls.handler, concurrency: policy }),
      )
      while (performance.now() - start < ms) {
        yield* Effect.sleep(20)
        samples.push({
          at: performance.now() - start,
          target: yield* running.concurrency,
          running: calls.running,
        })
      }
      const seconds = (performance.now() - start) / 1000
      yield* Deferred.succeed(result, {
        rate: calls.successes / seconds,
        refused: calls.refused,
        latency: calls.latencies / Math.max(1, calls.successes),
        samples,
      })
    }).pipe(
      Effect.scoped,
      Effect.provide(memoryBroker()),
      Effect.provide(
        Settings.layer({
          name: definition.name,
          timeout: Duration.fromInputUnsafe(definition.timeout),
          concurrency: typeof policy === "number" ? policy : 1,
        }),
      ),
    )
    const fiber = yield* Effect.forkDetach(run)
    const measured = yield* Effect.raceFirst(
      Deferred.await(result),
      Effect.flatMap(Fiber.join(fiber), () => Deferred.await(result)),
    )
    const closed = yield* Fiber.await(fiber).pipe(Effect.timeoutOption(CLOSE_MS))
    if (closed._tag === "None") hung++
    return measured
  })

/** Mean, min and max of `f` over the samples from `from` ms on. */
const stats = (samples: ReadonlyArray<Sample>, from: number, f: (s: Sample) => number) => {
  const values = samples.filter((s) => s.at >= from).map(f)
  const mean = values.reduce((a, b) => a + b, 0) / values.length
  const near = values.filter((v) => v >= KNEE * 0.75 && v <= KNEE * 1.25).length / values.length
  return { mean, min: Math.min(...values), max: Math.max(...values), near }
}

const deno = (globalThis as { Deno?: { version: { deno: string } } }).Deno
const runtime = deno === undefined ? `node ${process.version}` : `deno ${deno.version.deno}`
const round = (n: number) => Math.round(n).toLocaleString("en-US")

/** `policy` for RUN and for LONG: its rate against the best fixed one, its target, its latency. */
const adaptiveRuns = (name: string, policy: Concurrency.Adaptive, bestRate: number) =>
  Effect.gen(function* () {
    const same = yield* measure(policy, RUN_MS)
    const settledSame = stats(same.samples, RUN_MS / 3, (s) => s.target)
    console.log(
      `${name}: ${round(same.rate)} tasks/s in ${
        RUN_MS / 1000
      } s (${same.refused} refused), ratio ${
        (same.rate / bestRate).toFixed(2)
      } of the best fixed; target after ${RUN_MS / 3000} s: mean ${
        settledSame.mean.toFixed(1)
      } (${settledSame.min}–${settledSame.max})`,
    )
    const long = yield* measure(policy, LONG_MS)
    const target = stats(long.samples, LONG_MS / 2, (s) => s.target)
    const inFlight = stats(long.samples, LONG_MS / 2, (s) => s.running)
    const trace = long.samples.filter((_, i) => i % 25 === 0).map((s) => s.target).join(" ")
    console.log(
      `${name}, ${LONG_MS / 1000} s: ${round(long.rate)} tasks/s (${long.refused} refused), ratio ${
        (long.rate / bestRate).toFixed(2)
      }; mean latency ${long.latency.toFixed(1)} ms (the knee's: ${BASE_MS} ms)`,
    )
    console.log(
      `  target over the last ${LONG_MS / 2000} s: mean ${
        target.mean.toFixed(1)
      } (${target.min}–${target.max}) vs knee ${KNEE}; ${
        Math.round(target.near * 100)
      }% of the time within ±25% of the knee`,
    )
    console.log(
      `  downstream running over the last ${LONG_MS / 2000} s: mean ${
        inFlight.mean.toFixed(1)
      } (${inFlight.min}–${inFlight.max})`,
    )
    console.log(`  target every 0.5 s: ${trace}`)
  })

const main = Effect.gen(function* () {
  const ideal = (KNEE / BASE_MS) * 1000
  console.log(
    `downstream: ${BASE_MS} ms up to ${KNEE} running, ×(running/${KNEE})² beyond, refused past ${
      LIMIT * BASE_MS
    } ms (congestion); ideal ${round(ideal)}/s at ${KNEE}. ${process.platform} ${runtime}`,
  )
  yield* measure(KNEE, 500) // warm-up: JIT the engine's paths

  let best = { concurrency: 0, rate: 0 }
  const sweep: Array<string> = []
  for (const concurrency of SWEEP) {
    const { rate, refused } = yield* measure(concurrency, RUN_MS)
    sweep.push(`${concurrency}: ${round(rate)}/s${refused > 0 ? ` (${refused} refused)` : ""}`)
    if (rate > best.rate) best = { concurrency, rate }
  }
  console.log(`fixed sweep, ${RUN_MS / 1000} s each: ${sweep.join(", ")}`)
  console.log(`best fixed:  concurrency ${best.concurrency}, ${round(best.rate)} tasks/s`)

  for (
    const [name, policy] of [
      ["AIMD", Concurrency.adaptive({ min: 1, max: MAX })],
      ["latency", Concurrency.adaptive({ min: 1, max: MAX, by: "latency" })],
    ] as const
  ) {
    yield* adaptiveRuns(name, policy, best.rate)
  }
  if (hung > 0) {
    console.log(
      `WARNING: ${hung} worker(s) did not close within ${
        CLOSE_MS / 1000
      } s of the end of their run`,
    )
  }
})

await Effect.runPromise(main.pipe(Effect.provideService(References.MinimumLogLevel, "Warn")))

// Workers that did not close (see the warning) would keep the process alive.
if (hung > 0) process.exit(1)
