/**
 * The count-words worker: the example of the README.
 */
import { Effect, Schema } from "effect"
import { FatalError, Worker } from "../src/index.ts"

const Input = Schema.Struct({ text: Schema.String })
const Output = Schema.Struct({ words: Schema.Number })

export const worker = Worker.make({
  name: "count-words",
  input: Input,
  output: Output,
  timeout: "30 seconds",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      yield* ctx.progress(0.5, { stage: "split" })
      if (!input.text.trim()) {
        return yield* new FatalError({ code: "EMPTY_TEXT", message: "There is nothing to count." })
      }
      return { words: input.text.trim().split(/\s+/).length }
    }),
})
