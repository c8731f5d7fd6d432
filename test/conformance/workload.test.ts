/**
 * The SDK's conformance worker (examples/conformance/worker.ts) does what each task body says,
 * through the real engine on the embedded broker: what the conformance kit relies on when it
 * drives the worker from outside.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as WorkerHarness from "../../src/testing.ts"
import { worker } from "../../examples/conformance/worker.ts"

const startHarness = () => WorkerHarness.start(worker)
let harness: Awaited<ReturnType<typeof startHarness>>

beforeAll(async () => {
  harness = await startHarness()
})
afterAll(() => harness.close())

describe("the conformance workload", () => {
  it("succeeds with the response given, after its progress steps", async () => {
    const run = await harness.submit({
      steps: [{ progress: 0.25 }, { wait_ms: 1 }, { progress: 0.5, payload: { stage: "b" } }],
      end: { succeed: { n: 1 } },
    })
    run.assertSucceeded()
    expect(run.response).toEqual({ ok: true, echo: { n: 1 } })
    expect(run.messageTypes[0]).toBe("started")
    expect(run.messageTypes.at(-1)).toBe("success")
  })

  it("fails with the code and message given", async () => {
    const run = await harness.submit({ steps: [], end: { fail: { code: "NOPE", message: "No." } } })
    run.assertFailed({ code: "NOPE" })
    expect(run.error?.message).toBe("No.")
  })

  it("retries with the code given, concluded with it at the last attempt", async () => {
    const run = await harness.submit(
      { steps: [], end: { retry: { code: "AGAIN", delay_ms: 0 } } },
      { deliveryCount: 4 },
    )
    run.assertFailed({ code: "AGAIN" })
    const retried = await harness.submit({ steps: [], end: { retry: { code: "AGAIN" } } })
    expect(retried.outcome).toBe("REJECTED_REQUEUE")
  })

  it("breaks its output schema: INVALID_OUTPUT", async () => {
    const run = await harness.submit({ steps: [], end: { break_output: true } })
    run.assertFailed({ code: "INVALID_OUTPUT" })
  })

  it("a body it cannot read: INVALID_INPUT", async () => {
    const run = await harness.submitRaw(
      new TextEncoder().encode(
        JSON.stringify({
          task_id: "t-bad",
          data: { message_type: "submission", body: { steps: 5 } },
        }),
      ),
    )
    run.assertFailed({ code: "INVALID_INPUT" })
  })
})
