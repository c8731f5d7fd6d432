/**
 * The cluster fault suite's smaller run, for CI (issue 24): three RabbitMQ nodes of its own
 * beside the machine's broker (test/chaos/cluster-nodes.ts), two worker processes of the CLI (on
 * the runtime running this file: Deno from the sources, Node from dist/) given the three nodes in
 * `BROKER_URL`, and two faults while tasks are in flight: the input queue's leader killed, then a
 * worker's own node stopped and another's killed. `npm run chaos:cluster` is the whole suite.
 *
 * Run alone (vitest.alone.config.ts): three more brokers on two cores. It stops its nodes at the
 * end, whatever happened; the machine's broker is not touched.
 */
import { rmSync } from "node:fs"
import process from "node:process"
import { afterAll, describe, expect, it } from "vitest"
import { killAllWorkers } from "../chaos/chaos.ts"
import { type ClusterOptions, formatReport, parseArgs, runCluster } from "../chaos/cluster.ts"
import type { Cluster } from "../chaos/cluster-nodes.ts"

const runtime = "deno" in process.versions ? "deno" : "node"

let cluster: Cluster | undefined
let base: string | undefined

afterAll(async () => {
  killAllWorkers()
  await cluster?.stopAll()
  if (base !== undefined) rmSync(base, { recursive: true, force: true })
}, 120_000)

describe(`a RabbitMQ cluster, ${runtime} workers`, () => {
  it(
    "a queue leader killed, a worker's own node stopped: none lost, no terminal message twice, consuming again from another node within 5 s",
    async () => {
      // 800 tasks a fault, some 10 s of work for the two workers: a backlog left when the
      // worker whose node stopped comes back, seconds later, for it to take its next task from.
      const options = parseArgs([
        "--tasks",
        "2400",
        "--faults",
        "kill-input-leader,own-node-stopped",
        "--runtime",
        runtime,
      ]) as ClusterOptions
      const report = await runCluster(
        options,
        (line) => console.log(line),
        (c, b) => ((cluster = c), (base = b)),
      )
      console.log(formatReport(report, options))
      expect(report.lost).toBe(0)
      expect(report.extraCopies).toBe(0)
      const stopped = report.rows.find((row) => row.step === "own node stop_app")!
      // The worker on the stopped node gave its connection up, and took tasks again elsewhere.
      expect(stopped.givenUpS).toBeDefined()
      expect(stopped.backS).toBeLessThanOrEqual(5)
      for (const row of report.rows) expect(row.lost, row.step).toBe(0)
    },
    300_000,
  )
})
