/**
 * The README's Deno recipe, as a user follows it today (the package is not on JSR yet): a project
 * of its own outside this repository, the package from `npm pack` installed by npm with its peers,
 * and test/fixtures/deno-project/deno.json (a strict user's compilerOptions). The README's blocks
 * type-check there; its "As a process" worker runs with exactly the permissions its comment gives,
 * on the embedded broker, and so does the README's Deno CLI line; leaving out any one permission
 * exits 2 naming its flag.
 */
import { spawnSync, type SpawnSyncReturns } from "node:child_process"
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { delimiter, dirname, join } from "node:path"
import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { pathWithoutBins, supportedNode } from "../support/nodes.ts"
import { baseEnv, checkBuild, denoBinary, ROOT } from "../support/runtimes.ts"

const FIXTURE = join(ROOT, "test/fixtures/deno-project")
const readme = readFileSync(join(ROOT, "README.md"), "utf8")

const tsBlocks = (markdown: string): Array<string> =>
  [...markdown.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]!)

/** The first TypeScript block after `heading`. */
const blockAfter = (heading: string): string => {
  const at = readme.indexOf(`\n${heading}\n`)
  const block = at < 0 ? undefined : tsBlocks(readme.slice(at))[0]
  if (block === undefined) throw new Error(`README.md has no TypeScript block under "${heading}"`)
  return block
}

/** The `--allow-…` flags of a `deno run` line, which must be in `text`. */
const permissionsOf = (text: string, line: RegExp, what: string): Array<string> => {
  const match = line.exec(text)
  if (match === null) throw new Error(`README.md has no ${what} (${line})`)
  return match[1]!.trim().split(/\s+/)
}

const worker = blockAfter("### As a process")
// `if (import.meta.main) Worker.run(worker) // deno run --allow-… echo.ts`
const scriptPermissions = permissionsOf(
  worker,
  /\/\/ deno run ((?:--allow-\S+ )+)echo\.ts$/m,
  "`deno run … echo.ts` comment in the As a process block",
)
// `deno run --allow-… \` then `npm:@async-task/worker run ./my_worker.ts`, in "With the CLI".
const cliPermissions = permissionsOf(
  readme,
  /^deno run ((?:--allow-\S+ )+)\\\n\s+npm:@async-task\/worker run \.\/my_worker\.ts/m,
  "Deno CLI line",
)

/**
 * What npm needs from the test's environment: its registry, cache, proxy and CAs, if set; and a
 * supported Node first on PATH, for npm itself to run on.
 */
const npmEnv = (): Record<string, string> => {
  const env: Record<string, string> = {
    ...baseEnv(),
    PATH: [dirname(supportedNode()), pathWithoutBins()].join(delimiter),
  }
  for (const [key, value] of Object.entries(process.env)) {
    if (value === undefined) continue
    const npmKey = /^npm_config_(registry|cache|userconfig)$/i
    if (
      npmKey.test(key) ||
      /^(https?_proxy|no_proxy|node_extra_ca_certs|ssl_cert_(file|dir))$/i.test(key)
    ) {
      env[key] = value
    }
  }
  return env
}

const run = (
  command: string,
  args: ReadonlyArray<string>,
  options: { cwd: string; input?: string; env?: Record<string, string> },
): SpawnSyncReturns<string> =>
  spawnSync(command, args, {
    cwd: options.cwd,
    encoding: "utf8",
    env: options.env ?? baseEnv(),
    input: options.input ?? "",
    timeout: 90_000,
  })

const said = (result: SpawnSyncReturns<string>): string =>
  `exit ${result.status}${result.error ? ` (${result.error.message})` : ""}\n` +
  result.stderr + result.stdout

/** The JSON comment lines a deno config may hold, removed. */
const readJsonc = (path: string): Record<string, unknown> =>
  JSON.parse(readFileSync(path, "utf8").replace(/^\s*\/\/.*$/gm, "")) as Record<string, unknown>

describe("the README's Deno recipe, from a project of its own", () => {
  let dir = ""
  let project = ""

  beforeAll(() => {
    checkBuild()
    dir = mkdtempSync(join(tmpdir(), "async-task-deno-project-"))
    const packDir = join(dir, "pack")
    project = join(dir, "project")
    mkdirSync(packDir)
    mkdirSync(project)

    // The build `npm test` made (checked above): `prepack` would delete and rebuild dist/ under
    // the tests running beside this one.
    const packed = run(
      "npm",
      ["pack", "--ignore-scripts", "--json", "--pack-destination", packDir],
      {
        cwd: ROOT,
        env: npmEnv(),
      },
    )
    expect(packed.status, said(packed)).toBe(0)
    const [{ filename }] = JSON.parse(packed.stdout) as [{ filename: string }]

    const manifest = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
      peerDependencies: Record<string, string>
      devDependencies: Record<string, string>
    }
    writeFileSync(
      join(project, "package.json"),
      JSON.stringify({ name: "a-deno-worker", private: true, type: "module" }),
    )
    const installed = run("npm", [
      "install",
      "--no-audit",
      "--no-fund",
      "--ignore-scripts",
      join(packDir, filename),
      ...Object.entries(manifest.peerDependencies).map(([name, range]) => `${name}@${range}`),
      // The logger of the README's recipe for another library's logs, as its reader installs it.
      `pino@${manifest.devDependencies.pino}`,
    ], { cwd: project, env: npmEnv() })
    expect(installed.status, said(installed)).toBe(0)

    copyFileSync(join(FIXTURE, "deno.json"), join(project, "deno.json"))
    writeFileSync(join(project, "echo.ts"), worker)
    writeFileSync(join(project, "my_worker.ts"), worker)
    mkdirSync(join(project, "blocks"))
    tsBlocks(readme).forEach((block, i) => {
      writeFileSync(join(project, "blocks", `block-${i + 1}.ts`), block)
    })
  }, 180_000)

  afterAll(() => {
    if (dir !== "") rmSync(dir, { recursive: true, force: true })
  })

  it("checks its options against the library's own strict check", () => {
    const options = readJsonc(join(FIXTURE, "deno.json")).compilerOptions
    expect(options).toEqual({
      strict: true,
      noUncheckedIndexedAccess: true,
      exactOptionalPropertyTypes: true,
    })
    // The library's sources pass `deno task check:strict` under the same options.
    expect(readJsonc(join(ROOT, "deno.strict.json")).compilerOptions).toEqual(options)
    expect(readJsonc(join(ROOT, "tsconfig.strict.json")).compilerOptions).toMatchObject(
      options as object,
    )
  })

  it("type-checks the worker and every README block with `deno check`", () => {
    const checked = run(denoBinary(), ["check", "--quiet", "echo.ts", "blocks/"], {
      cwd: project,
    })
    expect(checked.stderr + checked.stdout, said(checked)).toBe("")
    expect(checked.status).toBe(0)
  }, 120_000)

  const settles = (result: SpawnSyncReturns<string>, text: string) => {
    const published = result.stdout.split("\n").flatMap((line) => {
      try {
        return [JSON.parse(line) as { data?: { message_type?: string; response?: unknown } }]
      } catch {
        return []
      }
    })
    const success = published.find((message) => message.data?.message_type === "success")
    expect(success?.data?.response, said(result)).toEqual({ text })
    expect(result.status, said(result)).toBe(0)
  }

  const memory = { ...baseEnv(), WORKER_TRANSPORT: "memory", HEALTH_CHECK_PORT: "0" }

  it(`runs the worker with ${scriptPermissions.join(" ")} only`, () => {
    expect(scriptPermissions).not.toContain("-A")
    const result = run(denoBinary(), ["run", ...scriptPermissions, "echo.ts"], {
      cwd: project,
      env: memory,
      input: `{"text":"from a Deno project"}\n`,
    })
    settles(result, "from a Deno project")
  }, 120_000)

  it(`runs the CLI with ${cliPermissions.join(" ")} only`, () => {
    const result = run(
      denoBinary(),
      ["run", ...cliPermissions, "npm:@async-task/worker", "run", "./my_worker.ts", "--memory"],
      { cwd: project, env: { ...baseEnv(), HEALTH_CHECK_PORT: "0" }, input: `{"text":"cli"}\n` },
    )
    settles(result, "cli")
  }, 120_000)

  const lines = [
    { name: "worker", permissions: scriptPermissions, args: ["echo.ts"], env: memory },
    {
      name: "CLI",
      permissions: cliPermissions,
      args: ["npm:@async-task/worker", "run", "./my_worker.ts", "--memory"],
      env: { ...baseEnv(), HEALTH_CHECK_PORT: "0" },
    },
  ]
  const without = (line: (typeof lines)[number], left: string) =>
    run(denoBinary(), ["run", ...line.permissions.filter((p) => p !== left), ...line.args], {
      cwd: project,
      env: line.env,
      input: `{"text":"never"}\n`,
    })

  it("needs every one of those permissions, and names the one left out", () => {
    for (const line of lines) {
      for (const left of line.permissions) {
        const result = without(line, left)
        const flag = left.replace(/=.*$/, "")
        const context = `${line.name} without ${left}: ${said(result)}`
        // Deno's own line ("run again with the --allow-read flag"), or the SDK's, which names
        // every permission missing with its narrow flag ("run again with --allow-sys=hostname").
        expect(said(result), context).toMatch(new RegExp(`run again with (the )?(\\S+ )*${flag}`))
        expect(result.status, context).not.toBe(0)
        // Those the settings or the CLI's module loading need exit 2 ("A Deno permission is
        // missing: …"); --allow-net is below.
        if (flag !== "--allow-net") expect(result.status, context).toBe(2)
      }
    }
  }, 120_000)

  // Deno's node:net throws NotCapable from `server.listen` on a later tick, out of reach of
  // any handler: the probe server asks for the permission before it listens.
  it("exits 2 without --allow-net, naming the flag, like the other permissions", () => {
    for (const line of lines) {
      const run = without(line, "--allow-net")
      expect(run.status).toBe(2)
      expect(run.stderr).toMatch(/run again with (\S+ )*--allow-net/)
    }
  }, 120_000)
})
