/**
 * The chaos suite's smaller run, for CI (issue 15): two worker processes run by the CLI (on the
 * runtime running this file: Deno from the sources, Node from dist/) on a quorum vhost, 1 500
 * tasks, 4 connections closed by the broker, a broker `stop_app` / `start_app` and a `kill -9`,
 * all while tasks are in flight. `npm run chaos` is the full one (test/chaos/chaos.ts).
 *
 * Run alone (vitest.alone.config.ts): it restarts the broker. On Node it needs dist/ built from
 * the current sources (`npm run build`); CHAOS_ALLOW_STALE_BUILD=1 runs an older dist/ anyway.
 */
import { rmSync } from "node:fs"
import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  checkReport,
  formatReport,
  killAllWorkers,
  runChaos,
  type Runtime,
} from "../chaos/chaos.ts"
import { ensureBrokerRunning } from "../integration/broker.ts"

const runtime: Runtime = "deno" in process.versions ? "deno" : "node"
const allowStaleBuild = process.env.CHAOS_ALLOW_STALE_BUILD === "1"

beforeAll(() => ensureBrokerRunning(), 120_000)
afterAll(() => {
  // Whatever failed: no worker left running, and the broker up.
  killAllWorkers()
  ensureBrokerRunning()
}, 120_000)

describe(`chaos, ${runtime} workers`, () => {
  it(
    "counts a task never published as lost, and a task published twice as a duplicate",
    async () => {
      // The accounting itself: with no fault, nothing was in flight at any fault (a bound of 0),
      // so these are exactly what the real run's assertions must catch.
      const report = await runChaos({
        tasks: 200,
        closes: 0,
        kills: 0,
        restartBroker: false,
        concurrency: 20,
        runtime,
        workers: 1,
        taskMs: [1, 5],
        dropTasks: 3,
        duplicateTasks: 2,
        stallMs: 10_000,
        allowStaleBuild,
      })
      console.log(formatReport(report))
      expect(report.lost).toBe(3)
      expect(report.lostIds).toEqual(
        ["-0", "-1", "-2"].map((s) => report.queues.in.replace("_queue_in", s)),
      )
      expect(report.duplicates).toBe(2)
      expect(report.inFlightBound).toBe(0)
      expect(report.duplicates).toBeGreaterThan(report.inFlightBound)
      expect(report.workers.map((w) => w.exitCode)).toEqual([0])
      expect(checkReport(report)).toEqual([
        "3 tasks lost",
        "2 duplicates, over the in-flight bound 0",
      ])
    },
    120_000,
  )

  it(
    "1 500 tasks through 4 closed connections, a broker restart and a kill -9: none lost, duplicates within what was in flight",
    async () => {
      const report = await runChaos({
        tasks: 1_500,
        closes: 4,
        kills: 1,
        restartBroker: true,
        concurrency: 20,
        runtime,
        // Slower tasks than the full run's (20-80 ms), so that the faults, half a second of
        // `rabbitmqctl` each, all strike with a backlog left and tasks in flight.
        taskMs: [100, 300],
        faultWindow: [0.05, 0.7],
        stallMs: 30_000,
        timeoutMs: 120_000,
        allowStaleBuild,
      })
      console.log(formatReport(report))
      // Every fault struck, while tasks were still to conclude, and with some in flight.
      expect(report.faults.map((f) => f.kind).sort()).toEqual(
        ["close", "close", "close", "close", "kill", "restart"],
      )
      for (const f of report.faults) expect(f.concluded).toBeLessThan(report.tasks)
      expect(report.inFlightBound).toBeGreaterThan(0)
      // The promise: no task lost, and a task concluded twice only if it was in flight at a fault.
      expect(report.lostIds).toEqual([])
      expect(report.lost).toBe(0)
      expect(report.duplicates).toBeLessThanOrEqual(report.inFlightBound)
      expect(report.failuresByCode).toEqual({})
      expect(checkReport(report)).toEqual([])
      // The workers came back after the broker did, and the last ones stopped cleanly on SIGTERM
      // within the shutdown bound (max(5, 5) + 17 s).
      expect(report.recovery?.firstSettledMs).toBeDefined()
      const stopped = report.workers.filter((w) => w.end !== "killed")
      expect(stopped).toHaveLength(2)
      for (const w of stopped) {
        expect(w.exitCode, `${w.label}: ${w.end}`).toBe(0)
        expect(w.stopMs).toBeLessThan(22_000)
      }
      rmSync(report.logDir, { recursive: true, force: true })
    },
    170_000,
  )
})
