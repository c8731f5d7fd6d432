/**
 * A TypeScript worker module and the CLI (issue 18): Node 22.18+, 24 and 26 strip its types and
 * run it; a Node that cannot gets one line saying how to run it instead, chosen by the import's
 * own error (`Command.typeScriptHint`). The processes run the CLI built into `dist/` on the
 * system's Node (20 here, which the CLI refuses as too old) and on Node 24 and 26, whichever
 * runtime runs the suite.
 */
import { spawnSync } from "node:child_process"
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Command from "../src/Command.ts"
import { node22Binary, node24Binary, node26Binary, systemNode } from "./support/nodes.ts"
import { baseEnv, checkBuild, denoBinary, ROOT } from "./support/runtimes.ts"

/** An error as Node's loader makes them. */
const nodeError = (code: string, message: string) => Object.assign(new TypeError(message), { code })

const unknownExtension = (extension: string) =>
  nodeError(
    "ERR_UNKNOWN_FILE_EXTENSION",
    `Unknown file extension "${extension}" for /srv/app/worker${extension}`,
  )

describe("Command.typeScriptHint", () => {
  // Nodes that strip no types by default (before 22.18) are refused by the CLI before it loads a
  // module: test/integration/npm-package.test.ts and the test below check that line.
  it("a supported Node with stripping turned off: the flag to drop, or compile it", () => {
    expect(Command.typeScriptHint(unknownExtension(".ts"), "./worker.ts", "22.23.5")).toBe(
      "cannot load ./worker.ts: Node v22.23.5 strips no types from .ts files, as it runs with " +
        "--no-experimental-strip-types: run it without that flag, or compile it with tsc and run " +
        "the .js",
    )
    for (const [extension, node] of [[".mts", "24.22.3"], [".cts", "26.1.0"]] as const) {
      expect(Command.typeScriptHint(unknownExtension(extension), "./w", node)).toContain(
        `Node v${node} strips no types from ${extension} files`,
      )
    }
  })

  it("a TypeScript file under node_modules: named, with what to do", () => {
    const error = nodeError(
      "ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING",
      'Stripping types is currently unsupported for files under node_modules, for "file:///srv/app/node_modules/dep/index.ts"',
    )
    expect(Command.typeScriptHint(error, "./w.ts", "24.22.3")).toBe(
      "cannot load ./w.ts: Node strips types only outside node_modules, and " +
        "file:///srv/app/node_modules/dep/index.ts is inside: compile it to JavaScript, or run " +
        "the worker on Deno",
    )
  })

  it("syntax that stripping cannot erase: Node's message, and what to do", () => {
    const error = nodeError(
      "ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX",
      "TypeScript enum is not supported in strip-only mode\n  at /srv/app/w.ts:1:1",
    )
    expect(Command.typeScriptHint(error, "./w.ts", "24.22.3")).toBe(
      "cannot load ./w.ts: TypeScript enum is not supported in strip-only mode: Node's type " +
        "stripping only erases types; use NODE_OPTIONS=--experimental-transform-types, or " +
        "compile it with tsc and run the .js",
    )
  })

  it("anything else is not its business", () => {
    const others: ReadonlyArray<unknown> = [
      unknownExtension(".tsx"),
      unknownExtension(".coffee"),
      nodeError("ERR_MODULE_NOT_FOUND", "Cannot find module '/srv/app/w.ts'"),
      new Error('Unknown file extension ".ts"'),
      "ERR_UNKNOWN_FILE_EXTENSION",
      undefined,
      new Proxy({}, {
        get: () => {
          throw new Error("no")
        },
      }),
    ]
    for (const error of others) {
      expect(Command.typeScriptHint(error, "./w.ts", "20.20.2")).toBe(undefined)
    }
  })
})

describe("the built CLI and a .ts worker", () => {
  const dir = mkdtempSync(join(tmpdir(), "cli-typescript-"))
  // The worker imports the SDK and effect as the CLI does, from the repository.
  const sdk = pathToFileURL(join(ROOT, "dist/index.js")).href
  const effect = pathToFileURL(join(ROOT, "node_modules/effect/dist/index.js")).href
  const TASK = '{"text":"one two three"}\n'

  beforeAll(() => {
    checkBuild()
    writeFileSync(
      join(dir, "worker.ts"),
      `import { Effect, Schema } from ${JSON.stringify(effect)}
import { Worker } from ${JSON.stringify(sdk)}

const Text = Schema.Struct({ text: Schema.String })
export const worker = Worker.make({
  name: "ts-worker",
  input: Text,
  output: Schema.Struct({ words: Schema.Number }),
  timeout: "5 seconds",
  handler: (input: typeof Text.Type) => Effect.succeed({ words: input.text.split(" ").length }),
})
`,
    )
    writeFileSync(join(dir, "enum.ts"), "enum Mode { A }\nexport const worker = Mode.A\n")
    mkdirSync(join(dir, "node_modules/dep"), { recursive: true })
    writeFileSync(
      join(dir, "node_modules/dep/package.json"),
      '{"name":"dep","type":"module","exports":"./index.ts"}',
    )
    writeFileSync(join(dir, "node_modules/dep/index.ts"), "export const worker: number = 1\n")
    writeFileSync(join(dir, "dep.ts"), 'export { worker } from "dep"\n')
  })
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  const cli = (node: string, module: string, env: Record<string, string> = {}) =>
    spawnSync(node, [join(ROOT, "dist/cli.js"), "run", module, "--memory"], {
      cwd: dir,
      env: { ...baseEnv(), HEALTH_CHECK_HOST: "127.0.0.1", HEALTH_CHECK_PORT: "0", ...env },
      input: TASK,
      encoding: "utf8",
      timeout: 30_000,
    })
  const oneLine = (result: ReturnType<typeof cli>) => {
    const output = `exit ${result.status}\n${result.stdout}\n${result.stderr}`
    expect(result.status, output).toBe(2)
    const lines = result.stderr.split("\n").filter((line) => line.trim() !== "")
    expect(lines, output).toHaveLength(1)
    return lines[0]!
  }

  it.each([["24", node24Binary], ["26", node26Binary]])("Node %s runs it", (_, node) => {
    const result = cli(node(), "./worker.ts")
    expect(result.status, result.stdout + result.stderr).toBe(0)
    expect(result.stdout).toContain(
      '{"task_id":"local-1","data":{"message_type":"success","response":{"words":3}}}',
    )
  }, 40_000)

  // Effect 4 needs Node 22.19: the CLI refuses an older Node before it loads the module, so the
  // system's Node (20 here) no longer gets to the TypeScript hint, which the cases above and
  // Node 24 with stripping turned off (below) still reach.
  it("the system's Node, older than the SDK supports: exit 2, one line naming what to run", () => {
    const node = systemNode()
    const version = spawnSync(node, ["-p", "process.versions.node"], {
      encoding: "utf8",
    }).stdout.trim()
    const [major = 0, minor = 0] = version.split(".").map(Number)
    if (major > 22 || (major === 22 && minor >= 19)) return
    expect(oneLine(cli(node, "./worker.ts"))).toBe(
      `async-task-worker: Node v${version} is too old: the SDK needs Node 22.19 or later ` +
        "(22 LTS or 24), or Deno 2",
    )
  }, 40_000)

  it("Node 24 with stripping turned off, an enum, a .ts under node_modules: one line each", () => {
    const node24 = node24Binary()
    expect(
      oneLine(cli(node24, "./worker.ts", { NODE_OPTIONS: "--no-experimental-strip-types" })),
    ).toContain("runs with --no-experimental-strip-types")
    expect(oneLine(cli(node24, "./enum.ts"))).toContain(
      "TypeScript enum is not supported in strip-only mode: Node's type stripping only erases types",
    )
    expect(oneLine(cli(node24, "./dep.ts"))).toContain(
      "node_modules/dep/index.ts is inside: compile it to JavaScript",
    )
  }, 60_000)
})

describe("the CLI and a threaded handler's .ts module", () => {
  const dir = mkdtempSync(join(tmpdir(), "cli-thread-"))
  const effect = pathToFileURL(join(ROOT, "node_modules/effect/dist/index.js")).href

  /** A worker in `dir`, importing the SDK at `sdk`, whose handler runs `./score.ts` on a thread. */
  const writeWorker = (name: string, sdk: string) =>
    writeFileSync(
      join(dir, name),
      `import { Schema } from ${JSON.stringify(effect)}
import { Thread, Worker } from ${JSON.stringify(sdk)}

export const worker = Worker.make({
  name: "scored",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ score: Schema.Number, thread: Schema.Number }),
  timeout: "20 seconds",
  handler: Thread.handler(new URL("./score.ts", import.meta.url), "score"),
})
`,
    )

  beforeAll(() => {
    checkBuild()
    writeFileSync(
      join(dir, "score.ts"),
      `import { threadId } from "node:worker_threads"

interface Input { readonly text: string }
export const score = (input: Input): { score: number; thread: number } =>
  ({ score: input.text.length, thread: threadId })
`,
    )
    writeWorker("node-worker.ts", pathToFileURL(join(ROOT, "dist/index.js")).href)
    writeWorker("deno-worker.ts", pathToFileURL(join(ROOT, "src/index.ts")).href)
  })
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  /** The success the CLI printed, from a thread other than the main one (0). */
  const expectThreaded = (result: ReturnType<typeof spawnSync>) => {
    const output = `exit ${result.status}\n${result.stdout}\n${result.stderr}`
    expect(result.status, output).toBe(0)
    const success = String(result.stdout).split("\n").find((l) => l.includes('"success"'))
    const response = JSON.parse(success ?? "{}").data?.response
    expect(response?.score, output).toBe(5)
    expect(response?.thread, output).toBeGreaterThan(0)
  }

  const run = (command: string, args: ReadonlyArray<string>) =>
    spawnSync(command, [...args, "--memory"], {
      cwd: dir,
      env: { ...baseEnv(), HEALTH_CHECK_HOST: "127.0.0.1", HEALTH_CHECK_PORT: "0" },
      input: '{"text":"hello"}\n',
      encoding: "utf8",
      timeout: 30_000,
    })

  it.each([["22", node22Binary], ["24", node24Binary], ["26", node26Binary]])(
    "Node %s strips the types of both modules and runs the handler on a thread",
    (_, node) => {
      expectThreaded(run(node(), [join(ROOT, "dist/cli.js"), "run", "./node-worker.ts"]))
    },
    40_000,
  )

  it("Deno runs it from the sources", () => {
    expectThreaded(
      run(denoBinary(), ["run", "-A", join(ROOT, "cli.ts"), "run", "./deno-worker.ts"]),
    )
  }, 60_000)
})
