/**
 * The count-words worker with its traces exported to an OpenTelemetry collector over OTLP/HTTP:
 * each delivery is a span (`async-task.delivery`) with the handler's span and one per publish
 * under it, in the producer's trace when its message carries a W3C `traceparent`.
 *
 *   OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 BROKER_URL=amqp://guest:guest@localhost:5672 \
 *     deno run -A examples/tracing.ts
 *
 * The tracer is the app's: `@effect/opentelemetry`'s `NodeSdk.layer`, given to `Worker.run` as
 * the worker's layer, so the engine and the handler's own `Effect.withSpan` spans share it. The
 * endpoint is read with `Config` (default `http://localhost:4318`); the exporter posts to its
 * `/v1/traces`. Without a collector the spans are dropped after the exporter's retries.
 */
import * as NodeSdk from "@effect/opentelemetry/NodeSdk"
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http"
import { BatchSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Config, Effect, Schema } from "effect"
import { FatalError, Worker } from "../src/index.ts"

export const worker = Worker.make({
  name: "count-words",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ words: Schema.Number }),
  timeout: "30 seconds",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      yield* ctx.progress(0.5, { stage: "split" })
      // A span of the handler's own: a child of the delivery's `handler` span.
      const words = yield* Effect.sync(() => input.text.split(/\s+/).filter((w) => w !== "")).pipe(
        Effect.withSpan("split", { attributes: { "text.length": input.text.length } }),
      )
      if (words.length === 0) {
        return yield* new FatalError({ code: "EMPTY_TEXT", message: "There is nothing to count." })
      }
      return { words: words.length }
    }),
})

/** The OpenTelemetry SDK, exporting spans in batches to the collector at the OTLP endpoint. */
export const TracingLive = NodeSdk.layer(
  Effect.map(
    Config.String("OTEL_EXPORTER_OTLP_ENDPOINT").pipe(
      Config.withDefault("http://localhost:4318"),
    ),
    (endpoint) => ({
      resource: { serviceName: worker.name },
      spanProcessor: new BatchSpanProcessor(
        new OTLPTraceExporter({ url: `${endpoint.replace(/\/+$/, "")}/v1/traces` }),
      ),
    }),
  ),
)

// Run as a script (Deno, Node 22.18+ and 24 set `import.meta.main`), not when imported.
if (import.meta.main) Worker.run(worker, { layer: TracingLive })
