/**
 * A worker that runs past its time limit: the handler is interrupted and the task concludes
 * with TASK_TIMEOUT.
 */
import { Effect, Schema } from "effect"
import { Worker } from "../src/index.ts"

export const worker = Worker.make({
  name: "slow-report",
  input: Schema.Struct({ pages: Schema.Number }),
  output: Schema.Struct({ done: Schema.Boolean }),
  timeout: "200 millis",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      for (let page = 0; page < input.pages; page++) {
        yield* ctx.progress(page / input.pages)
        yield* Effect.sleep("100 millis")
      }
      return { done: true }
    }),
})
