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
import { checkBuild, denoBinary, ROOT } from "../support/runtimes.ts"

const blocks = (markdown: string): Array<string> =>
  [...markdown.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]!)

/** The pinned compiler's package and TypeScript 7's. */
const COMPILERS = [["typescript"], ["typescript7"]] as const

// A compile's answer does not depend on the runtime running the suite: once, in the Node 22 pass.
const compileHere = onNode22()

/** `tsc -p dir` of `compiler`, which must say nothing and succeed. */
const tsc = (compiler: string, dir: string): void => {
  const result = spawnSync(
    supportedNode(),
    [join(ROOT, "node_modules", compiler, "bin/tsc"), "-p", dir],
    { cwd: dir, encoding: "utf8", timeout: 120_000 },
  )
  expect(result.stdout + result.stderr, "tsc of the README's blocks").toBe("")
  expect(result.status).toBe(0)
}

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

  it.runIf(compileHere).each(COMPILERS)(
    "compiles every TypeScript block with %s and the tsconfig.json the Install section gives",
    (compiler) => {
      checkBuild()
      const install = readme.slice(
        readme.indexOf("\n## Install\n"),
        readme.indexOf("\n## Quick start\n"),
      )
      const json = /^```json\n([\s\S]*?)^```$/m.exec(install)?.[1]
      expect(json, "a tsconfig.json in the Install section").toBeDefined()
      const dir = join(ROOT, `.readme-tsconfig-${compiler}`)
      rmSync(dir, { recursive: true, force: true })
      mkdirSync(dir, { recursive: true })
      try {
        found.forEach((block, i) => writeFileSync(join(dir, `block-${i + 1}.ts`), block))
        // As the README gives it: only the files it compiles are the test's.
        const tsconfig = { ...(JSON.parse(json!) as object), include: ["block-*.ts"] }
        writeFileSync(join(dir, "tsconfig.json"), JSON.stringify(tsconfig))
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
})
