import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Broker restarts would break the tests running beside them: vitest.faults.config.ts runs them alone.
    exclude: ["test/faults/**", "node_modules/**"],
    pool: "forks",
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
  },
})
