/**
 * docs/architecture.md's delivery path (issue 38) is the code's: each file its table names exists
 * and defines the function named beside it, and the path walks at most eight files, switching
 * between them at most twenty times.
 */
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { ROOT } from "../support/runtimes.ts"

interface Step {
  readonly step: string
  readonly file: string
  readonly fn: string
}

/** The rows of the table in the section "A delivery's path". */
const pathOf = (markdown: string): Array<Step> => {
  const section = markdown.split(/^## /m).find((s) => s.startsWith("A delivery's path"))
  if (section === undefined) return []
  return [...section.matchAll(/^\| ([^|]+?) +\| `([^`]+)` +\| `([^`]+)` +\|$/gm)]
    .map(([, step, file, fn]) => ({ step: step!, file: file!, fn: fn! }))
}

/** Whether `source` defines `fn`: a function, a generator or a const of that name. */
const defines = (source: string, fn: string): boolean =>
  new RegExp(`(?:function\\*?\\s+${fn}\\b|const\\s+${fn}\\s*[:=])`).test(source)

/** The steps whose file does not exist, or does not define their function. */
const missingOf = (path: ReadonlyArray<Step>): Array<Step> =>
  path.filter(({ file, fn }) => {
    const at = join(ROOT, file)
    return !existsSync(at) || !defines(readFileSync(at, "utf8"), fn)
  })

/** How many times the path moves from one file to another. */
const switchesOf = (path: ReadonlyArray<Step>): number =>
  path.slice(1).filter((step, i) => step.file !== path[i]!.file).length

describe("docs/architecture.md's delivery path", () => {
  const path = pathOf(readFileSync(join(ROOT, "docs/architecture.md"), "utf8"))

  it("names, step by step, files that exist and the functions they define", () => {
    expect(path.map((s) => s.step)).toContain("4. `started`")
    expect(path.length).toBeGreaterThanOrEqual(10)
    expect(missingOf(path)).toEqual([])
  })

  it("walks at most eight files from the take to the decision line, with few switches", () => {
    expect(path[0]!.step).toBe("taken")
    expect(path.at(-1)!.step).toBe("the decision line")
    expect(new Set(path.map((s) => s.file)).size).toBeLessThanOrEqual(8)
    expect(switchesOf(path)).toBeLessThanOrEqual(20)
  })

  it("would catch a function renamed, or a file gone", () => {
    const broken = pathOf(
      [
        "## A delivery's path",
        "",
        "| step | file | function |",
        "| ---- | ---- | -------- |",
        "| 4. `started` | `src/internal/delivery/settle.ts` | `publishStart` |",
        "| 4. `started` | `src/internal/delivery/publish.ts` | `publishStarted` |",
        "| 5. run | `src/internal/delivery/run.ts` | `runHandler` |",
      ].join("\n"),
    )
    expect(missingOf(broken).map((s) => `${s.file} ${s.fn}`)).toEqual([
      "src/internal/delivery/settle.ts publishStart",
      "src/internal/delivery/publish.ts publishStarted",
    ])
  })
})
