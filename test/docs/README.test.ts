/**
 * Every TypeScript block of the README compiles as written: each is extracted to a file of its
 * own and checked by `deno check` (Deno's types: `import.meta.main` included), in the project,
 * which imports itself by the package's name; and by `tsc` as a strict Node project compiles it,
 * declarations emitted and every library's checked (`export const App = Worker.layer(…)` must be
 * nameable), against the package as built into `dist/` — by the compiler that builds `dist/` and
 * by TypeScript 7, the native one (`typescript7`).
 */
import { spawnSync } from "node:child_process"
import process from "node:process"
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { onNode22, supportedNode } from "../support/nodes.ts"
import { baseEnv, checkBuild, denoBinary, ROOT } from "../support/runtimes.ts"

const blocks = (markdown: string): Array<string> =>
  [...markdown.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]!)

/** The pinned compiler's package and TypeScript 7's. */
const COMPILERS = [["typescript"], ["typescript7"]] as const

// A compile's answer does not depend on the runtime running the suite: once, in the Node 22 pass.
const compileHere = onNode22()

/** `tsc -p dir` of `compiler`: what it said, and its exit code. */
const compile = (compiler: string, dir: string) =>
  spawnSync(
    supportedNode(),
    [join(ROOT, "node_modules", compiler, "bin/tsc"), "-p", dir],
    { cwd: dir, encoding: "utf8", timeout: 120_000 },
  )

/** `tsc -p dir` of `compiler`, which must say nothing and succeed. */
const tsc = (compiler: string, dir: string): void => {
  const result = compile(compiler, dir)
  expect(result.stdout + result.stderr, "tsc of the README's blocks").toBe("")
  expect(result.status).toBe(0)
}

/** A worker module importing a module of its own by its `.ts` name, as Node and Deno run it. */
const TS_WORKER = `import { Schema } from "effect"
import { Worker } from "@async-task/worker"
import { score } from "./score.ts"

export const worker = Worker.make({
  name: "scored",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ score: Schema.Number }),
  timeout: "5 seconds",
  handler: async ({ text }) => ({ score: score(text) }),
})
`

describe("README.md", () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8")
  // And the docs' blocks (docs/protocol.md's amqplib recipe), checked as the README's are.
  const found = [
    ...blocks(readme),
    ...["protocol.md"].flatMap((page) => blocks(readFileSync(join(ROOT, "docs", page), "utf8"))),
  ]
  expect(found.some((block) => block.includes('from "amqplib"'))).toBe(true)

  it("has TypeScript blocks to check", () => {
    expect(found.length).toBeGreaterThanOrEqual(5)
  })

  it("compiles every TypeScript block as written", () => {
    // Inside the project (Deno finds its node_modules; it checks no file inside them), removed
    // afterwards.
    const dir = join(ROOT, ".readme-blocks")
    rmSync(dir, { recursive: true, force: true })
    mkdirSync(dir, { recursive: true })
    try {
      const files = found.map((block, i) => {
        const file = join(dir, `block-${i + 1}.ts`)
        writeFileSync(file, block)
        return file
      })
      // The project's own deno.json: the package imports itself by its name (`exports`).
      const result = spawnSync(denoBinary(), ["check", "--quiet", ...files], {
        cwd: ROOT,
        encoding: "utf8",
        env: { ...process.env, NO_COLOR: "1" },
        timeout: 120_000,
      })
      expect(result.stderr + result.stdout, "deno check of the README's blocks").toBe("")
      expect(result.status).toBe(0)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 150_000)

  /** The tsconfig.json the Install section gives, with `include`. */
  const installTsconfig = (include: ReadonlyArray<string>): string => {
    const install = readme.slice(
      readme.indexOf("\n## Install\n"),
      readme.indexOf("\n## Quick start\n"),
    )
    const json = /^```json\n([\s\S]*?)^```$/m.exec(install)?.[1]
    expect(json, "a tsconfig.json in the Install section").toBeDefined()
    return JSON.stringify({ ...(JSON.parse(json!) as object), include })
  }

  it.runIf(compileHere).each(COMPILERS)(
    "compiles every TypeScript block with %s and the tsconfig.json the Install section gives",
    (compiler) => {
      checkBuild()
      const dir = join(ROOT, `.readme-tsconfig-${compiler}`)
      rmSync(dir, { recursive: true, force: true })
      mkdirSync(dir, { recursive: true })
      try {
        found.forEach((block, i) => writeFileSync(join(dir, `block-${i + 1}.ts`), block))
        // As the README gives it: only the files it compiles are the test's.
        writeFileSync(join(dir, "tsconfig.json"), installTsconfig(["block-*.ts"]))
        tsc(compiler, dir)
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
    150_000,
  )

  it.runIf(compileHere).each(COMPILERS)(
    "compiles every TypeScript block with %s, declarations emitted, strict, libraries checked",
    (compiler) => {
      checkBuild()
      const dir = join(ROOT, `.readme-declarations-${compiler}`)
      rmSync(dir, { recursive: true, force: true })
      mkdirSync(dir, { recursive: true })
      try {
        found.forEach((block, i) => writeFileSync(join(dir, `block-${i + 1}.ts`), block))
        writeFileSync(
          join(dir, "tsconfig.json"),
          JSON.stringify({
            compilerOptions: {
              strict: true,
              exactOptionalPropertyTypes: true,
              noUncheckedIndexedAccess: true,
              declaration: true,
              emitDeclarationOnly: true,
              skipLibCheck: false,
              outDir: "out",
              rootDir: ".",
              module: "NodeNext",
              moduleResolution: "NodeNext",
              target: "ES2023",
              // Effect's own declarations name Web Crypto types (the README says so).
              lib: ["ES2023", "DOM"],
              types: ["node"],
            },
            include: ["block-*.ts"],
          }),
        )
        tsc(compiler, dir)
        expect(found.map((_, i) => existsSync(join(dir, "out", `block-${i + 1}.d.ts`)))).toEqual(
          found.map(() => true),
        )
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
    150_000,
  )

  it.runIf(compileHere).each(COMPILERS)(
    "the Install section's tsconfig.json with %s: a .ts worker importing ./score.ts compiles and the CLI runs it; what Node cannot strip is refused",
    (compiler) => {
      checkBuild()
      const dir = join(ROOT, `.readme-ts-worker-${compiler}`)
      rmSync(dir, { recursive: true, force: true })
      mkdirSync(dir, { recursive: true })
      try {
        writeFileSync(join(dir, "tsconfig.json"), installTsconfig(["*.ts"]))
        writeFileSync(join(dir, "worker.ts"), TS_WORKER)
        writeFileSync(
          join(dir, "score.ts"),
          "export const score = (text: string): number => text.length\n",
        )
        tsc(compiler, dir)
        // As the README runs a worker: the CLI, on a Node that strips the types, one task.
        const run = spawnSync(supportedNode(), [join(ROOT, "dist/cli.js"), "run", "./worker.ts"], {
          cwd: dir,
          encoding: "utf8",
          timeout: 60_000,
          input:
            '{"task_id": "t-1", "data": {"message_type": "submission", "body": {"text": "four"}}}\n',
          env: {
            ...baseEnv(),
            WORKER_TRANSPORT: "memory",
            WORKER_MODE: "job",
            WORKER_JOB_MAX_TASKS: "1",
            HEALTH_CHECK_PORT: "0",
          },
        })
        expect(run.stdout, run.stderr).toContain('"response":{"score":4}')
        expect(run.status).toBe(0)
        // A parameter property compiles to code, which Node's type stripping refuses: so must tsc.
        writeFileSync(
          join(dir, "score.ts"),
          "export class Scorer { constructor(private readonly weight: number) {} }\n" +
            "export const score = (text: string): number => new Scorer(1) && text.length\n",
        )
        const refused = compile(compiler, dir)
        expect(refused.stdout).toContain("TS1294")
        expect(refused.status).not.toBe(0)
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
    150_000,
  )
})
