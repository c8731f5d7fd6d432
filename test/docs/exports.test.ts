/**
 * Every export of a public module (`src/*.ts`) has a doc comment with a `@since` and exactly one
 * `@category` from the shared list, so that the API reference groups every module the same way.
 */
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join } from "node:path"
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

const isExported = (statement: TS.Statement): boolean =>
  ts.canHaveModifiers(statement) &&
  (ts.getModifiers(statement) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword)

/** Whether `statement` declares `name` (`export const a = …, b = …` declares both). */
const declares = (statement: TS.Statement, name: string): boolean =>
  ts.isVariableStatement(statement)
    ? statement.declarationList.declarations.some((d) => d.name.getText() === name)
    : (statement as { readonly name?: TS.Identifier }).name?.text === name

/** The problems of one documented statement's doc comment. */
const docProblems = (statement: TS.Statement, where: string): Array<Problem> => {
  const problems: Array<Problem> = []
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
  return problems
}

const sourceOf = (file: string): TS.SourceFile =>
  ts.createSourceFile(file, readFileSync(file, "utf8"), ts.ScriptTarget.Latest, true)

const whereOf = (source: TS.SourceFile, statement: TS.Statement): string =>
  `${source.fileName.slice(ROOT.length + 1)}:${
    source.getLineAndCharacterOfPosition(statement.getStart()).line + 1
  }`

const problemsOf = (file: string): Array<Problem> => {
  const source = sourceOf(file)
  const problems: Array<Problem> = []
  let previous: TS.Statement | undefined
  for (const statement of source.statements) {
    // The overloads of a function after its first share its documentation.
    const overload = ts.isFunctionDeclaration(statement) && previous !== undefined &&
      ts.isFunctionDeclaration(previous) && previous.name?.text === statement.name?.text
    previous = statement
    if (overload) continue
    const exported = isExported(statement)
    const reExport = ts.isExportDeclaration(statement)
    if (!exported && !reExport) continue
    // `export * from` forwards another module's documented exports.
    if (reExport && statement.exportClause === undefined) continue
    if (
      reExport && statement.moduleSpecifier !== undefined &&
      ts.isStringLiteral(statement.moduleSpecifier) && ts.isNamedExports(statement.exportClause!)
    ) {
      // `export { a } from` forwards a declaration whose doc comment is what readers see (in
      // `deno doc`, on JSR, in an editor): that declaration's is checked.
      problems.push(...reExportProblems(
        source,
        statement,
        join(dirname(file), statement.moduleSpecifier.text),
        statement.exportClause.elements,
      ))
      continue
    }
    problems.push(...docProblems(statement, whereOf(source, statement)))
  }
  return problems
}

const reExportProblems = (
  source: TS.SourceFile,
  statement: TS.ExportDeclaration,
  target: string,
  elements: ReadonlyArray<TS.ExportSpecifier>,
): Array<Problem> => {
  const declarations = sourceOf(target)
  return elements.flatMap((element) => {
    const name = (element.propertyName ?? element.name).getText()
    // A type and a value of one name (`LifecycleState`) are two declarations, each documented.
    const declared = declarations.statements.filter((s) => isExported(s) && declares(s, name))
    return declared.length === 0
      ? [{ where: whereOf(source, statement), problem: `${name} is not declared there` }]
      : declared.flatMap((d) => docProblems(d, whereOf(declarations, d)))
  })
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

  it("follows a re-export to the declaration it forwards", () => {
    const file = join(ROOT, "test/fixtures/docs/reexport.ts")
    expect(problemsOf(file)).toEqual([
      { where: "test/fixtures/docs/undocumented.ts:4", problem: "no single @since" },
      { where: "test/fixtures/docs/undocumented.ts:4", problem: "0 @category tags" },
    ])
  })
})

describe("the main index", () => {
  it("exports every error the SDK fails or throws with, but the conformance kit's", async () => {
    const index = await import("../../src/index.ts")
    const errors = Object.keys(await import("../../src/WorkerError.ts"))
      .filter((name) => /^[A-Z]/.test(name) && !name.endsWith("Base"))
    expect(errors.length).toBeGreaterThan(15)
    expect(errors.filter((name) => !(name in index))).toEqual(["ConformanceError"])
  })
})
