import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  Cause,
  Effect,
  Exit,
  Logger,
  Option,
  Redacted,
  References,
  Schema,
  SubscriptionRef,
} from "effect"
import * as AmqpTransport from "../../src/AmqpTransport.ts"
import * as Worker from "../../src/Worker.ts"
import { FatalError, RetryableError, TransportError } from "../../src/WorkerError.ts"
import {
  BROKER_PORT,
  CLASSIC_VHOST,
  ensureVhosts,
  isRabbitMQ4,
  platform,
  QUORUM_VHOST,
  rabbitmqctl,
  terminal,
  uniqueName,
  urlFor,
} from "./broker.ts"
import { decisions, runWorker } from "./worker.ts"
import { pollUntil, sleep } from "../support/waits.ts"

const TIMEOUT = 60_000

/** Publishes to `queue` until it refuses one (a policy takes a moment to apply). */
const waitUntilRefused = async (broker: Awaited<ReturnType<typeof platform>>, queue: string) => {
  const deadline = Date.now() + 20_000
  while (Date.now() < deadline) {
    broker.publish(queue, "{}")
    const refused = await broker.confirmed().then(() => false, () => true)
    if (refused) return
    // A quorum queue takes one message past its limit before it refuses: it stays there.
    await sleep(100)
  }
  throw new Error(`${queue} still accepts publishes`)
}

const Input = Schema.Struct({ text: Schema.String })
const Output = Schema.Struct({ words: Schema.Number })

const wordCounter = (name: string) =>
  Worker.make({
    name,
    input: Input,
    output: Output,
    timeout: "10 seconds",
    handler: (input) =>
      input.text.trim() === ""
        ? Effect.fail(new FatalError({ code: "EMPTY_TEXT", message: "There is nothing to count." }))
        : Effect.succeed({ words: input.text.trim().split(/\s+/).length }),
  })

/** A worker whose handler notes each attempt in `attempts`, then fails with a RetryableError. */
const alwaysRetrying = (name: string, attempts: Array<number>) =>
  Worker.make({
    name,
    input: Input,
    output: Output,
    timeout: "10 seconds",
    handler: (_input, ctx) =>
      Effect.sync(() => attempts.push(ctx.attempt)).pipe(
        Effect.andThen(
          Effect.fail(new RetryableError({ code: "UPSTREAM_DOWN", message: "Down." })),
        ),
      ),
  })

/**
 * Declares `name`'s input queue and puts a task on it whose first `lost` deliveries were lost
 * with their worker (each a failed delivery, on every RabbitMQ).
 */
const seedLostTask = async (
  broker: Awaited<ReturnType<typeof platform>>,
  name: string,
  taskId: string,
  lost: number,
) => {
  await broker.declare(`${name}_queue_in`, { durable: true })
  broker.publish(`${name}_queue_in`, broker.envelope(taskId, { text: "a" }))
  await broker.redeliver(`${name}_queue_in`, lost)
}

/** A transport of capacity 1 on `name`'s queues at `url`, with `options` of its own. */
const transportOf = (
  url: string,
  name: string,
  options: Partial<AmqpTransport.AmqpTransportOptions> = {},
) =>
  AmqpTransport.make({
    url: Redacted.make(url),
    inQueue: `${name}_queue_in`,
    outQueue: `${name}_queue_out`,
    capacity: 1,
    ...options,
  })

/** A transport's first `take`: how it failed, and everything its failure prints. */
const firstTake = async (url: string, name: string) => {
  const exit = await Effect.runPromiseExit(
    Effect.scoped(Effect.gen(function* () {
      const transport = yield* transportOf(url, name)
      return yield* transport.take
    })).pipe(Effect.provideService(References.MinimumLogLevel, "None")),
  )
  const failure = Exit.isFailure(exit)
    ? Option.getOrUndefined(Cause.findErrorOption(exit.cause))
    : undefined
  const text = JSON.stringify(exit) + (Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "")
  return { failure, text }
}

/**
 * A transport on a vhost the broker refuses: its first `take`'s failure, and what it logged until
 * a moment after (at info level and above, as `level message`).
 */
const refusedVhost = async (vhost: string) => {
  const logs: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    logs.push(`${logLevel} ${Array.isArray(message) ? message.join(" ") : String(message)}`)
  })
  const name = uniqueName("vhost")
  const exit = await Effect.runPromiseExit(
    Effect.scoped(Effect.gen(function* () {
      const transport = yield* transportOf(urlFor(vhost), name, {
        reconnectBase: "10 millis",
        reconnectMax: "20 millis",
      })
      const failure = yield* Effect.flip(transport.take)
      // Time for a dozen reconnection attempts, were there any.
      yield* Effect.sleep("300 millis")
      return failure
    })).pipe(
      Effect.provide(Logger.layer([logger])),
      Effect.provideService(References.MinimumLogLevel, "Info"),
    ),
  )
  if (Exit.isFailure(exit)) throw new Error(Cause.pretty(exit.cause))
  return { failure: exit.value, logs }
}

/** A vhost guest has no permissions on (`add_vhost` grants none). */
const FORBIDDEN_VHOST = "async-task-worker-forbidden"

beforeAll(() => {
  ensureVhosts()
  // Fails once it exists (made by an earlier run, or by test/internal/amqp/connect.test.ts).
  rabbitmqctl("add_vhost", FORBIDDEN_VHOST, { ignoreFailure: true })
}, TIMEOUT)

describe("AmqpTransport on RabbitMQ", () => {
  for (const vhost of [QUORUM_VHOST, CLASSIC_VHOST]) {
    describe(vhost === QUORUM_VHOST ? "quorum queues" : "classic queues", () => {
      let broker: Awaited<ReturnType<typeof platform>>
      beforeAll(async () => {
        broker = await platform(vhost)
      })
      afterAll(() => broker.close())

      it(
        "concludes success and failure with the exact bytes and properties, then acks",
        async () => {
          const name = uniqueName("words")
          const worker = runWorker(wordCounter(name), vhost, {})
          try {
            // The worker declares the queues; wait for them before publishing.
            await broker.waitForQueues(name)
            broker.publish(`${name}_queue_in`, broker.envelope("t-ok", { text: "hello big world" }))
            broker.publish(`${name}_queue_in`, broker.envelope("t-empty", { text: " " }))
            const out = await broker.readUntil(
              `${name}_queue_out`,
              (all) => all.filter(terminal).length === 2,
            )
            expect(out.map((m) => m.text)).toEqual([
              `{"task_id":"t-ok","data":{"message_type":"started","hostname":"${
                out[0]!.text.match(/"hostname":"([^"]*)"/)![1]
              }"}}`,
              `{"task_id":"t-ok","data":{"message_type":"success","response":{"words":3}}}`,
              expect.stringContaining(`"task_id":"t-empty","data":{"message_type":"started"`),
              `{"task_id":"t-empty","data":{"message_type":"failure","error_message":{"code":"EMPTY_TEXT","message":"There is nothing to count."}}}`,
            ])
            for (const m of out) {
              expect(m.contentType).toBe("application/json")
              expect(m.deliveryMode).toBe(2)
              expect(m.type).toBe(JSON.parse(m.text).data.message_type)
            }
            // The same id for every copy of a message: task, attempt, its delivery's id, type.
            const delivery = (task: string) =>
              out.find((m) => m.messageId?.startsWith(`${task}:1:`))?.messageId?.split(":")[2]
            expect(delivery("t-ok")).toMatch(/^[0-9a-z]{8}$/)
            expect(delivery("t-empty")).toMatch(/^[0-9a-z]{8}$/)
            expect(out.map((m) => m.messageId)).toEqual([
              `t-ok:1:${delivery("t-ok")}:started`,
              `t-ok:1:${delivery("t-ok")}:success`,
              `t-empty:1:${delivery("t-empty")}:started`,
              `t-empty:1:${delivery("t-empty")}:failure`,
            ])
            await worker.stop()
            expect(await broker.count(`${name}_queue_in`)).toBe(0)
          } finally {
            await worker.stop()
            await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
          }
        },
        TIMEOUT,
      )

      it(
        "acks poison without publishing, and answers an invalid envelope with INVALID_MESSAGE",
        async () => {
          const name = uniqueName("poison")
          const worker = runWorker(wordCounter(name), vhost, {})
          try {
            await broker.waitForQueues(name)
            broker.publish(`${name}_queue_in`, "not json at all")
            broker.publish(`${name}_queue_in`, JSON.stringify({ task_id: "t-bad", data: "x" }))
            const out = await broker.readUntil(
              `${name}_queue_out`,
              (all) => all.filter(terminal).length === 1,
            )
            expect(out.map((m) => m.type)).toEqual(["failure"])
            expect(JSON.parse(out[0]!.text).data.error_message.code).toBe("INVALID_MESSAGE")
            await worker.stop()
            expect(await broker.count(`${name}_queue_in`)).toBe(0)
            expect(decisions(worker.logs).map((l) => l.match(/outcome=(\w+)/)![1]).sort()).toEqual([
              "poison",
              "poison",
            ])
          } finally {
            await worker.stop()
            await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
          }
        },
        TIMEOUT,
      )

      it(
        vhost === QUORUM_VHOST
          ? "retries with the real x-delivery-count until the delivery limit, then concludes"
          : "a classic queue gives a retried task one retry, with a warning",
        async () => {
          const name = uniqueName("retry")
          const attempts: Array<number> = []
          const worker = runWorker(alwaysRetrying(name, attempts), vhost, { deliveryLimit: 3 })
          try {
            await broker.waitForQueues(name)
            broker.publish(`${name}_queue_in`, broker.envelope("t-retry", { text: "a" }))
            const out = await broker.readUntil(`${name}_queue_out`, (all) => all.some(terminal))
            const failure = JSON.parse(out.find(terminal)!.text)
            expect(failure.data.error_message.code).toBe("UPSTREAM_DOWN")
            if (vhost === QUORUM_VHOST) {
              expect(attempts).toEqual([1, 2, 3])
              expect(out.map((m) => m.type)).toEqual(["started", "started", "started", "failure"])
              expect(out.at(-1)!.messageId).toMatch(/^t-retry:3:[0-9a-z]{8}:failure$/)
              // Counted by the broker on 3.x and on 4: no quorum queue taken for a classic one.
              expect(worker.logs.filter((l) => l.includes("redelivered flag"))).toEqual([])
            } else {
              expect(attempts).toEqual([1, 2])
              expect(worker.logs.filter((l) => l.includes("only a redelivered flag"))).toHaveLength(
                1,
              )
            }
            await worker.stop()
            expect(await broker.count(`${name}_queue_in`)).toBe(0)
          } finally {
            await worker.stop()
            await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
          }
        },
        TIMEOUT,
      )
    })
  }

  it(
    "a task once lost with a worker, then failing: concluded within the limit",
    async () => {
      const broker = await platform(QUORUM_VHOST)
      const name = uniqueName("lost-then-failing")
      const attempts: Array<number> = []
      try {
        await seedLostTask(broker, name, "t-lost", 1)
        const worker = runWorker(alwaysRetrying(name, attempts), QUORUM_VHOST, { deliveryLimit: 3 })
        try {
          await broker.waitForQueues(name)
          const out = await broker.readUntil(`${name}_queue_out`, (all) => all.some(terminal))
          expect(attempts).toEqual([2, 3])
          expect(out.map((m) => m.type)).toEqual(["started", "started", "failure"])
          expect(JSON.parse(out.at(-1)!.text).data.error_message.code).toBe("UPSTREAM_DOWN")
          await worker.stop()
          expect(await broker.count(`${name}_queue_in`)).toBe(0)
          expect(decisions(worker.logs).map((l) => l.match(/attempt=\S+/)![0])).toEqual([
            "attempt=2/3",
            "attempt=3/3",
          ])
        } finally {
          await worker.stop()
        }
      } finally {
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
        await broker.close()
      }
    },
    TIMEOUT,
  )

  it(
    "a task requeued by three shutdowns in a row, then run to success: not a failed attempt on RabbitMQ 4",
    async () => {
      const broker = await platform(QUORUM_VHOST)
      const name = uniqueName("drained")
      const seen: Array<readonly [number, number]> = []
      const lines: Array<string> = []
      // Each of the first three workers is stopped while the handler runs: a shutdown's requeue.
      const worker = (last: boolean) =>
        runWorker(
          Worker.make({
            name,
            input: Input,
            output: Output,
            timeout: "10 seconds",
            handler: (_input, ctx) =>
              Effect.sync(() => seen.push([ctx.attempt, ctx.deliveries])).pipe(
                Effect.andThen(last ? Effect.succeed({ words: 1 }) : Effect.never),
              ),
          }),
          QUORUM_VHOST,
          { shutdownGrace: "0 seconds" },
        )
      try {
        await broker.declare(`${name}_queue_in`, { durable: true })
        broker.publish(`${name}_queue_in`, broker.envelope("t-drained", { text: "a" }))
        for (let i = 0; i < 3; i++) {
          const stopped = worker(false)
          await pollUntil(`run ${i + 1} of the handler`, () => seen.length === i + 1, {
            ms: 20_000,
            every: 20,
          })
          await stopped.stop()
          lines.push(...decisions(stopped.logs))
        }
        const last = worker(true)
        try {
          await broker.waitForQueues(name)
          const out = await broker.readUntil(`${name}_queue_out`, (all) => all.some(terminal))
          expect(out.at(-1)!.type).toBe("success")
          await pollUntil("the decision line", () => decisions(last.logs).length === 1, {
            ms: 20_000,
            every: 20,
          })
          lines.push(...decisions(last.logs))
        } finally {
          await last.stop()
        }
        expect(lines.map((l) => l.match(/outcome=(\w+) action=(\S+)/)!.slice(1, 3))).toEqual([
          ["shutdown_requeued", "nack-requeue"],
          ["shutdown_requeued", "nack-requeue"],
          ["shutdown_requeued", "nack-requeue"],
          ["success", "conclude"],
        ])
        if (isRabbitMQ4()) {
          // A nack is no failed delivery: the handler sees attempt 1 each time, and the
          // decision lines the deliveries (the broker's acquired count, from the second on).
          expect(seen).toEqual([[1, 1], [1, 2], [1, 3], [1, 4]])
          expect(lines.map((l) => l.match(/attempt=\S+( deliveries=\d+)?/)![0])).toEqual([
            "attempt=1/5",
            "attempt=1/5 deliveries=2",
            "attempt=1/5 deliveries=3",
            "attempt=1/5 deliveries=4",
          ])
        } else {
          // RabbitMQ 3 counts every return in x-delivery-count: each shutdown spends an attempt.
          expect(seen).toEqual([[1, 1], [2, 2], [3, 3], [4, 4]])
        }
      } finally {
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
        await broker.close()
      }
    },
    TIMEOUT,
  )

  it(
    "a delivery past the limit (a crash loop) is concluded without running the handler",
    async () => {
      const broker = await platform(QUORUM_VHOST)
      const name = uniqueName("crashloop")
      let ran = false
      try {
        // Five deliveries that never settle, as workers that crash would leave them.
        await seedLostTask(broker, name, "t-loop", 5)
        const worker = runWorker(
          Worker.make({
            name,
            input: Input,
            output: Output,
            timeout: "10 seconds",
            handler: () => Effect.sync(() => (ran = true)).pipe(Effect.as({ words: 0 })),
          }),
          QUORUM_VHOST,
          { deliveryLimit: 3 },
        )
        try {
          await broker.waitForQueues(name)
          const out = await broker.readUntil(`${name}_queue_out`, (all) => all.some(terminal))
          expect(out.map((m) => m.type)).toEqual(["failure"])
          expect(JSON.parse(out[0]!.text).data.error_message.code).toBe(
            "TASK_ABANDONED_AFTER_REDELIVERIES",
          )
          expect(ran).toBe(false)
          await worker.stop()
          expect(await broker.count(`${name}_queue_in`)).toBe(0)
          expect(decisions(worker.logs)[0]).toContain("attempt=6/3")
        } finally {
          await worker.stop()
        }
      } finally {
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
        await broker.close()
      }
    },
    TIMEOUT,
  )

  it("loses no ack when it stops at prefetch 200: nothing comes back to the queue", async () => {
    const broker = await platform(QUORUM_VHOST)
    const name = uniqueName("lossless")
    const worker = runWorker(wordCounter(name), QUORUM_VHOST, { concurrency: 200 })
    try {
      await broker.waitForQueues(name)
      for (let i = 0; i < 200; i++) {
        broker.publish(`${name}_queue_in`, broker.envelope(`t-${i}`, { text: "a b" }))
      }
      await broker.readUntil(`${name}_queue_out`, (all) => all.filter(terminal).length === 200)
      await worker.stop()
      expect(await broker.count(`${name}_queue_in`)).toBe(0)
      expect(decisions(worker.logs).filter((l) => l.includes("outcome=success"))).toHaveLength(200)
    } finally {
      await worker.stop()
      await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      await broker.close()
    }
  }, TIMEOUT)

  it("a queue declared with other arguments is a configuration error naming it", async () => {
    const broker = await platform(CLASSIC_VHOST)
    const name = uniqueName("conflict")
    // A length limit the worker's declaration lacks (not a transient queue: RabbitMQ 4 deprecates
    // transient non-exclusive queues).
    await broker.declare(`${name}_queue_in`, { durable: true, arguments: { "x-max-length": 10 } })
    try {
      const { failure } = await firstTake(urlFor(CLASSIC_VHOST), name)
      expect(failure).toBeInstanceOf(TransportError)
      expect((failure as TransportError).reason).toBe("precondition_failed")
      expect((failure as TransportError).message).toContain(`${name}_queue_in`)
      expect((failure as TransportError).isConfiguration).toBe(true)
    } finally {
      await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      await broker.close()
    }
  }, TIMEOUT)

  it("refused credentials are a configuration error that never shows the password", async () => {
    const { failure, text } = await firstTake(urlFor(QUORUM_VHOST, "s3cret-pw"), "never")
    expect(failure).toBeInstanceOf(TransportError)
    expect((failure as TransportError).reason).toBe("access_refused")
    expect((failure as TransportError).isConfiguration).toBe(true)
    expect(text).not.toContain("s3cret-pw")
  }, TIMEOUT)

  for (
    const [vhost, reply] of [
      ["async-task-worker-no-such-vhost", "vhost async-task-worker-no-such-vhost not found"],
      [FORBIDDEN_VHOST, `access to vhost '${FORBIDDEN_VHOST}' refused for user 'guest'`],
    ]
  ) {
    it(
      `a refused vhost (${reply}) is a configuration error: one log line, no reconnection`,
      async () => {
        const { failure, logs } = await refusedVhost(vhost)
        expect(failure).toBeInstanceOf(TransportError)
        expect(failure.reason).toBe("not_allowed")
        expect(failure.isConfiguration).toBe(true)
        const message =
          `The broker refused the vhost of amqp://guest:***@127.0.0.1:${BROKER_PORT}/${vhost}: NOT_ALLOWED - ${reply}`
        expect(failure.message).toBe(message)
        expect(logs).toEqual([`Error ${message}`])
      },
      TIMEOUT,
    )
  }

  it(
    "a publish the broker returns (its queue deleted) fails as returned; once routed again, it is confirmed",
    async () => {
      const name = uniqueName("returned")
      const broker = await platform(QUORUM_VHOST)
      try {
        const outcomes = await Effect.runPromise(
          Effect.scoped(Effect.gen(function* () {
            const transport = yield* transportOf(urlFor(QUORUM_VHOST), name)
            const publish = (text: string) =>
              transport.publish(new TextEncoder().encode(text), "success").pipe(
                Effect.as("confirmed"),
                Effect.catchTag("PublishError", (e) => Effect.succeed(e.reason)),
              )
            yield* Effect.promise(() => broker.waitForQueues(name))
            const routed = yield* publish(`{"n":1}`)
            yield* Effect.promise(() => broker.remove(`${name}_queue_out`))
            const unroutable = yield* publish(`{"n":2}`)
            yield* Effect.promise(() => broker.declare(`${name}_queue_out`, { durable: true }))
            const routedAgain = yield* publish(`{"n":3}`)
            return [routed, unroutable, routedAgain]
          })),
        )
        expect(outcomes).toEqual(["confirmed", "returned", "confirmed"])
        expect((await broker.drain(`${name}_queue_out`)).map((m) => m.text)).toEqual([`{"n":3}`])
      } finally {
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
        await broker.close()
      }
    },
    TIMEOUT,
  )

  it(
    "reports its connection status to readiness, with an x-consumer-timeout asked for",
    async () => {
      const statusQueue = uniqueName("status")
      const status = await Effect.runPromise(
        Effect.scoped(Effect.gen(function* () {
          const transport = yield* transportOf(urlFor(QUORUM_VHOST), statusQueue, {
            consumerTimeout: "31 minutes",
          })
          for (let i = 0; i < 200; i++) {
            if ((yield* SubscriptionRef.get(transport.status)) === "connected") return "connected"
            yield* Effect.sleep("25 millis")
          }
          return yield* SubscriptionRef.get(transport.status)
        })),
      )
      expect(status).toBe("connected")
      const broker = await platform(QUORUM_VHOST)
      await broker.remove(`${statusQueue}_queue_in`, `${statusQueue}_queue_out`)
      await broker.close()
    },
    TIMEOUT,
  )

  it(
    "a delivery waiting when the session starts is sent on at once: the session serves before it consumes",
    async () => {
      const name = uniqueName("first")
      const broker = await platform(QUORUM_VHOST)
      try {
        await broker.declare(`${name}_queue_in`, { durable: true })
        broker.publish(`${name}_queue_in`, broker.envelope("t-first", { text: "a" }))
        await broker.confirmed()
        // `started` is sent as the delivery is taken; a session not yet serving would refuse it
        // (`closed`) and the engine would hold the task a backoff before its handler.
        const sent = await Effect.runPromise(
          Effect.scoped(Effect.gen(function* () {
            const transport = yield* transportOf(urlFor(QUORUM_VHOST), name)
            const delivery = Option.getOrThrow(yield* transport.take)
            const confirm = yield* transport.publish.send!(
              new TextEncoder().encode("{}"),
              "started",
            )
            const confirmed = yield* Effect.exit(confirm)
            yield* delivery.ack
            return { confirmed, body: new TextDecoder().decode(delivery.body) }
          })).pipe(Effect.provideService(References.MinimumLogLevel, "None")),
        )
        expect(JSON.parse(sent.body).task_id).toBe("t-first")
        expect(sent.confirmed).toStrictEqual(Exit.void)
      } finally {
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
        await broker.close()
      }
    },
    TIMEOUT,
  )

  it(
    "an output queue that refuses every publish for 10 s: the task is held, not requeued, the worker idles, and it concludes once the queue accepts",
    async () => {
      const name = uniqueName("refused")
      const outQueue = `${name}_queue_out`
      const policy = `${name}-refuse`
      /** A length limit on the output queue: at it, `reject-publish` nacks every publish. */
      const limitOutput = (max: number) =>
        rabbitmqctl(
          "set_policy",
          "-p",
          QUORUM_VHOST,
          "--apply-to",
          "queues",
          policy,
          `^${outQueue}$`,
          JSON.stringify({ "max-length": max, overflow: "reject-publish" }),
        )
      const broker = await platform(QUORUM_VHOST)
      const worker = runWorker(wordCounter(name), QUORUM_VHOST, {})
      try {
        await broker.waitForQueues(name)
        // A queue at its length limit with `reject-publish` nacks every publish, as a full
        // output queue in production would.
        limitOutput(0)
        await waitUntilRefused(broker, outQueue)
        broker.publish(`${name}_queue_in`, broker.envelope("t-refused", { text: "a b c" }))
        await broker.confirmed()
        const cpuBefore = process.cpuUsage()
        await sleep(10_000)
        const cpu = process.cpuUsage(cpuBefore)
        const held = decisions(worker.logs)
        // The queue accepts again. On RabbitMQ 3.10 a quorum queue keeps refusing once its
        // policy is cleared: the limit is raised instead.
        limitOutput(1_000_000)
        const out = await broker.readUntil(outQueue, (all) => all.some(terminal), 30_000)
        const cpuMillis = (cpu.user + cpu.system) / 1000
        console.log(
          `refused for 10 s: ${held.length} decision lines while refused, ${worker.logs.length} log lines in all, CPU ${
            cpuMillis.toFixed(0)
          } ms`,
        )
        // Held, not requeued: nothing was settled while the queue refused.
        expect(held).toEqual([])
        // A worker that spins burns a core: 10 s of it would be ~10 000 ms.
        expect(cpuMillis).toBeLessThan(2000)
        // The task concludes with its handler's outcome, on its first attempt.
        expect(out.filter(terminal).map((m) => m.text)).toEqual([
          `{"task_id":"t-refused","data":{"message_type":"success","response":{"words":3}}}`,
        ])
        await pollUntil("the decision line", () => decisions(worker.logs).length === 1, {
          ms: 20_000,
          every: 20,
        })
        expect(decisions(worker.logs)[0]).toMatch(
          /^Delivery settled: outcome=success .*attempt=1\/5/,
        )
        // The log's rate is bounded: a line when refusing began, one when it ended.
        expect(worker.logs.filter((l) => l.startsWith("The output queue refused"))).toHaveLength(1)
      } finally {
        rabbitmqctl("clear_policy", "-p", QUORUM_VHOST, policy, { ignoreFailure: true })
        await worker.stop()
        await broker.remove(`${name}_queue_in`, outQueue)
        await broker.close()
      }
    },
    TIMEOUT,
  )
})
