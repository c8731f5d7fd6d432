/**
 * A worker whose upstream fails twice before it answers: the retry path, as an `async`
 * handler that throws RetryableError and honours its AbortSignal.
 */
import { Schema } from "effect"
import { RetryableError, Worker } from "../src/index.ts"

export const worker = Worker.make({
  name: "flaky-upstream",
  input: Schema.Struct({ url: Schema.String }),
  output: Schema.Struct({ status: Schema.Number, attempts: Schema.Number }),
  timeout: "10 seconds",
  handler: async (input, ctx) => {
    ctx.signal.throwIfAborted()
    if (ctx.attempt < 3) {
      throw new RetryableError({
        code: "UPSTREAM_UNAVAILABLE",
        message: `${input.url} did not answer`,
      })
    }
    await ctx.progress(0.9)
    return { status: 200, attempts: ctx.attempt }
  },
})
