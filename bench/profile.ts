/**
 * Where a delivery's CPU goes on RabbitMQ: one loop of `bench/amqp.ts` (the SDK by default) run
 * under V8's sampling profiler, through `node:inspector` on Node and Deno alike, from its first
 * task settled to its last, after a warm-up; the samples summed by where their code lives.
 *
 *   deno run -A bench/profile.ts [tasks] [sdk|raw|transport] [--no-async-resource]
 *   node bench/profile.ts [tasks] [sdk|raw|transport] [--no-async-resource]     (Node 24)
 *
 * `--no-async-resource` hides `node:async_hooks` from Effect as it loads, so that its fibers
 * make no `AsyncResource` at a fork or a suspension: the difference is that capture's cost.
 * The profile itself is written beside the system's temporary files, for a closer look in a
 * browser's developer tools.
 *
 * Two tables: each sample by the code it was in (its leaf frame), and, not adding up, each
 * sample counted for every part of the SDK it ran under (its stack), so that a metric's update
 * inside Effect's code counts for the metrics, and a fiber's run loop for the runtime.
 */
import { writeFileSync } from "node:fs"
import { Session } from "node:inspector"
import { tmpdir } from "node:os"
import { join } from "node:path"
import process from "node:process"

const TASKS = Number(process.argv[2] ?? 20_000)
const LOOP = process.argv[3] ?? "sdk"
const NO_ASYNC_RESOURCE = process.argv.includes("--no-async-resource")
const RUNTIME = "Deno" in globalThis
  ? `deno ${process.versions.deno}`
  : `node ${process.versions.node}`

if (NO_ASYNC_RESOURCE) {
  const builtin = process.getBuiltinModule.bind(process) // Effect reads `AsyncResource` once, as it loads: absent, it captures nothing.
  ;(process as { getBuiltinModule: (id: string) => unknown }).getBuiltinModule = (id) =>
    id === "node:async_hooks" || id === "async_hooks" ? undefined : builtin(id)
}
const loops = await import("./loops.ts")
const loop = { sdk: loops.sdk, raw: loops.raw, transport: loops.transportOnly }[LOOP]
if (loop === undefined) throw new Error(`no loop "${LOOP}": sdk, raw or transport`)

interface Frame {
  readonly functionName: string
  readonly url: string
}
interface ProfileNode {
  readonly id: number
  readonly callFrame: Frame
  readonly children?: ReadonlyArray<number>
}
interface Profile {
  readonly nodes: ReadonlyArray<ProfileNode>
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
}

const session = new Session()
session.connect()
const post = (method: string) =>
  new Promise<unknown>((resolve, reject) =>
    session.post(method, (error, result) => (error ? reject(error) : resolve(result)))
  )
await post("Profiler.enable")
await new Promise<void>((resolve) =>
  session.post("Profiler.setSamplingInterval", { interval: 100 }, () => resolve())
)

await loop(Math.ceil(TASKS / 10), 50)
let stopped: Promise<unknown> | undefined
const run = await loop(TASKS, 50, {
  first: () => void post("Profiler.start"),
  last: () => (stopped = post("Profiler.stop")),
})
const { profile } = (await stopped) as { profile: Profile }
const file = join(tmpdir(), `${RUNTIME.replace(" ", "-")}-${LOOP}.cpuprofile`)
writeFileSync(file, JSON.stringify(profile))

/** Where a frame's code lives: the part of the SDK, Effect, amqplib or the runtime. */
const placeOf = ({ functionName, url }: Frame): string => {
  if (functionName === "(garbage collector)") return "runtime: garbage collector"
  if (functionName === "(idle)") return "idle"
  if (functionName === "(program)" || functionName === "(root)") {
    return "runtime: native, unattributed"
  }
  if (/async_hooks/.test(url)) return "runtime: AsyncResource"
  if (url.includes("/amqplib/")) return "amqplib"
  if (url.includes("/effect/")) {
    if (/\/(Metric|internal\/metric)/.test(url)) return "Effect: metrics"
    if (/Logger|logger/.test(url)) return "Effect: logging"
    if (/internal\/(effect|core)\.|Scheduler|Fiber/.test(url)) {
      return "Effect: fibers, run loop, scheduler"
    }
    return "Effect: other"
  }
  if (url.includes("/src/")) {
    if (/src\/(internal\/amqp\/|AmqpTransport)/.test(url)) return "SDK: transport"
    if (/src\/WorkerMetrics/.test(url)) return "SDK: metrics"
    if (/src\/(Decision|WorkerLogger)/.test(url)) return "SDK: decision line"
    if (/delivery\/tracing/.test(url)) return "SDK: tracing"
    if (
      /src\/(internal\/delivery\/|internal\/codec\/|DeliveryEngine|Concurrency|Protocol)/.test(url)
    ) {
      return "SDK: engine"
    }
    return "SDK: other"
  }
  if (url.includes("/bench/")) return "bench harness"
  if (/inspector/.test(url)) return "the profiler itself"
  return "runtime"
}

/** Code of a package, the SDK or the bench, as opposed to the runtime's. */
const isOwnCode = (url: string) => /\/(effect|amqplib|src|bench)\//.test(url)

const byId = new Map(profile.nodes.map((node) => [node.id, node]))
const parent = new Map<number, number>()
for (const node of profile.nodes) {
  for (const child of node.children ?? []) parent.set(child, node.id)
}

/**
 * The runtime's code, by what called it: the runtime frames up to the first of a package's,
 * the SDK's or the bench's (an AsyncResource's context switch, a socket's write, a Buffer).
 */
const runtimePlace = (leaf: number): string => {
  const names: Array<string> = []
  for (let at: number | undefined = leaf; at !== undefined; at = parent.get(at)) {
    const frame = byId.get(at)!.callFrame
    if (isOwnCode(frame.url)) break
    const place = placeOf(frame)
    if (place === "runtime: AsyncResource" || place === "the profiler itself") return place
    names.push(`${frame.functionName} ${frame.url}`)
  }
  const chain = names.join("\n")
  if (/writev|_writeGeneric|writeGeneric|_write |doWrite|writeBuffer/i.test(chain)) {
    return "runtime: socket writes"
  }
  if (/onStreamRead|readableAddChunk|onread|_read /i.test(chain)) return "runtime: socket reads"
  if (/buffer/i.test(chain)) return "runtime: Buffers"
  return "runtime: timers, promises, events, other"
}

/** The parts of the SDK a sample can run under, by its stack (not adding up). */
const underOf = (frame: Frame): string | undefined => {
  const place = placeOf(frame)
  if (place === "Effect: metrics" || place === "SDK: metrics") {
    return "metrics (Effect's and the SDK's)"
  }
  if (place === "Effect: logging" || place === "SDK: decision line") {
    return "the decision line and logging"
  }
  if (place === "SDK: tracing") return "tracing"
  if (place === "SDK: transport") return "the transport (amqplib beneath it included)"
  if (place === "SDK: engine") return "the engine's steps (all beneath them included)"
  return undefined
}

const self = new Map<string, number>()
const under = new Map<string, number>()
let busy = 0
let profiler = 0
profile.samples.forEach((id, i) => {
  const micros = profile.timeDeltas[i] ?? 0
  const leaf = byId.get(id)!
  let place = placeOf(leaf.callFrame)
  if (place === "idle") return
  if (place === "runtime") place = runtimePlace(id)
  // The inspector's own work, the cost of profiling: not the loop's.
  if (place === "the profiler itself") return void (profiler += micros)
  busy += micros
  self.set(place, (self.get(place) ?? 0) + micros)
  const seen = new Set<string>()
  for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
    const part = underOf(byId.get(at)!.callFrame)
    if (part !== undefined && !seen.has(part)) {
      seen.add(part)
      under.set(part, (under.get(part) ?? 0) + micros)
    }
  }
})

const perTask = (micros: number) => (micros / TASKS).toFixed(1).padStart(6)
const table = (title: string, rows: Map<string, number>) => {
  console.log(`\n| ${title.padEnd(52)} | µs per task | share of busy |`)
  console.log(`| ${"-".repeat(52)} | ----------- | ------------- |`)
  for (const [name, micros] of [...rows].sort((a, b) => b[1] - a[1])) {
    const share = `${((100 * micros) / busy).toFixed(1)} %`
    console.log(`| ${name.padEnd(52)} | ${perTask(micros).padStart(11)} | ${share.padStart(13)} |`)
  }
}
console.log(
  `${LOOP} loop, ${TASKS} tasks after a warm-up of ${
    Math.ceil(TASKS / 10)
  }, concurrency 50, ${RUNTIME}${NO_ASYNC_RESOURCE ? ", Effect without AsyncResource" : ""}`,
)
console.log(
  `${Math.round(run.rate)} tasks/s; this process's CPU ${
    run.cpu.toFixed(1)
  } µs per task (every thread), the main thread busy ${
    perTask(busy).trim()
  } µs per task, the profiler's own ${perTask(profiler).trim()} µs left out (the profile: ${file})`,
)
table("where the CPU was: the code of the sample's leaf frame", self)
table("what it ran under (a sample counts for each)", under)
session.disconnect()
