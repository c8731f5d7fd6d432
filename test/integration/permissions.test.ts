/**
 * On Deno, a worker run without a permission it needs says which permission, and the flag that
 * grants it, rather than only `NotCapable`.
 */
import { spawnSync } from "node:child_process"
import process from "node:process"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { denoBinary, ROOT } from "../support/runtimes.ts"

describe("a Deno worker without its permissions", () => {
  it("names the permission and its flag, and exits 2", () => {
    const result = spawnSync(
      denoBinary(),
      [
        "run",
        "--allow-read",
        "--allow-net",
        "--allow-sys",
        join(ROOT, "cli.ts"),
        "run",
        join(ROOT, "examples/count-words.ts"),
        "--memory",
      ],
      {
        cwd: ROOT,
        encoding: "utf8",
        env: { PATH: process.env.PATH, HOME: process.env.HOME, NO_COLOR: "1" },
        input: "",
        timeout: 60_000,
      },
    )
    const said = result.stderr + result.stdout
    expect(said).toContain("A Deno permission is missing: Requires env access")
    expect(said).toContain("--allow-env")
    expect(result.status).toBe(2)
  }, 90_000)
})
