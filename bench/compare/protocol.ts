/**
 * What `bench/compare.ts` and its contenders' worker processes (`bench/compare/worker.ts`) say to
 * each other, one JSON line each way: the driver asks for a run, the worker says when it consumes
 * (`ready`) and what the run measured (`done`). And what every contender measures alike: a run's
 * settled tasks (`tally`), the heap, and the handler a mode asks for.
 */
import process from "node:process"
import type { Run as TallyRun } from "../tally.ts"

/**
 * What a run's handler does. `noop` and `timer` (20 ms) run tasks the driver preloaded, timed from
 * the first settled to the last; `paced` runs tasks the driver publishes at a fixed rate once the
 * worker is `ready` (the driver times each one); `held` holds every task in its handler until all
 * are, for the heap they take, then lets them go.
 */
export type Mode = "noop" | "timer" | "paced" | "held"

/** The 20 ms handler of the `timer` rows. */
export const TIMER_MS = 20

/** A run asked of a worker process. */
export interface Run {
  readonly id: number
  readonly mode: Mode
  readonly tasks: number
  readonly concurrency: number
  /** The broker: an AMQP URL (a quorum vhost on 127.0.0.1), or Redis's for BullMQ. */
  readonly url: string
  /** The worker's name: its queues are `${name}_queue_in` and `_out` (BullMQ: its queue). */
  readonly name: string
}

/** What a run measured: its rate and CPU from its first task settled to its last (`tally`). */
export interface Measured extends TallyRun {
  /** `held`: the heap's growth per task held, in bytes (after a full collection each side). */
  readonly heap?: number
}

/** Worker to driver: its runtime once loaded, `ready` once a run consumes, then its end. */
export type Report =
  | { readonly started: string }
  | { readonly id: number; readonly ready: true }
  | { readonly id: number; readonly done: Measured }
  | { readonly id: number; readonly failed: string }

/** A contender: runs one `Run` in its worker process, calling `ready` once it consumes. */
export type Contender = (run: Run, ready: () => void) => Promise<Measured>

export const inQueue = (name: string) => `${name}_queue_in`
export const outQueue = (name: string) => `${name}_queue_out`

/** The runtime a process runs on, as the table names it. */
export const runtime = (): string =>
  "Deno" in globalThis ? `Deno ${process.versions.deno}` : `Node ${process.versions.node}`

/** A task's envelope, as the platform writes it (BullMQ's job data is its body). */
export const envelope = (taskId: string, n: number): string =>
  `{"task_id": ${
    JSON.stringify(taskId)
  }, "data": {"message_type": "submission", "body": {"n": ${n}}}}`

const gc = (globalThis as { gc?: () => void }).gc

/** The heap in use after two full collections (the worker runs with `--expose-gc`). */
export const heapUsed = (): number => {
  if (gc === undefined) throw new Error("the worker runs without --expose-gc")
  gc()
  gc()
  return process.memoryUsage().heapUsed
}

/**
 * The `held` mode's gate: `hold` is each task's handler until `tasks` are held, at which point
 * the heap is read and every task let go. `before` reads the heap with the worker consuming and
 * nothing delivered yet.
 */
export const holding = (tasks: number) => {
  let held = 0
  let baseline = 0
  let grown = 0
  let release!: () => void
  const released = new Promise<void>((resolve) => (release = resolve))
  return {
    before: () => {
      baseline = heapUsed()
    },
    hold: (): Promise<void> => {
      if (++held === tasks) {
        grown = heapUsed() - baseline
        release()
      }
      return released
    },
    perTask: () => grown / tasks,
  }
}

/**
 * The handler a mode runs, as a promise for the raw loop and BullMQ (the SDK's is an Effect of the
 * same meaning); `undefined` for no handler at all.
 */
export const handlerOf = (
  mode: Mode,
  held: ReturnType<typeof holding>,
): (() => Promise<void>) | undefined =>
  mode === "timer"
    ? () => new Promise((resolve) => setTimeout(resolve, TIMER_MS))
    : mode === "held"
    ? held.hold
    : undefined
