/**
 * Leases on RabbitMQ 3.10 (issue 35), on a node of this file's own (test/chaos/cluster-nodes.ts):
 * 3.10 ignores the `x-consumer-timeout` the worker asks and has no consumer-timeout policy, so its
 * lease is the node's `consumer_timeout`, which the machine's shared node must keep as it is.
 * This node's is scaled down from the default 30 minutes to 4 s, and its channels' tick from 60 s
 * to 1 s: 3.10 checks a channel's consumer timeouts on that tick (`channel_tick_interval`), and
 * with the default tick a 3 s `consumer_timeout` took an unacked delivery back only 60 s after it
 * came (measured with a plain amqplib consumer); with a 1 s tick, 3 to 4 s after. It does so by
 * closing the channel (406 PRECONDITION_FAILED, "delivery acknowledgement on channel N timed
 * out"), and counts the return in `x-delivery-count`.
 *
 * Run alone (vitest.alone.config.ts): it starts a RabbitMQ node (AMQP on 127.0.0.1:5711, away from
 * the cluster suite's 5701-5703 and the 4.3 node's 5681), and stops and removes it at the end,
 * whatever happened. The machine's broker is not touched. Some 60 s, on each runtime of the alone
 * passes: the worker runs in this process, on the runtime running the file.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { setTimeout as delay } from "node:timers/promises"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Schema } from "effect"
import * as Worker from "../../src/Worker.ts"
import { type Cluster, makeCluster } from "../chaos/cluster-nodes.ts"
import { platform, QUORUM_VHOST, terminal, uniqueName } from "../integration/broker.ts"
import { heldTask, longTask } from "../integration/longTasks.ts"

/** The broker's default lease, 30 minutes, scaled down. */
const DEFAULT_LEASE_MS = 4000

let cluster: Cluster | undefined
let base: string | undefined

const node = () => cluster!.nodes[0]!
const url = () =>
  `amqp://guest:guest@127.0.0.1:${node().amqpPort}/${encodeURIComponent(QUORUM_VHOST)}`
const leaseOfNode = async () =>
  (await cluster!.ctl(node(), "eval", "application:get_env(rabbit, consumer_timeout).")).trim()

/**
 * The node with `consumer_timeout = ms` in its rabbitmq.conf: stopped and started again with it
 * unless it has it (3.10 reads it at boot, and each channel when it opens).
 */
const nodeLease = async (ms: number) => {
  if ((await leaseOfNode()) === `{ok,${ms}}`) return
  await cluster!.stop(node())
  await cluster!.restart(node(), [`consumer_timeout = ${ms}`])
}

/** The platform's side on the node's quorum vhost, for the length of `body`. */
const withPlatform = async <A>(
  body: (broker: Awaited<ReturnType<typeof platform>>) => Promise<A>,
) => {
  const broker = await platform(QUORUM_VHOST, url())
  try {
    return await body(broker)
  } finally {
    await broker.close()
  }
}

beforeAll(async () => {
  base = mkdtempSync(join(tmpdir(), "async-task-leases310-"))
  cluster = makeCluster({
    baseDir: base,
    firstPort: 5711,
    count: 1,
    prefix: "lease",
    config: [`consumer_timeout = ${DEFAULT_LEASE_MS}`],
    advanced: "[{rabbit, [{channel_tick_interval, 1000}]}].\n",
  })
  await cluster.start()
  await cluster.ctl(node(), "add_vhost", QUORUM_VHOST, "--default-queue-type", "quorum")
  await cluster.ctl(node(), "set_permissions", "-p", QUORUM_VHOST, "guest", ".*", ".*", ".*")
}, 120_000)

afterAll(async () => {
  await cluster?.stopAll()
  if (base !== undefined) rmSync(base, { recursive: true, force: true })
}, 120_000)

describe("leases on RabbitMQ 3.10, its consumer_timeout scaled down", () => {
  /**
   * `t-held` (10 s, past the node's 4 s lease) and `t-after` behind it, on a worker with the
   * default WORKER_CONSUMER_TIMEOUT_S (30 minutes, which 3.10 cannot be asked for) and
   * WORKER_DELIVERY_LIMIT=3: `t-held` abandoned once, `t-after` a success (`heldTask`); `t-held`'s
   * runs and decision lines. Its handler stops at its signal (a lost lease fires it) if
   * `stopsAtSignal`, as the docs ask of an async handler; else it keeps its slot for its 10 s.
   */
  const leaseShorterThanTask = async (stopsAtSignal: boolean) => {
    await nodeLease(DEFAULT_LEASE_MS)
    const runs = new Map<string, number>()
    const { out, held } = await withPlatform((broker) =>
      heldTask(
        broker,
        QUORUM_VHOST,
        Worker.make({
          name: uniqueName("lease310"),
          input: Schema.Struct({ text: Schema.String }),
          output: Schema.Struct({ blob: Schema.String }),
          timeout: "30 seconds",
          handler: async (_input, ctx) => {
            runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1)
            if (ctx.taskId === "t-held") {
              await delay(10_000, undefined, stopsAtSignal ? { signal: ctx.signal } : {})
            }
            return { blob: "done" }
          },
        }),
        { brokerUrl: url(), deliveryLimit: 3 },
        60_000,
      )
    )
    expect(runs.get("t-after")).toBe(1)
    // A `started` for each run, nothing else before the one terminal message of each task.
    expect(out.filter((m) => !terminal(m)).map((m) => m.type)).toEqual(
      Array(runs.get("t-held")! + 1).fill("started"),
    )
    return { runs: runs.get("t-held")!, held }
  }

  it(
    "a 10 s task whose handler stops at its signal: the broker closes the channel at each 4 s lease and counts the return; 3 runs, then TASK_ABANDONED_AFTER_REDELIVERIES at attempt 4/3, once; the task after it succeeds",
    async () => {
      const { runs, held } = await leaseShorterThanTask(true)
      expect(runs).toBe(3)
      expect(held).toEqual([
        "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_channel_closed attempt=1/3",
        "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_channel_closed attempt=2/3",
        "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_channel_closed attempt=3/3",
        "Delivery settled: outcome=failure action=conclude code=TASK_ABANDONED_AFTER_REDELIVERIES attempt=4/3",
      ])
    },
    90_000,
  )

  it(
    "a 10 s task whose handler ignores its signal keeps its slot: a delivery waiting for it loses its lease as well (counted by 3.10); still concluded once, TASK_ABANDONED_AFTER_REDELIVERIES, run at most 3 times; the task after it succeeds",
    async () => {
      // Measured: runs at attempts 1 and 3, attempts 2 and 4 lost while the slot was held,
      // abandoned at attempt 5/3. How many deliveries a held slot costs is a matter of timing:
      // what holds whatever the timing is asserted.
      const { runs, held } = await leaseShorterThanTask(false)
      expect(runs).toBeGreaterThanOrEqual(1)
      expect(runs).toBeLessThanOrEqual(3)
      const last = held.length
      expect(last).toBeGreaterThanOrEqual(4)
      held.slice(0, -1).forEach((line, i) =>
        expect(line).toMatch(
          new RegExp(
            `^Delivery settled: outcome=cancelled action=nack-requeue reason=lease_(channel_closed|lost) attempt=${
              i + 1
            }/3$`,
          ),
        )
      )
      expect(held.at(-1)).toBe(
        `Delivery settled: outcome=failure action=conclude code=TASK_ABANDONED_AFTER_REDELIVERIES attempt=${last}/3`,
      )
    },
    90_000,
  )

  it(
    "a task 3× longer than the node's default lease succeeds once, attempt 1, with consumer_timeout raised in its rabbitmq.conf and WORKER_CONSUMER_TIMEOUT_S set to it, as docs/deployment.md says",
    async () => {
      await nodeLease(120_000)
      expect(await leaseOfNode()).toBe("{ok,120000}")
      await withPlatform((broker) =>
        longTask(broker, QUORUM_VHOST, uniqueName("lease310-raised"), 12, {
          brokerUrl: url(),
          consumerTimeout: "120 seconds",
        })
      )
    },
    120_000,
  )
})
