/**
 * The npm package as a Node user gets it (issue 18): the tarball `npm pack` makes from `dist/`,
 * installed with its peers into a fresh project outside the repository (from the registry, or
 * npm's cache); a strict TypeScript worker and a test of it with the typed harness, compiled
 * against the package (`test/fixtures/npm-package/`); the CLI running that worker on the embedded
 * broker: on the system's Node (20 here) from the compiled `.js` through `npx`, on Node 24 from
 * the `.ts` itself, and the one line a Node that cannot strip types answers instead.
 *
 * It drives both Nodes itself: it runs in the suite's pass on the system's Node, and is skipped
 * in the passes on Node 24 and Deno.
 */
import { spawnSync, type SpawnSyncReturns } from "node:child_process"
import { cpSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { delimiter, dirname, join } from "node:path"
import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { node24Binary, pathWithoutBins, systemNode } from "../support/nodes.ts"
import { checkBuild, ROOT } from "../support/runtimes.ts"

interface PackageJson {
  readonly peerDependencies: Record<string, string>
  readonly devDependencies: Record<string, string>
}

const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as PackageJson
const FIXTURES = join(ROOT, "test/fixtures/npm-package")

const onDeno = process.versions.deno !== undefined
const onNode24 = !onDeno && realpathSync(process.execPath) === realpathSync(node24Binary())

/**
 * A user's environment with `node` on PATH first: the machine's own (proxies and certificates
 * included), without what npm and vitest set for the suite's run (`npm_config_local_prefix`
 * would point a child npm at this repository) and without any `node_modules/.bin`.
 */
const userEnv = (node: string): Record<string, string> => {
  const env: Record<string, string> = {}
  for (const [key, value] of Object.entries(process.env)) {
    if (value === undefined || key.startsWith("npm_") || key.startsWith("VITEST")) continue
    if (["INIT_CWD", "NODE_OPTIONS", "NODE_ENV", "PATH"].includes(key)) continue
    env[key] = value
  }
  env.PATH = [dirname(node), pathWithoutBins()].join(delimiter)
  env.NO_COLOR = "1"
  env.HEALTH_CHECK_HOST = "127.0.0.1"
  env.HEALTH_CHECK_PORT = "0"
  return env
}

const show = (result: SpawnSyncReturns<string>) =>
  `exit ${result.status} (${result.signal ?? "no signal"}${
    result.error ? `, ${result.error.message}` : ""
  })\n--- stdout ---\n${result.stdout?.slice(-4000)}\n--- stderr ---\n${
    result.stderr?.slice(-4000)
  }`

describe.skipIf(onDeno || onNode24)("the npm package in a fresh Node project", () => {
  const node20 = onDeno ? "node" : systemNode()
  const node24 = node24Binary()
  let dir = ""
  let project = ""
  let packed: ReadonlyArray<string> = []

  /** Runs `command` in the project (or `cwd`) as a user would, on `node`; throws unless it exits 0. */
  const run = (
    command: string,
    args: ReadonlyArray<string>,
    options: { readonly node?: string; readonly cwd?: string; readonly input?: string } = {},
  ) =>
    spawnSync(command, args, {
      cwd: options.cwd ?? project,
      env: userEnv(options.node ?? node20),
      encoding: "utf8",
      input: options.input ?? "",
      timeout: 180_000,
    })
  const ok = (result: SpawnSyncReturns<string>, what: string) => {
    if (result.status !== 0) throw new Error(`${what} failed: ${show(result)}`)
    return result.stdout
  }

  beforeAll(() => {
    checkBuild()
    dir = mkdtempSync(join(tmpdir(), "npm-package-"))
    project = join(dir, "project")
    // The build `npm test` made: `prepack` would rebuild dist/ under the tests that run it.
    const [tarball] = JSON.parse(
      ok(
        run("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", dir], {
          cwd: ROOT,
        }),
        "npm pack",
      ),
    ) as ReadonlyArray<
      { readonly filename: string; readonly files: ReadonlyArray<{ path: string }> }
    >
    packed = tarball!.files.map((f) => f.path)
    mkdirSync(project)
    ok(run("npm", ["init", "-y"]), "npm init")
    ok(run("npm", ["pkg", "set", "type=module"]), "npm pkg set")
    ok(
      run("npm", [
        "install",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--prefer-offline",
        join(dir, tarball!.filename),
        `effect@${pkg.peerDependencies["effect"]}`,
        `@effect/platform@${pkg.peerDependencies["@effect/platform"]}`,
        `typescript@${pkg.devDependencies["typescript"]}`,
        `@types/node@${pkg.devDependencies["@types/node"]}`,
      ]),
      "npm install",
    )
    for (const file of ["tsconfig.json", "worker.ts", "harness.ts"]) {
      cpSync(join(FIXTURES, file), join(project, file))
    }
  }, 300_000)
  afterAll(() => {
    if (dir !== "") rmSync(dir, { recursive: true, force: true })
  })

  it("the tarball holds dist/, src/, cli.ts, README.md, LICENSE and package.json, no more", () => {
    const tops = [...new Set(packed.map((path) => path.split("/")[0]))].sort()
    expect(tops).toEqual(["LICENSE", "README.md", "cli.ts", "dist", "package.json", "src"])
    expect(packed).toContain("dist/cli.js")
    expect(packed).toContain("dist/index.d.ts")
  })

  it("a strict worker and its typed harness test compile against the package", () => {
    // tsc exits non-zero on any error, an unused `@ts-expect-error` in harness.ts included.
    const tsc = run(node20, ["node_modules/typescript/bin/tsc", "-p", "."])
    expect(tsc.status, show(tsc)).toBe(0)
    expect(tsc.stdout).toBe("")
    const harness = run(node20, ["out/harness.js"])
    expect(harness.status, show(harness)).toBe(0)
    expect(harness.stdout).toContain(
      'RESULT {"words":3,"first":"one","types":["started","progress","success"]}',
    )
  }, 120_000)

  it("npx async-task-worker runs the compiled worker on the system's Node, --memory", () => {
    const cli = run("npx", ["async-task-worker", "run", "./out/worker.js", "--memory"], {
      input: '{"text":"one two three"}\n',
    })
    expect(cli.status, show(cli)).toBe(0)
    expect(cli.stdout).toContain(
      '{"task_id":"local-1","data":{"message_type":"success","response":{"words":3,"first":"one"}}}',
    )
  }, 60_000)

  it("on Node 24, the CLI runs worker.ts itself, and node runs the harness test's .ts", () => {
    const cli = run("npx", ["async-task-worker", "run", "./worker.ts", "--memory"], {
      node: node24,
      input: '{"text":"one two"}\n',
    })
    expect(cli.status, show(cli)).toBe(0)
    expect(cli.stdout).toContain(
      '{"task_id":"local-1","data":{"message_type":"success","response":{"words":2,"first":"one"}}}',
    )
    const harness = run(node24, ["harness.ts"], { node: node24 })
    expect(harness.status, show(harness)).toBe(0)
    expect(harness.stdout).toContain('RESULT {"words":3')
  }, 60_000)

  it("on a Node that strips no types, worker.ts: exit 2 and one line saying what to do", (ctx) => {
    const strips = run(node20, ["-p", "Boolean(process.features.typescript)"])
    // The one line is Node 20's (and 22.6 – 22.17's): skipped, said, where the Node strips types.
    if (ok(strips, "node -p").trim() === "true") return ctx.skip()
    const cli = run("npx", ["async-task-worker", "run", "./worker.ts", "--memory"], {
      input: '{"text":"one"}\n',
    })
    expect(cli.status, show(cli)).toBe(2)
    const lines = cli.stderr.split("\n").filter((line) => line.trim() !== "")
    expect(lines, show(cli)).toHaveLength(1)
    expect(lines[0]).toMatch(
      /^async-task-worker: cannot load \.\/worker\.ts: Node v\d+\.\d+\.\d+ .*TypeScript/,
    )
    expect(lines[0]).toContain("Node 22.18+ or 24")
    expect(lines[0]).toContain("Deno")
    expect(lines[0]).toContain("compile it with tsc")
    expect(cli.stdout).toBe("")
  }, 60_000)
})
