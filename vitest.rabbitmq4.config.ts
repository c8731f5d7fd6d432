import process from "node:process"
import { defineConfig } from "vitest/config"

// The broker suites again, on the RabbitMQ 4 node of scripts/rabbitmq4.sh (`npm run
// test:rabbitmq4` starts it): delivery, retries and their accounting, shutdown requeues, the crash
// loop, the conformance kit, the chaos suite's smaller run, and a 45 s block of the event loop
// (RabbitMQ 4's heartbeat handling). One file at a time: the chaos suite restarts the broker.
export default defineConfig({
  test: {
    include: [
      "test/integration/AmqpTransport.test.ts",
      "test/integration/heavy.test.ts",
      "test/integration/threads.test.ts",
      "test/integration/eventLoop.test.ts",
      "test/conformance/kit.test.ts",
      "test/faults/chaos.test.ts",
    ],
    env: {
      TEST_RABBITMQ_PORT: "5681",
      TEST_RABBITMQCTL: `${
        process.env.RABBITMQ4_HOME ?? "/var/cache/async-task-worker/rabbitmq-4.3"
      }/bin/rabbitmqctl`,
    },
    pool: "forks",
    maxWorkers: 1,
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 120_000,
  },
})
