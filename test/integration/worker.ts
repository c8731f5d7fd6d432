/**
 * A worker on the real RabbitMQ for the integration tests: served on a vhost of the broker under
 * test (`broker.ts`) until stopped, its log lines kept with their annotations as `k=v`.
 */
import { Effect, Fiber, Layer, Logger, type LogLevel, References } from "effect"
import * as AmqpTransport from "../../src/AmqpTransport.ts"
import * as Settings from "../../src/Settings.ts"
import * as Worker from "../../src/Worker.ts"
import { urlFor } from "./broker.ts"

/**
 * Serves `worker` in this process (not a CLI's) on the broker that `settings` name until the
 * returned stop is called, its lines at `level` and above to `logger` alone.
 */
export const serveInProcess = <A, I, O>(
  worker: Worker.Worker<A, I, O, never>,
  settings: ReturnType<typeof Settings.layer>,
  logging: { readonly logger: Logger.Logger<unknown, void>; readonly level: LogLevel.LogLevel },
) => {
  const fiber = Effect.runFork(
    Worker.serve(worker).pipe(
      Effect.provide(AmqpTransport.layer.pipe(Layer.provideMerge(settings))),
      Effect.provide(Logger.layer([logging.logger])),
      Effect.provideService(References.MinimumLogLevel, logging.level),
    ),
  )
  return { fiber, stop: () => Effect.runPromise(Fiber.interrupt(fiber)) }
}

/**
 * Runs `worker` on `vhost` until the returned stop is called: the definition's concurrency, a
 * retry backoff of milliseconds unless `overrides` say otherwise.
 */
export const runWorker = <A, I, O>(
  worker: Worker.Worker<A, I, O, never>,
  vhost: string,
  overrides: Settings.SettingsOverrides,
) => {
  const logs: Array<string> = []
  const logger = Logger.make(({ fiber, message }) => {
    const annotations = fiber.getRef(References.CurrentLogAnnotations)
    const fields = Object.entries(annotations).map(([k, v]) => `${k}=${String(v)}`).join(" ")
    logs.push(`${Array.isArray(message) ? message.join(" ") : String(message)} ${fields}`)
  })
  const settings = Settings.layer({
    name: worker.name,
    timeout: worker.timeout,
    concurrency: worker.concurrency,
  }, {
    brokerUrl: urlFor(vhost),
    retryBackoffBase: "10 millis",
    retryBackoffMax: "20 millis",
    ...overrides,
  })
  return { logs, ...serveInProcess(worker, settings, { logger, level: "Info" }) }
}

/** The decision lines among `logs`. */
export const decisions = (logs: ReadonlyArray<string>): Array<string> =>
  logs.filter((l) => l.startsWith("Delivery settled:"))
