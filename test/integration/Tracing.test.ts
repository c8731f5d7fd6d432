/**
 * Tracing on the real RabbitMQ: a `traceparent` header set by the producer reaches the engine
 * through amqplib, and the worker's own messages carry theirs.
 */
import { Buffer } from "node:buffer"
import * as NodeSdk from "@effect/opentelemetry/NodeSdk"
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import amqp from "amqplib"
import { Effect, Fiber, Layer, References, Schema } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as AmqpTransport from "../../src/AmqpTransport.ts"
import * as Settings from "../../src/Settings.ts"
import * as Worker from "../../src/Worker.ts"
import { ensureVhosts, platform, QUORUM_VHOST, uniqueName, urlFor } from "./broker.ts"
import { sleep } from "../support/waits.ts"

const TIMEOUT = 60_000
const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
const PARENT_ID = "00f067aa0ba902b7"

const worker = Worker.make({
  name: uniqueName("tracing"),
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ words: Schema.Number }),
  timeout: "10 seconds",
  handler: ({ text }) => Effect.succeed({ words: text.split(" ").length }),
})
const inQueue = `${worker.name}_queue_in`
const outQueue = `${worker.name}_queue_out`

beforeAll(() => ensureVhosts(), TIMEOUT)

describe("Tracing on RabbitMQ", () => {
  const exporter = new InMemorySpanExporter()
  let stop: () => Promise<unknown> = () => Promise.resolve()
  let connection: amqp.ChannelModel | undefined

  beforeAll(async () => {
    const fiber = Effect.runFork(
      Worker.serve(worker).pipe(
        Effect.provide(
          AmqpTransport.layer.pipe(
            Layer.provideMerge(
              Settings.layer({ name: worker.name, timeout: worker.timeout }, {
                brokerUrl: urlFor(QUORUM_VHOST),
              }),
            ),
          ),
        ),
        Effect.provide(NodeSdk.layer(() => ({
          resource: { serviceName: "tracing-integration" },
          spanProcessor: new SimpleSpanProcessor(exporter),
        }))),
        Effect.provideService(References.MinimumLogLevel, "Warn"),
      ),
    )
    stop = () => Effect.runPromise(Fiber.interrupt(fiber))
    const broker = await platform(QUORUM_VHOST)
    await broker.waitForQueues(worker.name)
    await broker.close()
    connection = await amqp.connect(urlFor(QUORUM_VHOST))
  }, TIMEOUT)

  afterAll(async () => {
    await stop()
    const broker = await platform(QUORUM_VHOST)
    await broker.remove(inQueue, outQueue)
    await broker.close()
    await connection?.close()
  }, TIMEOUT)

  it(
    "the producer's traceparent is the delivery's parent; the worker's messages carry its trace",
    async () => {
      const channel = await connection!.createConfirmChannel()
      channel.sendToQueue(
        inQueue,
        Buffer.from(JSON.stringify({
          task_id: "t-traced",
          data: { message_type: "submission", body: { text: "one two" } },
        })),
        {
          persistent: true,
          contentType: "application/json",
          headers: { traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` },
        },
      )
      await channel.waitForConfirms()
      const out: Array<amqp.GetMessage> = []
      const deadline = Date.now() + 20_000
      while (out.length < 2 && Date.now() < deadline) {
        const message = await channel.get(outQueue, { noAck: true })
        if (message === false) await sleep(20)
        else out.push(message)
      }
      await channel.close()
      expect(out.map((m) => m.properties.type)).toEqual(["started", "success"])

      const spans = exporter.getFinishedSpans()
      const delivery = spans.find((s) => s.name === "async-task.delivery")!
      expect(delivery.spanContext().traceId).toBe(TRACE_ID)
      expect(delivery.parentSpanContext?.spanId).toBe(PARENT_ID)
      expect(delivery.attributes).toMatchObject({
        "task.id": "t-traced",
        "task.outcome": "success",
      })
      const publishes = ["publish started", "publish success"].map((name) =>
        spans.find((s) => s.name === name)!
      )
      expect(out.map((m) => m.properties.headers?.traceparent)).toEqual(
        publishes.map((s) => `00-${TRACE_ID}-${s.spanContext().spanId}-01`),
      )
    },
    TIMEOUT,
  )
})
