// The CLI built into dist/ (`node dist/cli.js run <module>`) as a real process
// on RabbitMQ: see cli.ts. One file per runtime, so that vitest runs the two in parallel.
import { cliSuite } from "./cli.ts"

cliSuite("node")
