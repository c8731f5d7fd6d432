/**
 * A worker: its definition (`make`, validated as it loads) and the ways to run it — `serve` and
 * `layer` inside an Effect program, `start` for a handle on it, `run` as the process.
 *
 * @since 0.1.0
 */
import { Effect, Layer } from "effect"
import * as Lifecycle from "./Lifecycle.ts"
import * as Process from "./Process.ts"
import type { Worker } from "./WorkerDefinition.ts"
import * as WorkerProgram from "./WorkerProgram.ts"

export * from "./WorkerDefinition.ts"

/**
 * Starts consuming in the current scope and returns the running worker; see
 * {@link WorkerProgram.start}.
 *
 * @since 0.1.0
 * @category running
 */
export const start = WorkerProgram.start

/**
 * Runs the worker until interrupted, then drains it within the grace period; see
 * {@link WorkerProgram.serve}.
 *
 * @since 0.1.0
 * @category running
 */
export const serve = WorkerProgram.serve

/**
 * The worker as a scoped layer inside a larger app: it consumes while the layer is alive and
 * drains when it is released.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = WorkerProgram.layerRunning

/**
 * Runs the worker as the process: reads and validates the settings, runs the startup hooks,
 * consumes (RabbitMQ at `BROKER_URL`, or the embedded broker with `WORKER_TRANSPORT=memory`),
 * drains on SIGTERM or SIGINT, and exits with the spec's code (0 clean, 1 failure, 2
 * configuration). For a script: `if (import.meta.main) Worker.run(worker)`. A worker whose
 * handler requires services gets them from `options.layer`.
 *
 * @since 0.1.0
 * @category running
 */
export function run<A, I, O>(worker: Worker<A, I, O, never>, options?: Lifecycle.RunOptions): void
export function run<A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options: Lifecycle.RunOptions & { readonly layer: Layer.Layer<R, unknown> },
): void
export function run<A, I, O, R>(
  worker: Worker<A, I, O, R>,
  options?: Lifecycle.RunOptions & { readonly layer?: Layer.Layer<R, unknown> },
): void {
  Process.runMain(
    Lifecycle.run(worker, options).pipe(
      Effect.provide(options?.layer ?? (Layer.empty as Layer.Layer<R>)),
      Effect.catchAllCause((cause) =>
        Effect.as(Effect.logError("The worker's services could not be built", cause), 1 as const)
      ),
    ),
  )
}
