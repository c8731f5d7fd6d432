/**
 * Issue 5, acceptance 2, for tasks: 200 connections made against the probe server, from a
 * process of their own, hold the server's 32 slots and no more (`pressFresh` waits for exactly
 * 32 of them left open, and fails otherwise), and every task is served while they are held.
 * What the connections cost in throughput is a ratio of real-time speeds, which shared cores move:
 * `bench/probes.ts` measures it. Run alone (`npm run test:alone`): the server's bound is read
 * from the client process's count, which a busy machine delays.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, References } from "effect"
import * as WorkerHarness from "../../src/testing.ts"
import { nextTurn } from "../support/logs.ts"
import { connectionLoad, loadWorker, pressFresh, start } from "../support/probes.ts"

const ROUNDS = 4
const TASKS = 2_000

describe("Probes", () => {
  it.live(
    "200 connections from another process take the 32 slots and no more, and every task is served",
    () =>
      Effect.gen(function* () {
        const { port } = yield* start()
        const harness = yield* WorkerHarness.make(loadWorker)
        const load = yield* connectionLoad(port)
        for (let round = 0; round < ROUNDS; round++) {
          yield* pressFresh(load)
          let succeeded = 0
          for (let i = 0; i < TASKS; i++) {
            const run = yield* harness.submit({})
            if (run.outcome === "ACKED" && run.messageTypes.at(-1) === "success") succeeded++
            // A turn of the event loop per task, so that the server's callbacks run between tasks.
            yield* nextTurn
          }
          expect(succeeded).toBe(TASKS)
        }
      }).pipe(Effect.scoped, Effect.provideService(References.MinimumLogLevel, "Warn")),
    60_000,
  )
})
