import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect } from "effect"
import { readFileSync } from "node:fs"
import { renderTable } from "../../../src/internal/settings/row.ts"
import { table } from "../../../src/internal/settings/table.ts"
import * as Settings from "../../../src/Settings.ts"

const REGENERATE = "regenerate it: see `renderTable` in src/internal/settings/row.ts"

// A markdown table's cells, row by row, padding and the separator line aside: `deno fmt` pads
// the README's table, and the rows render it unpadded.
const cells = (markdown: string): Array<Array<string>> =>
  markdown.split("\n")
    .filter((line) => line.startsWith("|"))
    .map((line) => line.slice(1, -1).split("|").map((cell) => cell.trim()))
    .filter((row) => !row.every((cell) => /^-+$/.test(cell)))

const readmeSection = (title: string): string => {
  const readme = readFileSync(new URL("../../../README.md", import.meta.url), "utf8")
  const start = readme.indexOf(`\n## ${title}\n`)
  expect(start).toBeGreaterThanOrEqual(0)
  const end = readme.indexOf("\n## ", start + 1)
  return readme.slice(start, end === -1 ? undefined : end)
}

describe("the settings table", () => {
  it("is the README's table of settings, cell for cell", () => {
    expect(cells(readmeSection("Settings")), REGENERATE).toEqual(cells(renderTable(table)))
  })

  // The README's "in code" names are the table's fields: they are `SettingsOverrides`' keys
  // and `WorkerSettings`' (a type error here otherwise), and what `Settings.make` reads.
  it("names each setting in code as Settings takes it", async () => {
    type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
    const overrides: Same<keyof Settings.SettingsOverrides, keyof typeof table> = true
    const settings: Same<keyof Settings.WorkerSettings, keyof typeof table> = true
    expect([overrides, settings]).toEqual([true, true])
    const inCode = cells(readmeSection("Settings")).slice(1).map(([, field]) => field!)
    expect(inCode).toEqual(Object.keys(table).map((field) => `\`${field}\``))
    // Each README name given in code wins over the environment: the port given by its name.
    const read = await Effect.runPromise(
      Settings.make({ name: "t", timeout: Duration.seconds(1) }, { healthCheckPort: 1234 }).pipe(
        Effect.provideService(
          ConfigProvider.ConfigProvider,
          ConfigProvider.fromUnknown({
            HEALTH_CHECK_PORT: "8083",
          }),
        ),
      ),
    )
    expect(read.healthCheckPort).toBe(1234)
  })

  it("names each variable once", () => {
    const names = Object.values(table).map((row) => row.env)
    expect(new Set(names).size).toBe(names.length)
  })

  // A meaning is a `Config` description and a README cell: a line break or a `|` would break
  // the table.
  it("gives each variable a meaning and a default of one line", () => {
    for (const row of Object.values(table)) {
      for (const cell of [row.meaning, row.shownDefault]) {
        expect(cell, row.env).toMatch(/^[^|\n]+$/)
      }
    }
  })
})
