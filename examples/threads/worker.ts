/**
 * A CPU-bound worker: its handler runs on threads (`Thread.handler`), two at most. Try it on the
 * embedded broker:
 *
 *   echo '{"text":"hello"}' | deno run -A cli.ts run examples/threads/worker.ts --memory
 *
 * or as a Deno script on RabbitMQ: `BROKER_URL=amqp://… deno run -A examples/threads/worker.ts`.
 */
import { Schema } from "effect"
import { Thread, Worker } from "../../src/index.ts"

export const worker = Worker.make({
  name: "score",
  input: Schema.Struct({ text: Schema.NonEmptyString, rounds: Schema.optional(Schema.Number) }),
  output: Schema.Struct({ score: Schema.Number }),
  timeout: "1 minute",
  concurrency: 2,
  handler: Thread.handler(new URL("./score.ts", import.meta.url), "score", { maxTasks: 1000 }),
})

if (import.meta.main) Worker.run(worker)
