/**
 * A task longer than a short lease and one behind it, on the broker under test (heavy.test.ts) and
 * on a RabbitMQ 3.10 node of a test's own whose `consumer_timeout` is seconds (test/faults): on a
 * worker whose lease they fit in, each concluded once, attempt 1 (`longTask`); held past the
 * broker's lease, abandoned once within the delivery limit, the task behind it run (`heldTask`).
 */
import { expect } from "vitest"
import { Schema } from "effect"
import type * as Settings from "../../src/Settings.ts"
import { logFields } from "../../src/TaskContext.ts"
import * as Worker from "../../src/Worker.ts"
import { type platform, terminal } from "./broker.ts"
import { decisions, runWorker } from "./worker.ts"
import { sleep } from "../support/waits.ts"

/**
 * `t-long` works `seconds`; the others answer at once. What a library logging after the long
 * wait would find (`TaskContext.logFields`), and the time its deadline had left, go to `after`.
 */
const long = (
  name: string,
  seconds: number,
  runs: Map<string, number>,
  after: Map<string, { fields: object; left: number }>,
) =>
  Worker.make({
    name,
    input: Schema.Struct({ text: Schema.String }),
    output: Schema.Struct({ blob: Schema.String }),
    timeout: "30 seconds",
    handler: async (_input, ctx) => {
      runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1)
      if (ctx.taskId === "t-long") {
        await sleep(seconds * 1000)
      }
      after.set(ctx.taskId, { fields: logFields(), left: ctx.deadline - Date.now() })
      return { blob: "done" }
    },
  })

/**
 * `first` and `t-after` behind it published on the queue of the worker `name` once it declared it,
 * and the output read until both are concluded (within `ms`).
 */
const firstAndAfter = async (
  broker: Awaited<ReturnType<typeof platform>>,
  name: string,
  first: string,
  ms: number,
) => {
  await broker.waitForQueues(name)
  broker.publish(`${name}_queue_in`, broker.envelope(first, { text: "a" }))
  broker.publish(`${name}_queue_in`, broker.envelope("t-after", { text: "b" }))
  return await broker.readUntil(
    `${name}_queue_out`,
    (all) => all.filter(terminal).length === 2,
    ms,
  )
}

/**
 * A task `seconds` long and one behind it, on a worker of `vhost` whose `WORKER_CONSUMER_TIMEOUT_S`
 * is 120 s (the task's timeout, the backoff and 60 s fit), `overrides` added: each concluded once,
 * attempt 1, no lease lost.
 */
export const longTask = async (
  broker: Awaited<ReturnType<typeof platform>>,
  vhost: string,
  name: string,
  seconds: number,
  overrides: Settings.SettingsOverrides = {},
) => {
  const runs = new Map<string, number>()
  const after = new Map<string, { fields: object; left: number }>()
  const worker = runWorker(long(name, seconds, runs, after), vhost, {
    consumerTimeout: "120 seconds",
    ...overrides,
  })
  try {
    const out = await firstAndAfter(broker, name, "t-long", (seconds + 30) * 1000)
    expect(out.filter(terminal).map((m) => [JSON.parse(m.text).task_id, m.type])).toEqual([
      ["t-long", "success"],
      ["t-after", "success"],
    ])
    expect(Object.fromEntries(runs)).toEqual({ "t-long": 1, "t-after": 1 })
    // After its long wait the task still finds its own fields, and its deadline moved on (by the
    // wait, less a second: a timer may fire a millisecond before the wall clock says it is due).
    expect(after.get("t-long")!.fields).toEqual({ task_id: "t-long", service: name, attempt: 1 })
    expect(after.get("t-long")!.left).toBeLessThanOrEqual((30 - seconds + 1) * 1000)
    expect(after.get("t-long")!.left).toBeGreaterThan(0)
    const lines = decisions(worker.logs)
    expect(lines).toHaveLength(2)
    for (const line of lines) {
      expect(line).toContain("outcome=success action=conclude attempt=1/5")
    }
    expect(worker.logs.filter((l) => /lease_|lost|cancelled the consumer/.test(l))).toEqual([])
  } finally {
    await worker.stop()
    await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
  }
}

/**
 * `t-held`, which `worker` holds past the broker's lease, and `t-after` behind it, on `vhost`
 * (`overrides` added to the worker's settings), within `ms`: `t-held` concluded once,
 * `TASK_ABANDONED_AFTER_REDELIVERIES`, and `t-after` a success at attempt 1; nothing left on the
 * input queue. What came out, `t-held`'s decision lines (up to their fields) and the worker's log.
 */
export const heldTask = async <A, I, O>(
  broker: Awaited<ReturnType<typeof platform>>,
  vhost: string,
  worker: Worker.Worker<A, I, O, never>,
  overrides: Settings.SettingsOverrides & { readonly deliveryLimit: number },
  ms: number,
) => {
  const { name } = worker
  const running = runWorker(worker, vhost, overrides)
  try {
    const out = await firstAndAfter(broker, name, "t-held", ms)
    const terminals = out.filter(terminal).map((m) => JSON.parse(m.text))
    expect(terminals.map((m) => [m.task_id, m.data.message_type])).toEqual([
      ["t-held", "failure"],
      ["t-after", "success"],
    ])
    expect(terminals[0].data.error_message.code).toBe("TASK_ABANDONED_AFTER_REDELIVERIES")
    const lines = decisions(running.logs)
    expect(lines.find((l) => l.includes("task_id=t-after"))).toContain(
      `outcome=success action=conclude attempt=1/${overrides.deliveryLimit}`,
    )
    await running.stop()
    expect(await broker.count(`${name}_queue_in`)).toBe(0)
    const held = lines.filter((l) => l.includes("task_id=t-held"))
    return { out, logs: running.logs, held: held.map((l) => l.slice(0, l.indexOf(" service="))) }
  } finally {
    await running.stop()
    await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
  }
}
