/**
 * Heavy tasks on a real RabbitMQ (the machine's 3.10, and the 4.3 node under
 * `npm run test:rabbitmq4`): a result larger than a message may be concludes its task alone, at
 * once, and the tasks in flight beside it keep their leases.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Effect, Schema } from "effect"
import type * as Settings from "../../src/Settings.ts"
import * as Worker from "../../src/Worker.ts"
import {
  ensureVhosts,
  isRabbitMQ4,
  platform,
  QUORUM_VHOST,
  rabbitmqctl,
  terminal,
  uniqueName,
} from "./broker.ts"
import { heldTask, longTask } from "./longTasks.ts"
import { decisions, runWorker } from "./worker.ts"
import { sleep } from "../support/waits.ts"

const TIMEOUT = 90_000

describe("heavy tasks on RabbitMQ", () => {
  let broker: Awaited<ReturnType<typeof platform>>
  beforeAll(async () => {
    ensureVhosts()
    broker = await platform(QUORUM_VHOST)
  })
  afterAll(() => broker.close())

  /** `big` returns 20 MiB at once; the others work 2 s and return a few bytes. */
  const sized = (name: string, runs: Map<string, number>) =>
    Worker.make({
      name,
      input: Schema.Struct({ text: Schema.String }),
      output: Schema.Struct({ blob: Schema.String }),
      timeout: "30 seconds",
      concurrency: 3,
      handler: async ({ text }, ctx) => {
        runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1)
        if (text === "big") return { blob: "b".repeat(20 * 1024 * 1024) }
        await sleep(2000)
        return { blob: "small" }
      },
    })

  const resultTooLarge = async (overrides: Settings.SettingsOverrides) => {
    const name = uniqueName("heavy")
    const runs = new Map<string, number>()
    const worker = runWorker(sized(name, runs), QUORUM_VHOST, overrides)
    try {
      await broker.waitForQueues(name)
      for (const [id, text] of [["t-left", "a"], ["t-big", "big"], ["t-right", "b"]]) {
        broker.publish(`${name}_queue_in`, broker.envelope(id!, { text }))
      }
      const out = await broker.readUntil(
        `${name}_queue_out`,
        (all) => all.filter(terminal).length === 3,
        60_000,
      )
      const terminals = out.filter(terminal).map((m) => JSON.parse(m.text))
      // The big one first, at once: the others still worked.
      expect(terminals[0]).toEqual({
        task_id: "t-big",
        data: {
          message_type: "failure",
          error_message: { code: "OUTPUT_TOO_LARGE", message: expect.any(String) },
        },
      })
      expect(terminals.slice(1).map((m) => [m.task_id, m.data.message_type]).sort()).toEqual([
        ["t-left", "success"],
        ["t-right", "success"],
      ])
      expect(Object.fromEntries(runs)).toEqual({ "t-left": 1, "t-big": 1, "t-right": 1 })
      const lines = decisions(worker.logs)
      expect(lines).toHaveLength(3)
      expect(lines.find((l) => l.includes("task_id=t-big"))).toContain(
        "outcome=failure action=conclude code=OUTPUT_TOO_LARGE reason=output_too_large attempt=1/5",
      )
      for (const id of ["t-left", "t-right"]) {
        expect(lines.find((l) => l.includes(`task_id=${id}`))).toContain(
          "outcome=success action=conclude attempt=1/5",
        )
      }
      // No connection lost, no lease lost.
      expect(
        worker.logs.filter((l) =>
          /connection .* was lost|lease_|lease was lost|took the task back/.test(l)
        ),
      ).toEqual([])
      // RabbitMQ 3.10 ignores the lease the worker asks for: said once, with what makes it so.
      const lease = worker.logs.filter((l) => l.includes("takes no x-consumer-timeout (3.12"))
      expect(lease).toHaveLength(isRabbitMQ4() ? 0 : 1)
      await worker.stop()
      expect(await broker.count(`${name}_queue_in`)).toBe(0)
      return worker.logs
    } finally {
      await worker.stop()
      await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
    }
  }

  it(
    "a 20 MiB result with default settings: OUTPUT_TOO_LARGE at once after one run; the two tasks beside it succeed, no lease lost",
    async () => {
      const logs = await resultTooLarge({})
      expect(logs.filter((l) => l.includes("closed the publishing channel"))).toEqual([])
    },
    TIMEOUT,
  )

  it.runIf(isRabbitMQ4())(
    "a 20 MiB result the broker refuses (WORKER_MAX_OUTPUT_BYTES above its 16 MiB): only the publishing channel closes; OUTPUT_TOO_LARGE after one run, the tasks beside it succeed",
    async () => {
      const logs = await resultTooLarge({ maxOutputBytes: 64 * 1024 * 1024 })
      expect(logs.filter((l) => l.includes("closed the publishing channel"))).toHaveLength(1)
    },
    TIMEOUT,
  )

  it(
    "an 8 s task on either broker: concluded once, its log fields found after its long wait, its deadline counted down",
    async () => {
      await longTask(broker, QUORUM_VHOST, uniqueName("long"), 8)
    },
    TIMEOUT,
  )

  it.runIf(isRabbitMQ4())(
    "a queue whose consumer-timeout policy (3 s) is shorter than its 8 s task: the worker asks its own lease, the task succeeds once, the next one after it",
    async () => {
      const name = uniqueName("lease")
      rabbitmqctl(
        "set_policy",
        "-p",
        QUORUM_VHOST,
        name,
        `^${name}_queue_in$`,
        '{"consumer-timeout": 3000}',
        "--apply-to",
        "queues",
      )
      try {
        await longTask(broker, QUORUM_VHOST, name, 8)
      } finally {
        rabbitmqctl("clear_policy", "-p", QUORUM_VHOST, name)
      }
    },
    TIMEOUT,
  )

  it.runIf(isRabbitMQ4())(
    "a task 3× longer than the broker's default lease (scaled down to 4 s) succeeds once with WORKER_CONSUMER_TIMEOUT_S set as the docs say",
    async () => {
      const before = rabbitmqctl("eval", "application:get_env(rabbit, consumer_timeout).").trim()
      const restore = /^\{ok,(\d+)\}$/.exec(before)?.[1]
      rabbitmqctl("eval", "application:set_env(rabbit, consumer_timeout, 4000).")
      try {
        await longTask(broker, QUORUM_VHOST, uniqueName("lease-default"), 12)
      } finally {
        rabbitmqctl(
          "eval",
          restore === undefined
            ? "application:unset_env(rabbit, consumer_timeout)."
            : `application:set_env(rabbit, consumer_timeout, ${restore}).`,
        )
      }
    },
    TIMEOUT,
  )

  it.runIf(isRabbitMQ4())(
    "a lease the broker ends (a handler its time limit cannot stop, held past WORKER_CONSUMER_TIMEOUT_S): returned uncounted, counted by the worker as lease_expired, abandoned within the limit; the task behind it succeeds",
    async () => {
      // RabbitMQ 4 cancels the consumer at the lease the worker asked (62 s: the least that a 1 s
      // task timeout, its backoff and 60 s fit under) and returns the message with no
      // x-delivery-count: before the worker counted it, such a task ran again as attempt 1 for
      // ever, and the task behind it never ran.
      const runs = new Map<string, number>()
      const { held, logs } = await heldTask(
        broker,
        QUORUM_VHOST,
        Worker.make({
          name: uniqueName("expired"),
          input: Schema.Struct({ text: Schema.String }),
          output: Schema.Struct({ blob: Schema.String }),
          timeout: "1 second",
          handler: (_input, ctx) =>
            Effect.sync(() => runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1)).pipe(
              Effect.andThen(
                ctx.taskId === "t-held"
                  ? Effect.uninterruptible(Effect.sleep("63 seconds"))
                  : Effect.void,
              ),
              Effect.as({ blob: "done" }),
            ),
        }),
        { consumerTimeout: "62 seconds", deliveryLimit: 2 },
        170_000,
      )
      expect(Object.fromEntries(runs)).toEqual({ "t-held": 2, "t-after": 1 })
      expect(held).toEqual([
        "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_expired attempt=1/2",
        "Delivery settled: outcome=cancelled action=nack-requeue reason=lease_expired attempt=2/2 deliveries=2",
        "Delivery settled: outcome=failure action=conclude code=TASK_ABANDONED_AFTER_REDELIVERIES attempt=3/2 deliveries=3",
      ])
      expect(logs.filter((l) => l.startsWith("The broker took the task back after 6")))
        .toHaveLength(2)
    },
    200_000,
  )
})
