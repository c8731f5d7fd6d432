/**
 * A Deno worker script, as `Dockerfile.deno` runs it: `deno run -A worker.ts`.
 */
// Effect by module: the barrel `"effect"` would load every one of its modules at each start.
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import { FatalError, Worker } from "@async-task/worker"

export const worker = Worker.make({
  name: "count-words",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ words: Schema.Number }),
  timeout: "30 seconds",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      yield* ctx.progress(0.5)
      const words = input.text.split(/\s+/).filter((w) => w !== "")
      if (words.length === 0) {
        return yield* new FatalError({ code: "EMPTY_TEXT", message: "There is nothing to count." })
      }
      return { words: words.length }
    }),
})

if (import.meta.main) Worker.run(worker)
