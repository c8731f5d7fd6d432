/**
 * A handler's own `AsyncLocalStorage` (a request-scoped logger, OpenTelemetry's context manager):
 * the store a delivery started in is the one its handler finds, whoever resumes it. Effect
 * keeps it by capturing the async context at each fork and suspension (an `AsyncResource`, which
 * costs a delivery on Deno: bench/profile.ts `--no-async-resource`): the first test fails with the
 * capture hidden from Effect (checked: the handler then finds the store of whoever resumed it). The
 * second holds without it, by the runtime's own promise context: it fails if the SDK calls an
 * `async` handler from outside its delivery's context (a callback scheduled elsewhere).
 */
import { AsyncLocalStorage } from "node:async_hooks"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Schema } from "effect"
import * as WorkerHarness from "../src/testing.ts"
import * as Worker from "../src/Worker.ts"
import type { Handler } from "../src/WorkerDefinition.ts"

const store = new AsyncLocalStorage<string>()
const Seen = Schema.Struct({ before: Schema.String, after: Schema.String })
const seen = () => store.getStore() ?? "none"

/**
 * A worker whose handler is `handler`, given how it waits on a gate: `wait` says it is waiting,
 * then waits until the gate opens.
 */
const gated = (
  handler: (wait: Effect.Effect<void>) => Handler<object, typeof Seen.Type, never>,
) => {
  const gate = Deferred.makeUnsafe<void>()
  const waiting = Deferred.makeUnsafe<void>()
  const wait = Effect.andThen(Deferred.succeed(waiting, undefined), Deferred.await(gate))
  const worker = Worker.make({
    name: "async-context",
    input: Schema.Struct({}),
    output: Seen,
    timeout: "5 seconds",
    handler: handler(wait),
  })
  return { gate, waiting, worker }
}

/** Runs a task of `worker` in the store "app", its handler released from a call in the store "other". */
const runReleasedFromElsewhere = async ({ gate, waiting, worker }: ReturnType<typeof gated>) => {
  await using harness = await WorkerHarness.start(worker)
  const run = store.run("app", () => harness.submit({}))
  // Once the handler waits on the gate, opening it from the store "other" runs its waiter in this
  // call.
  await Effect.runPromise(Deferred.await(waiting))
  store.run("other", () => Effect.runSync(Deferred.succeed(gate, undefined)))
  const done = await run
  done.assertSucceeded()
  return done.response
}

describe("a handler's AsyncLocalStorage", () => {
  it("an Effect handler keeps its delivery's store after a suspension another store ends", async () => {
    const run = gated((wait) => () =>
      Effect.gen(function* () {
        const before = seen()
        yield* wait
        return { before, after: seen() }
      })
    )
    expect(await runReleasedFromElsewhere(run)).toEqual({ before: "app", after: "app" })
  })

  it("an async handler starts in its delivery's store, and its awaits keep the one it entered", async () => {
    const run = gated((wait) => async () => {
      const before = seen()
      return await store.run(`${before}+handler`, async () => {
        await Effect.runPromise(wait)
        return { before, after: seen() }
      })
    })
    expect(await runReleasedFromElsewhere(run)).toEqual({
      before: "app",
      after: "app+handler",
    })
  })
})
