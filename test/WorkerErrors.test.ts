/**
 * A handler's own tagged errors mapped, in the definition, to a code or a retry policy: with the
 * compiler's help, instead of becoming INTERNAL_ERROR. And which transport errors are
 * configuration, which no retry or restart mends.
 */
import { describe, expect, it } from "@effect/vitest"
import { Data, Effect, Schema } from "effect"
import * as WorkerHarness from "../src/testing.ts"
import * as Worker from "../src/Worker.ts"
import { FatalError, RetryableError, TransportError } from "../src/WorkerError.ts"

class DbTimeout extends Data.TaggedError("DbTimeout")<{ readonly after: number }> {}
class NotFound extends Data.TaggedError("NotFound")<{ readonly id: string }> {}

const Input = Schema.Struct({ id: Schema.String })
const Output = Schema.Struct({ ok: Schema.Boolean })

const lookup = (id: string): Effect.Effect<{ ok: boolean }, DbTimeout | NotFound> =>
  id === "slow"
    ? Effect.fail(new DbTimeout({ after: 5 }))
    : id === "gone"
    ? Effect.fail(new NotFound({ id }))
    : Effect.succeed({ ok: true })

const worker = Worker.make({
  name: "lookup",
  input: Input,
  output: Output,
  timeout: "5 seconds",
  handler: ({ id }) => lookup(id),
  errors: {
    DbTimeout: (e) => new RetryableError({ code: "DB_TIMEOUT", delay: e.after }),
    NotFound: (e) =>
      new FatalError({ code: "NOT_FOUND", message: `No record ${e.id.length} long.` }),
  },
})

describe("a worker's error mapping", () => {
  it.effect("maps each tagged error to its code and retry policy", () =>
    Effect.gen(function* () {
      const harness = yield* WorkerHarness.make(worker)
      ;(yield* harness.submit({ id: "gone" })).assertFailed({ code: "NOT_FOUND" })
      const retried = yield* harness.submit({ id: "slow" })
      expect(retried.outcome).toBe("REJECTED_REQUEUE")
      const last = yield* harness.submit({ id: "slow" }, { deliveryCount: 4 })
      last.assertFailed({ code: "DB_TIMEOUT" })
      ;(yield* harness.submit({ id: "here" })).assertSucceeded()
    }))

  it.effect("maps an async handler's rejections by their tag", () =>
    Effect.gen(function* () {
      const asyncWorker = Worker.make({
        name: "lookup-async",
        input: Input,
        output: Output,
        timeout: "5 seconds",
        handler: async ({ id }) => {
          await Promise.resolve()
          if (id === "gone") throw new NotFound({ id })
          return { ok: true }
        },
        errors: { NotFound: () => new FatalError({ code: "NOT_FOUND", message: "Gone." }) },
      })
      const harness = yield* WorkerHarness.make(asyncWorker)
      ;(yield* harness.submit({ id: "gone" })).assertFailed({ code: "NOT_FOUND" })
    }))

  // The check is the compiler's: `npm run check` type-checks test/, where the @ts-expect-error
  // below fails the build if a missing tag ever compiles.
  it("names every tag the handler fails with: a missing one does not compile", () => {
    const incomplete = () =>
      Worker.make({
        name: "lookup-incomplete",
        input: Input,
        output: Output,
        timeout: "5 seconds",
        handler: ({ id }) => lookup(id),
        // @ts-expect-error: NotFound is not mapped
        errors: { DbTimeout: () => new RetryableError({ code: "DB_TIMEOUT" }) },
      })
    expect(incomplete).toBeTypeOf("function")
  })
})

describe("a TransportError", () => {
  it("is configuration for refused credentials or vhost, a conflicting queue, no or a bad URL", () => {
    const reasons: Record<TransportError["reason"], boolean> = {
      connect: false,
      declare: false,
      consume: false,
      settle: false,
      closed: false,
      access_refused: true,
      not_allowed: true,
      precondition_failed: true,
      not_configured: true,
      invalid_url: true,
    }
    for (const [reason, configuration] of Object.entries(reasons)) {
      const error = new TransportError({ reason: reason as TransportError["reason"], message: "" })
      expect(error.isConfiguration, reason).toBe(configuration)
    }
  })
})
