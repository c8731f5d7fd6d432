/**
 * Where the bytes of a task in flight go: `bench/engine.ts`'s held run (10 000 tasks held by a
 * handler that waits, on the MemoryBroker), with a heap snapshot before the worker takes them and
 * one once it holds them all, through `node:inspector` on Node and Deno alike. The difference,
 * by what V8 calls each object (its constructor, a closure's function, an array, a string...),
 * divided by the tasks held.
 *
 *   deno run -A --v8-flags=--expose-gc bench/heap.ts [rows]
 *   node --expose-gc bench/heap.ts [rows]      (Node 24)
 *
 * The broker's own share is in the table too: its ready messages move to its unacked ones, and
 * each gets the delivery the transport hands the engine, as amqplib's message would on RabbitMQ.
 */
import { closeSync, openSync, readFileSync, rmSync, writeSync } from "node:fs"
import { Session } from "node:inspector"
import { tmpdir } from "node:os"
import { join } from "node:path"
import process from "node:process"
import { Deferred, Duration, Effect, References, Schedule, Schema } from "effect"
import { MemoryBroker, Settings, Worker } from "../src/index.ts"
import { memoryBroker } from "./memory.ts"

const HELD = 10_000
const ROWS = Number(process.argv[2] ?? 30)
const RUNTIME = "Deno" in globalThis
  ? `deno ${process.versions.deno}`
  : `node ${process.versions.node}`

interface Snapshot {
  readonly snapshot: {
    readonly meta: {
      readonly node_fields: Array<string>
      readonly node_types: [Array<string>]
      readonly edge_fields: Array<string>
      readonly edge_types: [Array<string>]
    }
  }
  readonly nodes: Array<number>
  readonly edges: Array<number>
  readonly strings: Array<string>
}

const session = new Session()
session.connect()

/**
 * The heap, by kind of object: count and bytes (each object's own size). A plain object is
 * named by its first properties, and what V8 keeps for another (an array of a fiber's stack, the
 * variables a closure captures) by what holds it, so that a row says whose bytes they are.
 */
const census = (): Promise<string> =>
  new Promise((resolve, reject) => {
    const file = join(tmpdir(), `heap-${process.pid}-${++snapshots}.heapsnapshot`)
    const fd = openSync(file, "w")
    const onChunk = (message: { params: { chunk: string } }) => writeSync(fd, message.params.chunk)
    session.on("HeapProfiler.addHeapSnapshotChunk", onChunk)
    session.post("HeapProfiler.takeHeapSnapshot", { reportProgress: false }, (error) => {
      session.off("HeapProfiler.addHeapSnapshotChunk", onChunk)
      closeSync(fd)
      if (error) return reject(error)
      resolve(file)
    })
  })
let snapshots = 0

/** Read only once both are taken: the first's reading is not in the second. */
const read = (file: string) => {
  const kinds = kindsOf(JSON.parse(readFileSync(file, "utf8")) as Snapshot)
  rmSync(file)
  return kinds
}

const kindsOf = (heap: Snapshot): Map<string, { count: number; bytes: number }> => {
  const { meta } = heap.snapshot
  const fields = meta.node_fields
  const width = fields.length
  const edgeWidth = meta.edge_fields.length
  const types = meta.node_types[0]
  const edgeTypes = meta.edge_types[0]
  const [type, name, size, edgeCount] = ["type", "name", "self_size", "edge_count"].map((f) =>
    fields.indexOf(f)
  ) as [number, number, number, number]
  const [edgeType, edgeName, edgeTo] = ["type", "name_or_index", "to_node"].map((f) =>
    meta.edge_fields.indexOf(f)
  ) as [number, number, number]
  const kindOf = (node: number) => types[heap.nodes[node + type]!]!
  const nameOf = (node: number) => heap.strings[heap.nodes[node + name]!]!
  const own = new Map<number, string>()
  const holder = new Map<number, string>()
  for (let node = 0, edge = 0; node < heap.nodes.length; node += width) {
    const kind = kindOf(node)
    const props: Array<string> = []
    for (let e = 0; e < heap.nodes[node + edgeCount]!; e++, edge += edgeWidth) {
      const edgeKind = edgeTypes[heap.edges[edge + edgeType]!]!
      const to = heap.edges[edge + edgeTo]!
      const label = edgeKind === "element" || edgeKind === "hidden"
        ? `[${edgeKind}]`
        : heap.strings[heap.edges[edge + edgeName]!]!
      if (kind === "object" && edgeKind === "property" && props.length < 4) props.push(label)
      if (!holder.has(to)) holder.set(to, `${nameOf(node) || kind}.${label}`)
    }
    if (kind === "object" && nameOf(node) === "Object") {
      own.set(node, `Object {${props.join(", ")}}`)
    }
  }
  const kinds = new Map<string, { count: number; bytes: number }>()
  for (let node = 0; node < heap.nodes.length; node += width) {
    const kind = kindOf(node)
    const label = own.get(node) ??
      (kind === "object"
        ? nameOf(node) === "system / Context"
          ? `system / Context of ${holder.get(node) ?? "?"}`
          : nameOf(node)
        : kind === "closure"
        ? `closure ${nameOf(node) || `(anonymous) of ${holder.get(node) ?? "?"}`}`
        : `(${kind}${kind === "string" || kind === "number" ? "" : `: ${nameOf(node)}`}) of ${
          holder.get(node) ?? "?"
        }`)
    const entry = kinds.get(label) ?? { count: 0, bytes: 0 }
    entry.count++
    entry.bytes += heap.nodes[node + size]!
    kinds.set(label, entry)
  }
  return kinds
}

const gc = (globalThis as { gc?: () => void }).gc
const settle = () => {
  gc?.()
  gc?.()
}

const encoder = new TextEncoder()
const envelope = (i: number) =>
  encoder.encode(
    `{"task_id": "task-${i}", "data": {"message_type": "submission", "body": {"n": ${i}}}}`,
  )

const held = Effect.gen(function* () {
  const release = yield* Deferred.make<void>()
  const waiting = Worker.make({
    name: "bench",
    input: Schema.Struct({ n: Schema.Number }),
    output: Schema.Struct({ ok: Schema.Boolean }),
    timeout: "30 seconds",
    handler: () => Effect.as(Deferred.await(release), { ok: true }),
  })
  const broker = yield* MemoryBroker.MemoryBroker
  for (let i = 0; i < HELD; i++) yield* broker.publish("bench_queue_in", envelope(i))
  settle()
  const before = yield* Effect.promise(census)
  const running = yield* Worker.consume(waiting)
  yield* running.inFlight.pipe(
    Effect.repeat({ schedule: Schedule.spaced("5 millis"), until: (n) => n === HELD }),
  )
  settle()
  const after = yield* Effect.promise(census)
  yield* Deferred.succeed(release, undefined)
  return { before, after }
}).pipe(
  Effect.scoped,
  Effect.provide(memoryBroker()),
  Effect.provide(
    Settings.layer({ name: "bench", timeout: Duration.seconds(30) }, { concurrency: HELD }),
  ),
)

const files = await Effect.runPromise(
  held.pipe(Effect.provideService(References.MinimumLogLevel, "Warn")),
)
const before = read(files.before)
const after = read(files.after)
const rows = [...after].map(([label, { count, bytes }]) => {
  const was = before.get(label) ?? { count: 0, bytes: 0 }
  return { label, count: (count - was.count) / HELD, bytes: (bytes - was.bytes) / HELD }
})
const total = rows.reduce((sum, row) => sum + row.bytes, 0)
console.log(`${HELD} tasks held, ${RUNTIME}${gc ? "" : " (no --expose-gc: noisy)"}`)
console.log(`bytes per task in flight: ${total.toFixed(0)}\n`)
console.log(`| ${"what V8 calls it, or what holds it".padEnd(72)} | per task | bytes per task |`)
console.log(`| ${"-".repeat(72)} | -------- | -------------- |`)
for (const row of rows.sort((a, b) => b.bytes - a.bytes).slice(0, ROWS)) {
  console.log(
    `| ${row.label.slice(0, 72).padEnd(72)} | ${row.count.toFixed(2).padStart(8)} | ${
      row.bytes.toFixed(0).padStart(14)
    } |`,
  )
}
session.disconnect()
