/**
 * Issue 5, acceptance 2, for tasks: 200 connections held against the probe server leave the
 * worker's task throughput as it was. A comparison of throughputs in real time, so it runs with
 * nothing beside it (`npm run test:alone`): the suite's other files, two at a time on two cores,
 * slowed single rounds by a third. The clients run in a process of their own, so that only the
 * server's share of the work is measured here.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, References, Schema } from "effect"
import { spawn } from "node:child_process"
import process from "node:process"
import { fileURLToPath } from "node:url"
import * as WorkerHarness from "../../src/testing.ts"
import * as Worker from "../../src/Worker.ts"
import { nextTurn } from "../support/logs.ts"
import { start, waitForReal } from "../support/probes.ts"

/**
 * The client process of `test/fixtures/probes/connections.mjs`, for the scope: `open` makes its
 * 200 connections, `close` drops them, and `state.open` is how many the server still holds.
 */
const connectionLoad = (port: number) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const script = fileURLToPath(
        new URL("../fixtures/probes/connections.mjs", import.meta.url),
      )
      const deno = "Deno" in globalThis
      const child = spawn(
        process.execPath,
        deno ? ["run", "-A", script, String(port)] : [script, String(port)],
        { stdio: ["pipe", "pipe", "inherit"] },
      )
      const state = { open: -1 }
      child.stdout.on("data", (chunk: Uint8Array) => {
        const last = new TextDecoder().decode(chunk).trim().split("\n").at(-1)
        const n = Number(last?.split(" ")[1])
        if (Number.isFinite(n)) state.open = n
      })
      const command = (line: "open" | "close") => Effect.sync(() => child.stdin.write(`${line}\n`))
      return { child, state, open: command("open"), close: command("close") }
    }),
    ({ child }) => Effect.sync(() => void child.kill("SIGKILL")),
  )

/**
 * Tasks settled per second of real time by a worker on the MemoryBroker, 4 at a time. Each
 * submitter gives the event loop a turn after each task, as a worker waiting on its broker's
 * socket does: the MemoryBroker settles a task without one, and a loop that never gave a turn
 * would leave the probe server's callbacks waiting until it ended, never slowed by them.
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

/** Pairs of measures, alone and loaded: an even number, whose median is its middle two's mean. */
const ROUNDS = 8

describe("Probes", () => {
  it.live(
    "200 connections from another process leave task throughput unaffected within noise",
    () =>
      Effect.gen(function* () {
        const { port } = yield* start()
        const worker = Worker.make({
          name: "probe-load",
          input: Schema.Struct({}),
          output: Schema.Struct({}),
          timeout: "5 seconds",
          handler: () => Effect.succeed({}),
        })
        const measure = Effect.scoped(
          Effect.flatMap(
            WorkerHarness.make(worker),
            (harness) =>
              Effect.andThen(taskThroughput(harness, 200), taskThroughput(harness, 1200)),
          ),
        )
        // One client process throughout, its connections made and dropped between measures, so
        // that only the connections differ. Each round measures without them and with them, one
        // after the other, and its ratio compares the two: the speed of this machine drifts over
        // seconds, and a pair close in time shares the drift; every other round measures with
        // them first, so that a drift within a round favours neither. The first measure warms
        // the JIT.
        const load = yield* connectionLoad(port)
        const dropped = Effect.andThen(
          load.close,
          waitForReal(() => load.state.open === 0, 5000, "the connections are dropped"),
        )
        const alone = Effect.andThen(dropped, measure)
        let held = 0
        // Fresh connections for each measure: the server gives each at most 5 s.
        const loaded = Effect.gen(function* () {
          yield* dropped
          yield* load.open
          yield* waitForReal(
            () => load.state.open === 32,
            5000,
            "the server holds 32 connections",
          )
          const rate = yield* measure
          held = Math.max(held, load.state.open)
          return rate
        })
        yield* measure
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
        const median = (ratios[ROUNDS / 2 - 1]! + ratios[ROUNDS / 2]!) / 2
        console.log(
          `Probes bound: tasks/s alone, then with 200 connections (${held} held): ${
            pairs.map((p) => `${p.alone} ${p.loaded}`).join("; ")
          }; median ratio ${median.toFixed(2)}`,
        )
        expect(held).toBeLessThanOrEqual(32)
        expect(median).toBeGreaterThanOrEqual(0.8)
      }).pipe(Effect.scoped, Effect.provideService(References.MinimumLogLevel, "Warn")),
    60_000,
  )
})
