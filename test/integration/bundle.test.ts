/**
 * `examples/deploy/bundle`, as `Dockerfile.node-bundle` and `Dockerfile.deno-bundle` use it: the
 * app's worker (laid out as the images install it) built into one file runs a task, its
 * image-build warm-up writes V8's code cache, and a start reads that cache (or writes a new one
 * when V8 rejects it), on Node (the one running the test, or 22 under Deno) and on Deno. Real
 * processes, on the embedded broker: what is tested is the recipe, not RabbitMQ; but for a vhost
 * RabbitMQ refuses, which the bundle must tell from a broker out of reach (exit 2, not a retry) as
 * the CLI does.
 */
import { execFileSync, spawnSync } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { supportedNode } from "../support/nodes.ts"
import { layOutDeployApp } from "../support/deployApp.ts"
import { checkBuild, denoBinary, ROOT } from "../support/runtimes.ts"

const TASK =
  `{"task_id": "t-1", "data": {"message_type": "submission", "body": {"text": "one two three"}}}\n`

/**
 * The command line that runs `start.cjs` in `out`, as each image's entrypoint does; on Deno,
 * with the right to write the cache there when `write`.
 */
const commandLine = (runtime: "node" | "deno", out: string, write: boolean) =>
  runtime === "node" ? { command: supportedNode(), args: [join(out, "start.cjs")] } : {
    command: denoBinary(),
    args: [
      "run",
      "--allow-net",
      "--allow-env",
      "--allow-read",
      "--allow-sys",
      ...(write ? [`--allow-write=${out}`] : []),
      join(out, "start.cjs"),
    ],
  }

/** A bundle's environment for one task in job mode on the embedded broker, and what it runs on. */
const jobEnv = (): Record<string, string> => {
  const env: Record<string, string> = {
    HEALTH_CHECK_PORT: "0",
    WORKER_TRANSPORT: "memory",
    WORKER_MODE: "job",
    WORKER_JOB_IDLE_TIMEOUT_S: "2",
    NO_COLOR: "1",
  }
  for (const key of ["PATH", "HOME", "DENO_DIR"]) {
    if (process.env[key] !== undefined) env[key] = process.env[key]!
  }
  return env
}

describe.each(
  [
    ["node", "src/worker.mjs"],
    ["deno", "src/worker.ts"],
  ] as const,
)("examples/deploy/bundle on %s, built from the app's %s", (runtime, worker) => {
  const out = mkdtempSync(join(tmpdir(), `bundle-${runtime}-`))
  const app = mkdtempSync(join(tmpdir(), `bundle-${runtime}-app-`))
  /** The code cache files beside the bundle. */
  const caches = () => readdirSync(out).filter((name) => name.endsWith(".v8cache"))
  const cache = () => {
    expect(caches()).toHaveLength(1)
    return join(out, caches()[0]!)
  }

  beforeAll(() => {
    checkBuild()
    layOutDeployApp(app)
    execFileSync(
      supportedNode(),
      [join(ROOT, "examples/deploy/bundle/build.mjs"), worker, "worker", out],
      { cwd: app },
    )
  })
  afterAll(() => {
    rmSync(out, { recursive: true, force: true })
    rmSync(app, { recursive: true, force: true })
  })

  /** One task on stdin, in job mode on the embedded broker: what it published, and its exit. */
  const start = (options: { readonly warm?: boolean; readonly write?: boolean } = {}) => {
    const { command, args } = commandLine(runtime, out, options.write ?? true)
    const env = jobEnv()
    const run = spawnSync(command, [...args, ...(options.warm ? ["--warm"] : [])], {
      cwd: out,
      input: TASK,
      encoding: "utf8",
      timeout: 30_000,
      env,
    })
    const published = run.stdout.split("\n")
      .filter((line) => line.startsWith('{"task_id"'))
      .map((line) => JSON.parse(line).data)
    return { status: run.status, stderr: run.stderr, published }
  }

  it(
    "exits 2 on a vhost the broker does not know, with the broker's reason, as the CLI does",
    () => {
      const { command, args } = commandLine(runtime, out, false)
      const vhost = `no-such-vhost-${process.pid}`
      const env: Record<string, string> = {
        HEALTH_CHECK_PORT: "0",
        BROKER_URL: `amqp://guest:guest@127.0.0.1:5672/${vhost}`,
        NO_COLOR: "1",
      }
      for (const key of ["PATH", "HOME", "DENO_DIR"]) {
        if (process.env[key] !== undefined) env[key] = process.env[key]!
      }
      const sent = Date.now()
      const run = spawnSync(command, args, { cwd: out, encoding: "utf8", timeout: 30_000, env })
      expect(run.status, `${run.stdout}\n${run.stderr}`).toBe(2)
      expect(Date.now() - sent).toBeLessThan(10_000)
      expect(run.stdout).toContain(`NOT_ALLOWED - vhost ${vhost} not found`)
    },
    60_000,
  )

  it("runs a task from one file, and its warm-up writes the code cache", () => {
    const warm = start({ warm: true })
    expect(warm.status).toBe(0)
    expect(warm.published.at(-1)).toEqual({ message_type: "success", response: { words: 3 } })
    expect(statSync(cache()).size).toBeGreaterThan(0)
  })

  it("starts from the cache, leaving it as it is", () => {
    const written = statSync(cache()).mtimeMs
    const run = start()
    expect(run.status).toBe(0)
    expect(run.published.at(-1)).toEqual({ message_type: "success", response: { words: 3 } })
    expect(statSync(cache()).mtimeMs).toBe(written)
  })

  it("writes a cache V8 rejects again, and runs as well", () => {
    writeFileSync(cache(), "not a code cache")
    const run = start()
    expect(run.status).toBe(0)
    expect(run.published.at(-1)).toEqual({ message_type: "success", response: { words: 3 } })
    expect(statSync(cache()).size).toBeGreaterThan(1_000)
  })

  if (runtime === "deno") {
    it("runs as well where it may not write the cache, and leaves the rejected one as it is", () => {
      const rejected = cache()
      const good = readFileSync(rejected)
      writeFileSync(rejected, "not a code cache")
      const run = start({ write: false })
      expect(run.stderr).not.toContain("NotCapable")
      expect(run.status).toBe(0)
      expect(run.published.at(-1)).toEqual({ message_type: "success", response: { words: 3 } })
      expect(readFileSync(rejected, "utf8")).toBe("not a code cache")
      expect(caches()).toHaveLength(1)
      writeFileSync(rejected, good)
    })
  }

  it("never runs the cache of an earlier build of the same length", () => {
    // V8 checks a cache against its source's length only: a rebuilt bundle of the same length
    // must not run the earlier build's code.
    const bundle = join(out, "worker.cjs")
    const before = readFileSync(bundle, "utf8")
    const edited = before.replace("input.text.split(/\\s+/)", "input.text.split(/\\s*/)")
    expect(edited).not.toBe(before)
    expect(edited.length).toBe(before.length)
    writeFileSync(bundle, edited)
    const run = start()
    expect(run.status).toBe(0)
    // Split on nothing, "one two three" is 11 words: the edited code ran, not the cached one.
    expect(run.published.at(-1)).toEqual({ message_type: "success", response: { words: 11 } })
    expect(caches()).toHaveLength(2)
  })
})

describe("examples/deploy/bundle and a threaded handler (examples/threads)", () => {
  const out = mkdtempSync(join(tmpdir(), "bundle-threads-"))
  beforeAll(() => {
    checkBuild()
    execFileSync(
      supportedNode(),
      ["examples/deploy/bundle/build.mjs", "examples/threads/worker.ts", "worker", out],
      { cwd: ROOT },
    )
  })
  afterAll(() => rmSync(out, { recursive: true, force: true }))

  it(
    "refuses to build a threaded handler whose module it cannot follow, saying how to name it",
    () => {
      const refused = spawnSync(
        supportedNode(),
        [
          "examples/deploy/bundle/build.mjs",
          "test/fixtures/threads/unbundlable.mjs",
          "worker",
          join(out, "refused"),
        ],
        { cwd: ROOT, encoding: "utf8", timeout: 60_000 },
      )
      expect(refused.status).not.toBe(0)
      expect(refused.stderr).toContain("names a threaded handler's module in a way this build")
    },
    60_000,
  )

  it("builds the thread's module beside the bundle", () => {
    expect(readdirSync(join(out, "threads")).filter((f) => f.endsWith(".cjs"))).toHaveLength(1)
  })

  it.each(["node", "deno"] as const)(
    "runs its task on a thread of the bundle, on %s",
    (runtime) => {
      const { command, args } = commandLine(runtime, out, true)
      const env = jobEnv()
      const run = spawnSync(command, args, {
        cwd: out,
        input: `{"task_id": "t-1", "data": {"body": {"text": "hello", "rounds": 1000}}}\n`,
        encoding: "utf8",
        timeout: 30_000,
        env,
      })
      expect(run.status, `${run.stdout}\n${run.stderr}`).toBe(0)
      const terminal = run.stdout.split("\n").filter((l) => l.startsWith('{"task_id"')).at(-1)
      expect(JSON.parse(terminal ?? "{}").data).toMatchObject({
        message_type: "success",
        response: { score: expect.any(Number) },
      })
    },
    60_000,
  )
})
