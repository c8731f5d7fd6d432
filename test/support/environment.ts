/**
 * Test support: a worker's environment on the MemoryBroker — the broker, a transport on it and
 * the worker's settings (`overrides` winning), leases reaped each second so that the TestClock
 * has few sleeps to step through.
 */
import { Layer } from "effect"
import * as MemoryBroker from "../../src/MemoryBroker.ts"
import * as Settings from "../../src/Settings.ts"
import type { Transport } from "../../src/Transport.ts"
import type * as Worker from "../../src/Worker.ts"

export const memoryEnvironment = (
  worker: Worker.Any,
  overrides: Settings.SettingsOverrides = {},
): Layer.Layer<MemoryBroker.MemoryBroker | Settings.Settings | Transport, unknown> =>
  MemoryBroker.layerTransport().pipe(
    Layer.provideMerge(
      Layer.merge(
        Settings.layer(
          { name: worker.name, timeout: worker.timeout, concurrency: worker.concurrency },
          overrides,
        ),
        MemoryBroker.layer({ reapInterval: "1 second" }),
      ),
    ),
  )
