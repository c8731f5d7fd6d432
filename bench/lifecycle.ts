/**
 * Process timings of the CLI on Deno and on Node 24, against RabbitMQ (quorum queues):
 *
 * - stop: SIGTERM to exit, for an idle worker in service mode;
 * - job: process start to the first task settled (its `success` seen on the output queue), in
 *   job mode with one task waiting, and to the process's exit.
 *
 * Each beside its baseline measured in the same run: the bare runtime starting and exiting.
 *
 * Loading Effect's many modules is most of a start, on Node and on Deno alike: the rows `node-bundle` and
 * `deno-bundle` run the worker as `examples/deploy/bundle` ships it (`Dockerfile.node-bundle`,
 * `Dockerfile.deno-bundle`): one file made by esbuild (the worker, the SDK, Effect and amqplib),
 * started with V8's code cache, warmed by the runtime that runs it.
 *
 *   npm run build && deno run -A bench/lifecycle.ts [runs]
 *   npm run build && node bench/lifecycle.ts [runs]        (Node 24: the bench's own runtime only
 *                                                          drives the processes it measures)
 *
 * Each median is printed with the runs it took to settle: from that run on, the median of the
 * runs so far stayed within 5% of the last.
 */
import { Buffer } from "node:buffer"
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { once } from "node:events"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import process from "node:process"
import amqp from "amqplib"
import { layOutDeployApp } from "../test/support/deployApp.ts"
import { ensureQuorumVhost, QUORUM_VHOST } from "./quorumVhost.ts"
import { deno, node, root } from "./runtimes.ts"
import { median, settledAfter } from "./stable.ts"

const RUNS = Number(process.argv[2] ?? 7)
const BROKER = `amqp://guest:guest@127.0.0.1:5672/${QUORUM_VHOST}`
ensureQuorumVhost()

// The deployments of `examples/deploy/bundle`: one file, started with its code cache, warmed as an
// image build warms it (one task on the embedded broker), each by the runtime that runs it.
const bundleDir = mkdtempSync(join(tmpdir(), "bench-lifecycle-"))
// The example app as its images install it, for Node to find its dependencies (on Deno, the
// repository's workspace gives the app the SDK's sources, which the CLI runs from too).
const app = layOutDeployApp(join(bundleDir, "app"))
const worker = "./examples/deploy/src/worker.mjs"
const oneFile = (
  runtime: string,
  module: string,
  run: ReadonlyArray<string>,
  warmOnly: ReadonlyArray<string> = [],
) => {
  const dir = `${bundleDir}/${runtime}`
  execFileSync(node, ["examples/deploy/bundle/build.mjs", module, "worker", dir], { cwd: root })
  execFileSync(run[0]!, [...run.slice(1), ...warmOnly, `${dir}/start.cjs`, "--warm"], {
    cwd: root,
    input:
      `{"task_id": "warm-up", "data": {"message_type": "submission", "body": {"text": "a b"}}}\n`,
    env: { ...process.env, HEALTH_CHECK_PORT: "0" },
  })
  return [run[0]!, [...run.slice(1), `${dir}/start.cjs`]] as const
}
const nodeBundle = oneFile("node", `${app}/src/worker.mjs`, [node])
// As the image runs it: the warm-up may write the cache, the worker may not.
const denoBundle = oneFile(
  "deno",
  `${app}/src/worker.ts`,
  [deno, "run", "--allow-net", "--allow-env", "--allow-read", "--allow-sys"],
  [`--allow-write=${bundleDir}/deno`],
)

const runtimes = {
  deno: {
    bare: [deno, ["eval", ""]],
    cli: [deno, ["run", "-A", "cli.ts", "run", worker]],
  },
  "deno-bundle": {
    bare: [deno, ["eval", ""]],
    cli: denoBundle,
  },
  node: {
    bare: [node, ["-e", ""]],
    cli: [node, ["dist/cli.js", "run", `${app}/src/worker.mjs`]],
  },
  "node-bundle": {
    bare: [node, ["-e", ""]],
    cli: nodeBundle,
  },
  "deno-raw": {
    bare: [deno, ["eval", ""]],
    cli: [deno, ["run", "-A", "bench/rawJob.ts"]],
  },
  "node-raw": {
    bare: [node, ["-e", ""]],
    cli: [node, ["bench/rawJob.ts"]],
  },
} as const

const start = (command: readonly [string, ReadonlyArray<string>], env: Record<string, string>) =>
  spawn(command[0], [...command[1]], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "inherit"],
  })

const exited = async (child: ChildProcess): Promise<number> => {
  const [code] = await once(child, "exit")
  return code as number
}

/** When each pattern first showed in the child's output, in ms from `t0`. */
const linesSeen = <K extends string>(
  child: ChildProcess,
  t0: number,
  patterns: Record<K, RegExp>,
): Partial<Record<K, number>> => {
  const seen: Partial<Record<K, number>> = {}
  let buffered = ""
  child.stdout!.on("data", (chunk: Uint8Array) => {
    buffered += new TextDecoder().decode(chunk)
    for (const key of Object.keys(patterns) as Array<K>) {
      if (seen[key] === undefined && patterns[key].test(buffered)) {
        seen[key] = performance.now() - t0
      }
    }
  })
  return seen
}

const waitForLine = (child: ChildProcess, pattern: RegExp) =>
  new Promise<void>((resolve) => {
    let buffered = ""
    child.stdout!.on("data", (chunk: Uint8Array) => {
      buffered += new TextDecoder().decode(chunk)
      if (pattern.test(buffered)) resolve()
    })
  })

const connection = await amqp.connect(BROKER)
const channel = await connection.createChannel()

const queues = async (name: string) => {
  const inQueue = `${name}_in`
  const outQueue = `${name}_out`
  for (const q of [inQueue, outQueue]) {
    await channel.assertQueue(q, { durable: true })
    await channel.purgeQueue(q)
  }
  return { inQueue, outQueue }
}

const bare = async (runtime: keyof typeof runtimes) => {
  const t0 = performance.now()
  await exited(start(runtimes[runtime].bare, {}))
  return performance.now() - t0
}

const stop = async (runtime: keyof typeof runtimes) => {
  const { inQueue, outQueue } = await queues(`bench-lifecycle-stop-${runtime}`)
  const child = start(runtimes[runtime].cli, {
    BROKER_URL: BROKER,
    IN_QUEUE_NAME: inQueue,
    OUT_QUEUE_NAME: outQueue,
  })
  await waitForLine(child, /started in service mode/)
  // Let the consumer register: the measure is of the drain and close, not of a startup.
  await new Promise((r) => setTimeout(r, 200))
  const t0 = performance.now()
  // Not `child.kill`: Deno then reports the child as killed by the signal whatever its exit code.
  process.kill(child.pid!, "SIGTERM")
  const code = await exited(child)
  if (code !== 0) throw new Error(`${runtime}: exit ${code} on SIGTERM`)
  return performance.now() - t0
}

const job = async (runtime: keyof typeof runtimes) => {
  const { inQueue, outQueue } = await queues(`bench-lifecycle-job-${runtime}`)
  channel.sendToQueue(
    inQueue,
    Buffer.from(
      `{"task_id": "t-1", "data": {"message_type": "submission", "body": {"text": "a b"}}}`,
    ),
    { persistent: true },
  )
  let seen: (at: number) => void = () => {}
  const settled = new Promise<number>((resolve) => (seen = resolve))
  const { consumerTag } = await channel.consume(outQueue, (message) => {
    if (message !== null && message.properties.type === "success") seen(performance.now())
  }, { noAck: true })
  const t0 = performance.now()
  const child = start(runtimes[runtime].cli, {
    BROKER_URL: BROKER,
    IN_QUEUE_NAME: inQueue,
    OUT_QUEUE_NAME: outQueue,
    WORKER_MODE: "job",
    WORKER_JOB_MAX_TASKS: "1",
  })
  const lines = linesSeen(child, t0, {
    connecting: / connecting to /,
    started: / started in job mode/,
  })
  const code = await exited(child)
  const exit = performance.now() - t0
  if (code !== 0) throw new Error(`${runtime}: job exited ${code}`)
  const at = await settled
  await channel.cancel(consumerTag)
  return {
    settled: at - t0,
    exit,
    connecting: lines.connecting ?? NaN,
    started: lines.started ?? NaN,
  }
}

const denoRuntime = (globalThis as { Deno?: { version: { deno: string } } }).Deno
console.log(
  `runs: ${RUNS} each, medians; RabbitMQ quorum queues, ${process.platform}, driven by ${
    denoRuntime === undefined ? `node ${process.version}` : `deno ${denoRuntime.version.deno}`
  }`,
)
for (
  const runtime of ["deno", "deno-bundle", "deno-raw", "node", "node-bundle", "node-raw"] as const
) {
  const raw = runtime.endsWith("-raw")
  const bares: Array<number> = []
  const stops: Array<number> = []
  const settles: Array<number> = []
  const exits: Array<number> = []
  const connectings: Array<number> = []
  const starteds: Array<number> = []
  for (let i = 0; i < RUNS; i++) {
    if (process.env.BENCH_DEBUG) console.error("run", runtime, i)
    bares.push(await bare(runtime))
    if (!raw) stops.push(await stop(runtime))
    const j = await job(runtime)
    settles.push(j.settled)
    exits.push(j.exit)
    connectings.push(j.connecting)
    starteds.push(j.started)
  }
  const b = median(bares)
  const line = (label: string, xs: Array<number>) => {
    const ms = median(xs)
    return `  ${label.padEnd(36)} ${ms.toFixed(0).padStart(5)} ms   ${
      (ms / b).toFixed(1)
    }x bare   (settled after ${settledAfter(xs, (m) => m * 0.05)} of ${xs.length} runs)`
  }
  const phase = (label: string, from: Array<number>, to: Array<number>) =>
    `  ${label.padEnd(52)} ${
      median(to.map((t, i) => t - (from[i] ?? 0))).toFixed(0).padStart(5)
    } ms`
  console.log(`${runtime}${raw ? " (amqplib alone: the floor)" : ""}:`)
  console.log(line("bare runtime start+exit (baseline)", bares))
  if (!raw) console.log(line("SIGTERM to exit, idle", stops))
  console.log(line("job: start to first task settled", settles))
  console.log(line("job: start to exit", exits))
  console.log("  the job's start, medians of each phase:")
  console.log(phase("  start to 'connecting' (modules, settings, setup)", [], connectings))
  console.log(phase("  to 'started' (connect, channels, declare, consume)", connectings, starteds))
  console.log(phase("  to the first task's success (the delivery)", starteds, settles))
}
await connection.close()
rmSync(bundleDir, { recursive: true, force: true })
