/**
 * Test support: a worker's environment on the MemoryBroker — the broker, a transport on it and
 * the worker's settings (`overrides` winning), leases reaped each second so that the TestClock
 * has few sleeps to step through.
 */
import { Effect, Layer } from "effect"
import * as MemoryBroker from "../../src/MemoryBroker.ts"
import * as Settings from "../../src/Settings.ts"
import type { Transport } from "../../src/Transport.ts"
import type * as Worker from "../../src/Worker.ts"
import { wireOf } from "./builders.ts"

export const memoryEnvironment = (
  worker: Worker.Any,
  overrides: Settings.SettingsOverrides = {},
  brokerOptions: MemoryBroker.MemoryBrokerOptions = {},
): Layer.Layer<MemoryBroker.MemoryBroker | Settings.Settings | Transport, unknown> =>
  MemoryBroker.layerTransport().pipe(
    Layer.provideMerge(
      Layer.merge(
        Settings.layer(
          { name: worker.name, timeout: worker.timeout, concurrency: worker.concurrency },
          overrides,
        ),
        MemoryBroker.layer({ reapInterval: "1 second", ...brokerOptions }),
      ),
    ),
  )

/** The message types published on `outQueue` for `taskId`, in order. */
export const publishedTypes = (
  broker: MemoryBroker.MemoryBroker["Service"],
  outQueue: string,
  taskId: string,
): Effect.Effect<Array<string>> =>
  Effect.map(broker.published(outQueue), (messages) =>
    messages
      .map((m) => wireOf(m.body))
      .filter((m) => m.task_id === taskId)
      .map((m) => m.data.message_type))
