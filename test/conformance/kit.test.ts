/**
 * The conformance kit on the real RabbitMQ (a quorum vhost), on the runtime running this file:
 * against the SDK's own conformance worker (examples/conformance/worker.ts, run by the CLI: Deno
 * from the sources, Node from dist/) every rule passes; against the workers of
 * test/fixtures/conformance/, written on raw amqplib, the one without a defect passes too, and
 * each of the others fails the rule it breaks.
 */
import { join } from "node:path"
import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Conformance from "../../src/Conformance.ts"
import { ensureVhosts, QUORUM_VHOST, uniqueName, urlFor } from "../integration/broker.ts"
import { checkBuild, ROOT, type Runtime, runtimeSpec } from "../support/runtimes.ts"
import { MAX_MESSAGE_BYTES, type ServedWorker, serveWorker } from "./support.ts"

const runtime: Runtime = "deno" in process.versions ? "deno" : "node"

const running: Array<ServedWorker> = []
const sources: Array<string> = []
beforeAll(() => {
  ensureVhosts()
  if (runtime === "node") checkBuild()
}, 60_000)
afterAll(() => Promise.all(running.map((w) => w.stop())), 30_000)

/** The kit's report on `service`, whose worker `serve` starts. */
const check = async (service: string, serve: () => ServedWorker) => {
  const worker = serve()
  running.push(worker)
  await worker.started
  return Conformance.run({
    brokerUrl: urlFor(QUORUM_VHOST),
    service,
    deliveryLimit: 3,
    maxMessageBytes: MAX_MESSAGE_BYTES,
    // No unacked source given: the kit finds the one of the broker under test (the machine's
    // RabbitMQ 3 has no management API: its rabbitmqctl; the RabbitMQ 4 node its management API).
    log: (line) => void (line.startsWith("The unacked count") && sources.push(line)),
  })
}

const failedRules = (report: Conformance.ConformanceReport) =>
  report.rules.filter((r) => r.verdict !== "pass").map((r) => r.id)

/** Each raw fixture, and the rules it must fail: none for the one without a defect. */
const FIXTURES: ReadonlyArray<readonly [string, ReadonlyArray<string>]> = [
  ["correct", []],
  // Without started, the attempts cannot be counted either.
  ["no-started", ["started-first", "retries-counted"]],
  ["pretty-json", ["bytes-exact"]],
  ["progress-back", ["progress-monotonic"]],
  ["terminal-twice", ["one-terminal"]],
  ["poison-failure", ["poison-silent"]],
  ["unacked-success", ["queue-drained"]],
]

describe(`the conformance kit, ${runtime}`, () => {
  it("passes every rule against the SDK's conformance worker", async () => {
    const service = uniqueName("conformance")
    const spec = runtimeSpec(runtime)
    const report = await check(
      service,
      () =>
        serveWorker(spec.command, [
          ...spec.args,
          "run",
          join(ROOT, "examples/conformance/worker.ts"),
        ], service),
    )
    console.log(Conformance.format(report))
    expect(failedRules(report)).toEqual([])
    expect(report.passed).toBe(true)
    expect(sources).toHaveLength(1)
    expect(sources[0]).toMatch(/^The unacked count: from (the management API at|rabbitmqctl)/)
  }, 120_000)

  it("names the rule each broken worker breaks, and only that", async () => {
    const reports = await Promise.all(FIXTURES.map(([fixture]) => {
      const service = uniqueName(`conformance-${fixture}`)
      const script = join(ROOT, "test/fixtures/conformance", `${fixture}.mjs`)
      const args = runtime === "deno" ? ["run", "-A", script] : [script]
      return check(service, () => serveWorker(process.execPath, args, service))
    }))
    for (const [i, [fixture, broken]] of FIXTURES.entries()) {
      const report = reports[i]!
      console.log(`${fixture}:\n${Conformance.format(report)}`)
      expect(failedRules(report), fixture).toEqual(broken)
      expect(report.passed, fixture).toBe(broken.length === 0)
    }
  }, 180_000)
})
