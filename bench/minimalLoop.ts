/**
 * The least a worker does with a delivery, the baseline of the benches: decode the envelope,
 * publish `started` and `success`, ack. A generator to delegate to (`yield*`) from a loop's own
 * `Effect.gen`, so that the baseline pays for no Effect of its own per delivery.
 */
import type { Effect } from "effect"
import { Protocol, type Transport } from "../src/index.ts"

export function* settleMinimally(
  transport: Transport.Transport["Service"],
  delivery: Transport.Delivery,
): Generator<Effect.Effect<unknown, unknown>, void, unknown> {
  const decoded = Protocol.decodeEnvelope(delivery.body)
  const taskId = decoded._tag === "Task" ? decoded.envelope.taskId : "?"
  yield* transport.publish(
    Protocol.encodeMessage({ type: "started", task_id: taskId, hostname: "bench" }),
    "started",
  )
  yield* transport.publish(
    Protocol.encodeMessage({ type: "success", task_id: taskId, response: { ok: true } }),
    "success",
  )
  yield* delivery.ack
}
