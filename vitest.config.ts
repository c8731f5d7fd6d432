import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Broker restarts would break the tests running beside them, and the files running beside a
    // throughput comparison would skew it: vitest.alone.config.ts runs both kinds alone.
    exclude: ["test/faults/**", "test/timed/**", "node_modules/**"],
    pool: "forks",
    // Two cores.
    maxWorkers: 2,
  },
})
