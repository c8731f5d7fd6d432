import { defineConfig } from "vitest/config"

// Tests that must have the machine to themselves, one file at a time, after the rest: those that
// close the broker's connections or restart it, and those that compare throughputs in real time.
export default defineConfig({
  test: {
    include: ["test/faults/**/*.test.ts", "test/timed/**/*.test.ts"],
    pool: "forks",
    maxWorkers: 1,
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 120_000,
  },
})
