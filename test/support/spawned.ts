/**
 * Test support: a process run to its end with `spawnSync`, as a failure message shows it, and the
 * one line a worker that refuses to start prints.
 */
import type { SpawnSyncReturns } from "node:child_process"
import { expect } from "vitest"

/** How `result` ended and the tail of what it printed, for a failure message. */
export const show = (result: SpawnSyncReturns<string>): string =>
  `exit ${result.status} (${result.signal ?? "no signal"}${
    result.error ? `, ${result.error.message}` : ""
  })\n--- stdout ---\n${result.stdout?.slice(-4000)}\n--- stderr ---\n${
    result.stderr?.slice(-4000)
  }`

/** Its only line, on standard error, once it has exited 2 having printed nothing else. */
export const oneLine = (result: SpawnSyncReturns<string>): string => {
  expect(result.status, show(result)).toBe(2)
  const lines = result.stderr.split("\n").filter((line) => line.trim() !== "")
  expect(lines, show(result)).toHaveLength(1)
  expect(result.stdout, show(result)).toBe("")
  return lines[0]!
}
