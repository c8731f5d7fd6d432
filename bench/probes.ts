/**
 * A worker's task throughput without and with 200 connections held against its probe server
 * (issue 5's "throughput unaffected"), on the MemoryBroker, in one run:
 *
 *   deno run -A bench/probes.ts [rounds]      (or: node bench/probes.ts, Node 24)
 *
 * Each round measures without the connections and with them, one after the other, and its ratio
 * compares the two: the speed of this machine drifts over seconds, and a pair close in time shares
 * the drift; every other round measures with them first, so that a drift within a round favours
 * neither. One client process throughout (test/fixtures/probes/connections.mjs), its connections
 * made and dropped between measures, so that only the connections differ. Run it alone: beside
 * other work on two cores, single measures lose a third of their speed.
 */
import process from "node:process"
import { Effect, References } from "effect"
import * as WorkerHarness from "../src/testing.ts"
import { nextTurn } from "../test/support/logs.ts"
import { connectionLoad, dropAll, loadWorker, pressFresh, start } from "../test/support/probes.ts"

const ROUNDS = Number(process.argv[2] ?? 8)

/**
 * Tasks settled per second of real time, 4 at a time. Each submitter gives the event loop a turn
 * after each task, as a worker waiting on its broker's socket does: the MemoryBroker settles a
 * task without one, and a loop that never gave a turn would leave the probe server's callbacks
 * waiting until it ended, never slowed by them.
 */
const taskThroughput = (harness: WorkerHarness.WorkerHarness, millis: number) =>
  Effect.gen(function* () {
    let settled = 0
    const deadline = Date.now() + millis
    const submitter = Effect.gen(function* () {
      while (Date.now() < deadline) {
        const run = yield* harness.submit({})
        run.assertSucceeded()
        settled++
        yield* nextTurn
      }
    })
    yield* Effect.all([submitter, submitter, submitter, submitter], { concurrency: "unbounded" })
    return Math.round(settled / (millis / 1000))
  })

/** A fresh harness, a 200 ms warm-up, then 1.2 s measured. */
const measure = Effect.scoped(
  Effect.flatMap(
    WorkerHarness.make(loadWorker),
    (harness) => Effect.andThen(taskThroughput(harness, 200), taskThroughput(harness, 1200)),
  ),
)

const program = Effect.gen(function* () {
  const { port } = yield* start()
  const load = yield* connectionLoad(port)
  let held = 0
  const alone = Effect.andThen(dropAll(load), measure)
  const loaded = Effect.gen(function* () {
    yield* pressFresh(load)
    const rate = yield* measure
    held = Math.max(held, load.state.open)
    return rate
  })
  yield* measure // warms the JIT
  const pairs: Array<{ alone: number; loaded: number }> = []
  for (let round = 0; round < ROUNDS; round++) {
    if (round % 2 === 0) {
      const a = yield* alone
      pairs.push({ alone: a, loaded: yield* loaded })
    } else {
      const l = yield* loaded
      pairs.push({ alone: yield* alone, loaded: l })
    }
  }
  const ratios = pairs.map((p) => p.loaded / p.alone).sort((a, b) => a - b)
  const middle = Math.floor(ROUNDS / 2)
  const median = ROUNDS % 2 === 1 ? ratios[middle]! : (ratios[middle - 1]! + ratios[middle]!) / 2
  console.log(`tasks/s alone, then with 200 connections (${held} held at most):`)
  for (const p of pairs) {
    console.log(`  ${p.alone}  ${p.loaded}  ${(p.loaded / p.alone).toFixed(2)}`)
  }
  console.log(`loaded / alone, median of ${ROUNDS} rounds: ${median.toFixed(2)}`)
})

await Effect.runPromise(
  program.pipe(Effect.scoped, Effect.provideService(References.MinimumLogLevel, "Warn")),
)
