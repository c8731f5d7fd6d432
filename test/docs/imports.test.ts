/**
 * No import circle among the sources (issue 31): every edge counts, `import type` and
 * `export … from` too, as a type-only circle still ties the modules' declarations together. And
 * no file under `src/internal/` imports a public module that imports it, even through others: a
 * type lives where its code lives, and the public module re-exports it. And the stages of a
 * delivery's path (issue 38) import downward only: none imports a sibling stage sideways.
 */
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join, relative, resolve } from "node:path"
import { createRequire } from "node:module"
import type * as TS from "typescript"
import { describe, expect, it } from "vitest"
import { ROOT } from "../support/runtimes.ts"

const ts: typeof TS = createRequire(join(ROOT, "package.json"))("typescript")

/** Each module of `src` (paths relative to it) with the modules of `src` it imports. */
const importsOf = (src: string): Map<string, ReadonlyArray<string>> => {
  const files = readdirSync(src, { recursive: true, encoding: "utf8" })
    .filter((name) => name.endsWith(".ts"))
  const graph = new Map<string, ReadonlyArray<string>>()
  for (const name of files) {
    const file = join(src, name)
    const source = ts.createSourceFile(file, readFileSync(file, "utf8"), ts.ScriptTarget.Latest)
    const imported = new Set<string>()
    const visit = (node: TS.Node): void => {
      const specifier = (ts.isImportDeclaration(node) || ts.isExportDeclaration(node))
        ? node.moduleSpecifier
        : ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)
        ? node.argument.literal
        : undefined
      if (specifier !== undefined && ts.isStringLiteral(specifier)) {
        if (specifier.text.startsWith(".")) {
          imported.add(relative(src, resolve(dirname(file), specifier.text)))
        }
      }
      ts.forEachChild(node, visit)
    }
    visit(source)
    graph.set(name, [...imported])
  }
  return graph
}

/** The circles: the strongly connected components of more than one module (Tarjan's). */
const circlesOf = (graph: Map<string, ReadonlyArray<string>>): Array<Array<string>> => {
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const stack: Array<string> = []
  const circles: Array<Array<string>> = []
  const connect = (module: string): void => {
    index.set(module, index.size)
    low.set(module, index.get(module)!)
    stack.push(module)
    for (const next of graph.get(module) ?? []) {
      if (!index.has(next)) {
        connect(next)
        low.set(module, Math.min(low.get(module)!, low.get(next)!))
      } else if (stack.includes(next)) {
        low.set(module, Math.min(low.get(module)!, index.get(next)!))
      }
    }
    if (low.get(module) !== index.get(module)) return
    const component = stack.splice(stack.indexOf(module))
    if (component.length > 1) circles.push(component.sort())
  }
  for (const module of graph.keys()) if (!index.has(module)) connect(module)
  return circles
}

/** Every module `module` imports, through others too. */
const reachedFrom = (graph: Map<string, ReadonlyArray<string>>, module: string): Set<string> => {
  const reached = new Set<string>()
  const visit = (from: string): void => {
    for (const next of graph.get(from) ?? []) {
      if (!reached.has(next)) {
        reached.add(next)
        visit(next)
      }
    }
  }
  visit(module)
  return reached
}

/** `internal → public` for each internal module importing a public one that imports it. */
const importedBack = (graph: Map<string, ReadonlyArray<string>>): Array<string> =>
  [...graph].flatMap(([module, imported]) =>
    module.startsWith("internal/")
      ? imported.filter((next) => !next.startsWith("internal/"))
        .filter((next) => reachedFrom(graph, next).has(module))
        .map((next) => `${module} → ${next}`)
      : []
  )

/** The stages of a delivery's path, each with the stages it may import: downward only. */
const STAGES: Readonly<Record<string, ReadonlyArray<string>>> = {
  "take.ts": ["deliver.ts"],
  "deliver.ts": ["decide.ts", "run.ts", "settle.ts"],
  "run.ts": ["decide.ts"],
  "settle.ts": ["decide.ts"],
  "decide.ts": [],
}

/** What every stage may use, beside them; of the stages, they may import the pure one only. */
const SUPPORT: ReadonlyArray<string> = [
  "context.ts",
  "fiberContext.ts",
  "timers.ts",
  "tracing.ts",
  "outputGate.ts",
  "expiries.ts",
]

/**
 * `from → to` for each import of a stage by a module of `folder` that the rules above do not
 * allow, and `unplaced: m` for a module of the folder that is neither a stage nor beside them.
 */
const sideways = (graph: Map<string, ReadonlyArray<string>>, folder: string): Array<string> =>
  [...graph].flatMap(([module, imported]) => {
    if (!module.startsWith(folder)) return []
    const name = module.slice(folder.length)
    const allowed = STAGES[name] ?? (SUPPORT.includes(name) ? ["decide.ts"] : undefined)
    if (allowed === undefined) return [`unplaced: ${name}`]
    return imported.filter((next) => next.startsWith(folder))
      .map((next) => next.slice(folder.length))
      .filter((next) => next in STAGES && !allowed.includes(next))
      .map((next) => `${name} → ${next}`)
  })

describe("the sources' imports", () => {
  const graph = importsOf(join(ROOT, "src"))

  it("make no circle", () => {
    expect(graph.size).toBeGreaterThan(60)
    expect(circlesOf(graph)).toEqual([])
  })

  it("never lead from an internal module back to a public one that imports it", () => {
    expect(importedBack(graph)).toEqual([])
  })

  it("keep the conformance kit out of the worker's main index: it has an entry point of its own", () => {
    const kit = (module: string) =>
      module === "Conformance.ts" || module.startsWith("internal/conformance/")
    expect([...reachedFrom(graph, "Conformance.ts")].some(kit)).toBe(true)
    expect([...reachedFrom(graph, "index.ts")].filter(kit)).toEqual([])
  })

  it("lead from a stage of a delivery's path to the stages after it only, never sideways", () => {
    expect(sideways(graph, "internal/delivery/")).toEqual([])
    // The rule bites: publishing importing the handler's run, as it once did, is sideways.
    const before = new Map(graph)
    before.set("internal/delivery/settle.ts", [
      ...graph.get("internal/delivery/settle.ts")!,
      "internal/delivery/run.ts",
    ])
    before.set("internal/delivery/handle.ts", [])
    expect(sideways(before, "internal/delivery/")).toEqual([
      "settle.ts → run.ts",
      "unplaced: handle.ts",
    ])
  })

  it("catch a circle through a type-only import", () => {
    const fixture = importsOf(join(ROOT, "test/fixtures/imports/src"))
    expect(circlesOf(fixture)).toEqual([["Public.ts", "internal/make.ts"]])
    expect(importedBack(fixture)).toEqual(["internal/make.ts → Public.ts"])
  })
})
