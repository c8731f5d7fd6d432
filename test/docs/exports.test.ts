/**
 * Every export of a public module (`src/*.ts`) has a doc comment with a `@since` and exactly one
 * `@category` from the shared list, so that the API reference groups every module the same way.
 */
import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { createRequire } from "node:module"
import type * as TS from "typescript"
import { describe, expect, it } from "vitest"
import { ROOT } from "../support/runtimes.ts"

const ts: typeof TS = createRequire(join(ROOT, "package.json"))("typescript")

/** The categories of the API reference, one per export. */
export const CATEGORIES = [
  "models",
  "constructors",
  "layers",
  "services",
  "references",
  "running",
  "errors",
  "constants",
  "metrics",
  "codecs",
  "combinators",
  "routes",
  "logging",
  "testing",
] as const

interface Problem {
  readonly where: string
  readonly problem: string
}

const problemsOf = (file: string): Array<Problem> => {
  const text = readFileSync(file, "utf8")
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true)
  const problems: Array<Problem> = []
  let previous: TS.Statement | undefined
  for (const statement of source.statements) {
    // The overloads of a function after its first share its documentation.
    const overload = ts.isFunctionDeclaration(statement) && previous !== undefined &&
      ts.isFunctionDeclaration(previous) && previous.name?.text === statement.name?.text
    previous = statement
    if (overload) continue
    const exported = ts.canHaveModifiers(statement) &&
      (ts.getModifiers(statement) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword)
    const reExport = ts.isExportDeclaration(statement)
    if (!exported && !reExport) continue
    const line = source.getLineAndCharacterOfPosition(statement.getStart()).line + 1
    const where = `${file.slice(ROOT.length + 1)}:${line}`
    // `export * from` forwards another module's documented exports.
    if (reExport && statement.exportClause === undefined) continue
    const docs = ts.getJSDocCommentsAndTags(statement).filter(ts.isJSDoc)
    const tags = docs.flatMap((doc) => [...(doc.tags ?? [])])
    const since = tags.filter((t) => t.tagName.text === "since")
    const categories = tags.filter((t) => t.tagName.text === "category")
      .map((t) => String(t.comment ?? "").trim())
    if (since.length !== 1) problems.push({ where, problem: "no single @since" })
    if (categories.length !== 1) {
      problems.push({ where, problem: `${categories.length} @category tags` })
    } else if (!(CATEGORIES as ReadonlyArray<string>).includes(categories[0]!)) {
      problems.push({ where, problem: `@category ${categories[0]} is not in the list` })
    }
  }
  return problems
}

describe("the public modules' exports", () => {
  const modules = readdirSync(join(ROOT, "src"))
    .filter((name) => name.endsWith(".ts") && name !== "index.ts" && name !== "cli.ts")
    .map((name) => join(ROOT, "src", name))

  it("each have one @since and one @category from the list", () => {
    expect(modules.length).toBeGreaterThan(20)
    expect(modules.flatMap(problemsOf)).toEqual([])
  })

  it("catches an export without them", () => {
    const file = join(ROOT, "test/fixtures/docs/undocumented.ts")
    expect(problemsOf(file).map((p) => p.problem)).toEqual([
      "no single @since",
      "0 @category tags",
      "@category tags is not in the list",
    ])
  })
})
