/**
 * BullMQ, in a worker process of `bench/compare.ts` and in the driver: its `Worker` with the
 * run's concurrency and the mode's handler (a no-op returns `{ ok: true }`, as the SDK's does),
 * counted by its `completed` events; its `Queue` and `QueueEvents` for the driver.
 *
 * BullMQ is a dependency of the benches only (bench/package.json, installed by `bench/compare.ts`
 * with `npm ci --prefix bench`): it is loaded by a specifier the type checker does not follow, so
 * that `deno check bench/` passes where bench/node_modules is not installed.
 */
import { type Contender, handlerOf, holding } from "./protocol.ts"
import { tally } from "../tally.ts"

/** Redis for the benches: the machine's, on 127.0.0.1. */
export const REDIS = { host: "127.0.0.1", port: 6379 }
/** The benches' keys in Redis start with it, apart from anything else that uses the server. */
export const PREFIX = "bench-compare"

/** The parts of BullMQ the benches use. */
export interface BullMQ {
  readonly Queue: new (name: string, options: object) => Queue
  readonly QueueEvents: new (name: string, options: object) => QueueEvents
  readonly Worker: new (
    name: string,
    processor: (job: { readonly data: unknown }) => Promise<unknown>,
    options: object,
  ) => BullWorker
}
export interface Queue {
  add(name: string, data: unknown, options?: object): Promise<unknown>
  addBulk(jobs: ReadonlyArray<{ name: string; data: unknown; opts?: object }>): Promise<unknown>
  obliterate(options: { force: boolean }): Promise<void>
  close(): Promise<void>
}
export interface QueueEvents {
  on(event: "completed", listener: (event: { jobId: string }) => void): void
  off(event: "completed", listener: (event: { jobId: string }) => void): void
  waitUntilReady(): Promise<unknown>
  close(): Promise<void>
}
interface BullWorker {
  on(event: "completed" | "error", listener: (value: unknown) => void): void
  waitUntilReady(): Promise<unknown>
  run(): Promise<void>
  close(): Promise<void>
}

const bullmq = "bullmq"
const ioredis = "ioredis"
/** BullMQ from bench/node_modules. */
export const load = (): Promise<BullMQ> => import(bullmq) as Promise<BullMQ>

/** Redis's `INFO server`, through the client BullMQ uses (ioredis). */
export const serverInfo = async (): Promise<string> => {
  const { Redis } = await import(ioredis) as {
    Redis: new (options: object) => {
      info(section: string): Promise<string>
      quit(): Promise<unknown>
    }
  }
  const client = new Redis(REDIS)
  try {
    return await client.info("server")
  } finally {
    await client.quit()
  }
}

/** A job as the platform would add it: its id the task's, removed once done, as an ack would. */
export const jobOptions = { removeOnComplete: true, removeOnFail: true }

export const contender: Contender = async (run, ready) => {
  const { Worker } = await load()
  const settled = tally(run.tasks)
  const held = holding(run.tasks)
  const handler = handlerOf(run.mode, held)
  const ok = { ok: true }
  const worker = new Worker(
    run.name,
    handler === undefined ? () => Promise.resolve(ok) : () => handler().then(() => ok),
    {
      connection: { ...REDIS, maxRetriesPerRequest: null },
      prefix: PREFIX,
      concurrency: run.concurrency,
      autorun: false,
    },
  )
  worker.on("completed", settled.settle)
  worker.on("error", (error) => console.error(error))
  try {
    await worker.waitUntilReady()
    if (run.mode === "held") held.before()
    const running = worker.run()
    ready()
    await Promise.race([
      settled.all,
      running.then(() => {
        throw new Error("the worker stopped before its run ended")
      }),
    ])
    return { ...settled.run(), heap: run.mode === "held" ? held.perTask() : undefined }
  } finally {
    await worker.close()
  }
}
