/**
 * A contender's long-lived worker process for `bench/compare.ts`: it loads one contender, then
 * runs what the driver asks, one run at a time, one JSON line each way (`./protocol.ts`): a `Run`
 * on its standard input; `ready` once the run consumes and its end (`done` or `failed`) on its
 * standard output. Its own messages go to standard error. It ends when its input does.
 *
 *   node --expose-gc bench/compare/worker.ts raw|sdk|bullmq
 *   deno run -A --v8-flags=--expose-gc bench/compare/worker.ts sdk
 */
import process from "node:process"
import { createInterface } from "node:readline"
import type { Contender, Report, Run } from "./protocol.ts"
import { runtime } from "./protocol.ts"

const contenders: Record<string, () => Promise<{ readonly contender: Contender }>> = {
  raw: () => import("./raw.ts"),
  sdk: () => import("./sdk.ts"),
  bullmq: () => import("./bullmq.ts"),
}
const which = process.argv[2] ?? ""
const load = contenders[which]
if (load === undefined) throw new Error(`no contender "${which}": raw, sdk or bullmq`)
const { contender } = await load()

const report = (r: Report) => process.stdout.write(`${JSON.stringify(r)}\n`)
report({ started: runtime() })
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === "") continue
  const run = JSON.parse(line) as Run
  try {
    const done = await contender(run, () => report({ id: run.id, ready: true }))
    report({ id: run.id, done })
  } catch (error) {
    report({ id: run.id, failed: error instanceof Error ? error.message : String(error) })
  }
}
process.exit(0)
