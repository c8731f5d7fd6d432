/**
 * The public API is what a user can import (issue 38): the package's entry points (`exports` of
 * `package.json`, the same on JSR), each export of theirs, and the namespaces they export.
 *
 * - No public signature names a type a user cannot import. The declarations are built as `dist/`
 *   is, and every public declaration is walked: each type it names (a reference, a superclass, a
 *   `typeof`) must be public itself, a library's (Effect's, Node's), or one its declaration file
 *   keeps to itself, which is followed in turn (`declare const FatalErrorBase: …`, what a class
 *   extends; a service's shape, which a user names `Transport["Service"]`). Anything else (a type
 *   of `src/internal/`, or of a module no entry point exports) is reported with the public name
 *   whose signature names it.
 * - The main index exports no namespace that the README, the user docs (`docs/protocol.md`,
 *   `docs/deployment.md`, `docs/conformance.md`; `docs/architecture.md` is the developers') and
 *   the examples do not name: the rest is internal.
 * - npm and JSR have the same entry points, and no module is one under two names.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { createRequire } from "node:module"
import { join, relative, resolve, sep } from "node:path"
import type * as TS from "typescript"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ROOT } from "../support/runtimes.ts"

const ts: typeof TS = createRequire(join(ROOT, "package.json"))("typescript")

type Exports = Readonly<Record<string, string | { readonly types?: string }>>

/** The package's entry points: `exports` of its `package.json`. */
const packageExports = (): Exports =>
  (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { readonly exports: Exports })
    .exports

/** The declaration file of each of `exports`' entry points, in the package in `dir`. */
const entriesOf = (dir: string, exports: Exports): Map<string, string> =>
  new Map(
    Object.entries(exports).flatMap(([subpath, target]) =>
      typeof target === "object" && target.types !== undefined
        ? [[subpath, resolve(dir, target.types)] as const]
        : []
    ),
  )

/** The options the declarations are read with: a strict Node project's. */
const READ_OPTIONS: TS.CompilerOptions = {
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  target: ts.ScriptTarget.ES2023,
  lib: ["lib.es2023.d.ts", "lib.dom.d.ts", "lib.esnext.disposable.d.ts"],
  types: ["node"],
  strict: true,
  skipLibCheck: true,
  noEmit: true,
}

/**
 * Each name of a type a user cannot import in a public signature, as `file: public name → the
 * type (its file)`, for the package in `dir` whose entry points are `exports` (the libraries its
 * declarations import are found in a `node_modules` of `dir` or above it).
 */
const internalTypesNamed = (dir: string, exports: Exports): Array<string> => {
  const entries = entriesOf(dir, exports)
  const program = ts.createProgram([...entries.values()], READ_OPTIONS)
  const checker = program.getTypeChecker()
  const own = (file: TS.SourceFile): boolean =>
    file.fileName.startsWith(dir + sep) && !file.fileName.includes(`${sep}node_modules${sep}`)
  const where = (node: TS.Node): string => relative(dir, node.getSourceFile().fileName)
  const target = (symbol: TS.Symbol): TS.Symbol =>
    symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol

  const problems: Array<string> = []
  // The public symbols: each entry point's exports, and the exports of the namespaces among them.
  const publicNames = new Map<TS.Symbol, string>()
  const addExports = (module: TS.Symbol, prefix: string): void => {
    for (const exported of checker.getExportsOfModule(module)) {
      const symbol = target(exported)
      if (publicNames.has(symbol)) continue
      const name = `${prefix}${exported.name}`
      publicNames.set(symbol, name)
      if (symbol.flags & ts.SymbolFlags.Module) addExports(symbol, `${name}.`)
    }
  }
  for (const [subpath, file] of entries) {
    const source = program.getSourceFile(file)
    const module = source === undefined ? undefined : checker.getSymbolAtLocation(source)
    if (module === undefined) problems.push(`${subpath}: no declarations at ${relative(dir, file)}`)
    else addExports(module, subpath === "." ? "" : `${subpath.slice(2)}:`)
  }

  // The declarations to walk: the public ones, then what they name of their files' own.
  const walked = new Set<TS.Symbol>()
  const queue: Array<{ readonly symbol: TS.Symbol; readonly owner: string }> = []
  const enqueue = (symbol: TS.Symbol, owner: string): void => {
    if (walked.has(symbol)) return
    walked.add(symbol)
    queue.push({ symbol, owner })
  }
  for (const [symbol, name] of publicNames) {
    // A namespace's exports are walked one by one; a module's whole text is no signature.
    if (!(symbol.flags & ts.SymbolFlags.Module)) enqueue(symbol, name)
  }

  /** The (rightmost) name a type reference, `typeof`, heritage clause or `import()` names. */
  const namedBy = (node: TS.Node): TS.Node | undefined => {
    const name = ts.isTypeReferenceNode(node)
      ? node.typeName
      : ts.isExpressionWithTypeArguments(node)
      ? node.expression
      : ts.isTypeQueryNode(node)
      ? node.exprName
      : ts.isImportTypeNode(node)
      ? node.qualifier ?? node
      : undefined
    if (name === undefined) return undefined
    if (ts.isQualifiedName(name)) return name.right
    if (ts.isPropertyAccessExpression(name)) return name.name
    return name
  }

  /** Whether `symbol` is a type parameter, or declared inside `root` (`infer`, a mapped key). */
  const isLocal = (symbol: TS.Symbol, root: TS.Node): boolean =>
    (symbol.declarations ?? []).every((d) =>
      d.kind === ts.SyntaxKind.TypeParameter ||
      (d.getSourceFile() === root.getSourceFile() && d.pos >= root.pos && d.end <= root.end)
    )

  /** Whether `symbol` is declared in `file` only, and not exported from it. */
  const isFileLocal = (symbol: TS.Symbol, file: TS.SourceFile): boolean => {
    const module = checker.getSymbolAtLocation(file)
    const exported = module === undefined ? [] : checker.getExportsOfModule(module).map(target)
    return (symbol.declarations ?? []).every((d) => d.getSourceFile() === file) &&
      !exported.includes(symbol)
  }

  const check = (name: TS.Node, root: TS.Node, owner: string): void => {
    const found = checker.getSymbolAtLocation(name)
    if (found === undefined) {
      problems.push(`${where(name)}: ${owner} → ${name.getText()}, which does not resolve`)
      return
    }
    const symbol = target(found)
    const declarations = symbol.declarations ?? []
    // A library's type (Effect's, Node's, the language's), or the signature's own parameter.
    if (!declarations.some((d) => own(d.getSourceFile())) || isLocal(symbol, root)) return
    if (publicNames.has(symbol)) return
    // What the declaration file keeps to itself is part of the signature, followed in turn: the
    // base a class extends, a service's shape (`Transport["Service"]`).
    if (isFileLocal(symbol, root.getSourceFile())) enqueue(symbol, owner)
    else {
      problems.push(
        `${where(root)}: ${owner} → ${symbol.name} (${where(declarations[0]!)}), not exported`,
      )
    }
  }

  while (queue.length > 0) {
    const { owner, symbol } = queue.shift()!
    for (const declaration of symbol.declarations ?? []) {
      if (!own(declaration.getSourceFile())) continue
      const visit = (node: TS.Node): void => {
        const name = namedBy(node)
        if (name !== undefined) check(name, declaration, owner)
        ts.forEachChild(node, visit)
      }
      visit(declaration)
    }
  }
  return [...new Set(problems)].sort()
}

/**
 * Builds the declarations as `dist/` is built, into a directory of their own laid out as the
 * package is (`dist/` beside its `package.json`), with the project's `node_modules` linked for
 * the libraries they import.
 */
const buildDeclarations = (): string => {
  const dir = mkdtempSync(join(tmpdir(), "public-api-"))
  // Its `"type": "module"`, and its name, by which a declaration may import the package itself.
  writeFileSync(join(dir, "package.json"), readFileSync(join(ROOT, "package.json")))
  symlinkSync(join(ROOT, "node_modules"), join(dir, "node_modules"), "dir")
  const config = ts.getParsedCommandLineOfConfigFile(
    join(ROOT, "tsconfig.build.json"),
    {},
    { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} },
  )!
  const program = ts.createProgram(config.fileNames, {
    ...config.options,
    outDir: join(dir, "dist"),
    declaration: true,
    emitDeclarationOnly: true,
    declarationMap: false,
    sourceMap: false,
  })
  const emitted = program.emit()
  const errors = [...ts.getPreEmitDiagnostics(program), ...emitted.diagnostics]
    .map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n"))
  if (errors.length > 0) throw new Error(`The build failed:\n${errors.join("\n")}`)
  return dir
}

describe("the public API", () => {
  let built = ""
  beforeAll(() => {
    built = buildDeclarations()
  }, 120_000)
  afterAll(() => {
    if (built !== "") rmSync(built, { recursive: true, force: true })
  })

  it("names no type in a public signature that a user cannot import", () => {
    expect(entriesOf(built, packageExports()).size).toBeGreaterThanOrEqual(4)
    expect(internalTypesNamed(built, packageExports())).toEqual([])
  })

  it("catches a public signature that names a type no entry point exports", () => {
    const dir = join(ROOT, "test/fixtures/public-api")
    expect(internalTypesNamed(dir, { ".": { types: "./types/index.d.ts" } })).toEqual([
      "types/api.d.ts: Api.Options → Hidden (types/internal.d.ts), not exported",
      "types/api.d.ts: Api.local → Hidden (types/internal.d.ts), not exported",
      "types/api.d.ts: Api.make → Hidden (types/internal.d.ts), not exported",
      "types/api.d.ts: Api.run → helper (types/internal.d.ts), not exported",
      "types/index.d.ts: Failure → ErrorShape (types/internal.d.ts), not exported",
    ])
  })
})

/** The texts a user reads: the README, the user docs and the examples. */
const userTexts = (): Array<{ readonly file: string; readonly text: string }> => {
  const examples = readdirSync(join(ROOT, "examples"), { recursive: true, encoding: "utf8" })
    .filter((name) => !name.split(sep).includes("node_modules"))
    .filter((name) => /\.(ts|mts|js|mjs|cjs)$/.test(name))
    .map((name) => join("examples", name))
  return ["README.md", "docs/protocol.md", "docs/deployment.md", "docs/conformance.md", ...examples]
    .map((file) => ({ file, text: readFileSync(join(ROOT, file), "utf8") }))
}

/**
 * Whether `text` names the namespace `name` as a user meets it: a member of it (`Worker.make`),
 * an import of it, or its name as code (`` `Transport` ``). A word of prose ("Prometheus", a
 * "Decision line") does not count.
 */
const namesNamespace = (text: string, name: string): boolean =>
  new RegExp(`\\b${name}\\.[A-Za-z_]`).test(text) ||
  text.includes(`\`${name}\``) ||
  [...text.matchAll(/import\s*(?:type\s*)?\{([^}]*)\}\s*from/g)].some(([, names]) =>
    names!.split(",").some((n) => n.trim().replace(/^type\s+/, "") === name)
  )

/** The namespaces `src/index.ts` exports (`export * as Name from`). */
const indexNamespaces = (): Array<string> =>
  [...readFileSync(join(ROOT, "src/index.ts"), "utf8").matchAll(/export \* as (\w+) from/g)]
    .map(([, name]) => name!)

describe("the main index", () => {
  it("exports only namespaces the README, the user docs or the examples name", () => {
    const texts = userTexts()
    const namespaces = indexNamespaces()
    expect(namespaces.length).toBeGreaterThan(5)
    expect(namespaces.filter((name) => !texts.some(({ text }) => namesNamespace(text, name))))
      .toEqual([])
  })

  it("counts a member, an import or a name as code, not a word of prose", () => {
    expect(namesNamespace("Worker.run(worker)", "Worker")).toBe(true)
    expect(namesNamespace('import { Probes, Worker } from "@async-task/worker"', "Probes"))
      .toBe(true)
    expect(namesNamespace("A `Settings` or `Transport` in the context", "Transport")).toBe(true)
    expect(namesNamespace("GET /metrics (Prometheus)", "Prometheus")).toBe(false)
    expect(namesNamespace("**Decision line**: one per delivery", "Decision")).toBe(false)
    expect(namesNamespace("LeaseRenewalThing.x", "LeaseRenewal")).toBe(false)
  })
})

describe("the entry points", () => {
  it("are the same on npm and JSR, and no module is one under two names", () => {
    const jsr = JSON.parse(
      // deno.json has comments.
      readFileSync(join(ROOT, "deno.json"), "utf8").replace(/^\s*\/\/.*$/gm, ""),
    ) as { readonly exports: Readonly<Record<string, string>> }
    const npm = Object.entries(packageExports())
      .filter(([subpath]) => subpath !== "./package.json")
      .map(([subpath, target]) => {
        const types = typeof target === "string" ? target : target.types!
        return [subpath, types.replace(/^\.\/dist\/(.*)\.d\.ts$/, "./src/$1.ts")] as const
      })
    // The CLI is `bin` on npm, a module JSR runs (`deno run jsr:@async-task/worker/cli`).
    expect(Object.fromEntries(npm))
      .toEqual(Object.fromEntries(Object.entries(jsr.exports).filter(([s]) => s !== "./cli")))
    const modules = npm.map(([, module]) => module)
    expect(modules.filter((module, i) => modules.indexOf(module) !== i)).toEqual([])
  })
})
