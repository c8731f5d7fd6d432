/**
 * A Node worker module, as `Dockerfile.node` runs it: `async-task-worker run ./worker.mjs`.
 * Plain JavaScript with an `async` handler: no Effect needed to write one.
 */
// Effect by module: the barrel `"effect"` would load every one of its modules at each start.
import * as Schema from "effect/Schema"
import { FatalError, Worker } from "@async-task/worker"

export const worker = Worker.make({
  name: "count-words",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ words: Schema.Number }),
  timeout: "30 seconds",
  handler: async (input, ctx) => {
    await ctx.progress(0.5)
    const words = input.text.split(/\s+/).filter((w) => w !== "")
    if (words.length === 0) {
      throw new FatalError({ code: "EMPTY_TEXT", message: "There is nothing to count." })
    }
    return { words: words.length }
  },
})
