/**
 * The conformance workload (docs/conformance.md), as this SDK serves it: a handler that does what
 * its task body says, so that the conformance kit can drive the worker from outside. Run it with
 * the CLI, on Deno or Node, with the service's settings the kit expects:
 *
 *   BROKER_URL=… IN_QUEUE_NAME=conformance_queue_in OUT_QUEUE_NAME=conformance_queue_out \
 *     npx async-task-worker run examples/conformance/worker.ts
 *
 * then `npx async-task-worker conformance --broker … --service conformance` with the worker's
 * delivery limit (`WORKER_DELIVERY_LIMIT`, 5 by default) and, if set, its size limit.
 */
import { Effect, Schema } from "effect"
import { FatalError, RetryableError, Worker } from "@async-task/worker"

const Json = Schema.Unknown

/** One step of a task: report progress (with a payload, or not), or wait. */
const Step = Schema.Union([
  Schema.Struct({
    progress: Schema.Number,
    payload: Schema.optional(Schema.Record(Schema.String, Json)),
  }),
  Schema.Struct({ wait_ms: Schema.Number }),
])

/** How a task ends. */
const End = Schema.Union([
  Schema.Struct({ succeed: Json }),
  Schema.Struct({ fail: Schema.Struct({ code: Schema.String, message: Schema.String }) }),
  Schema.Struct({
    retry: Schema.Struct({
      code: Schema.optional(Schema.String),
      delay_ms: Schema.optional(Schema.Number),
    }),
  }),
  Schema.Struct({ break_output: Schema.Literal(true) }),
  Schema.Struct({ hang: Schema.Literal(true) }),
])

const Output = Schema.Struct({ ok: Schema.Literal(true), echo: Json })

const end = (
  how: typeof End.Type,
): Effect.Effect<typeof Output.Type, FatalError | RetryableError> => {
  if ("succeed" in how) return Effect.succeed({ ok: true as const, echo: how.succeed })
  if ("fail" in how) return Effect.fail(new FatalError(how.fail))
  if ("retry" in how) {
    return Effect.fail(
      new RetryableError({
        ...(how.retry.code === undefined ? {} : { code: how.retry.code }),
        ...(how.retry.delay_ms === undefined ? {} : { delay: how.retry.delay_ms / 1000 }),
      }),
    )
  }
  // An output its schema refuses: the worker must conclude INVALID_OUTPUT.
  if ("break_output" in how) return Effect.succeed({ ok: "yes" } as never)
  return Effect.never
}

export const worker = Worker.make({
  name: "conformance",
  input: Schema.Struct({ steps: Schema.Array(Step), end: End }),
  output: Output,
  timeout: "8 seconds",
  handler: (input, ctx) =>
    Effect.gen(function* () {
      for (const step of input.steps) {
        if ("wait_ms" in step) yield* Effect.sleep(step.wait_ms)
        else yield* ctx.progress(step.progress, step.payload)
      }
      return yield* end(input.end)
    }),
})
