// The CLI from the sources (`deno run -A cli.ts run <module>`) as a real process
// on RabbitMQ: see cli.ts. One file per runtime, so that vitest runs the two in parallel.
import { cliSuite } from "./cli.ts"

cliSuite("deno")
