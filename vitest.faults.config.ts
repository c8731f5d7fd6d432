import { defineConfig } from "vitest/config"

// Tests that close the broker's connections or restart it: one file at a time, after the rest.
export default defineConfig({
  test: {
    include: ["test/faults/**/*.test.ts"],
    pool: "forks",
    poolOptions: { forks: { singleFork: true } },
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 120_000,
  },
})
