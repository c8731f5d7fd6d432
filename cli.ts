/**
 * `deno run -A <package>/cli.ts run ./my_worker.ts`: the command, from the sources.
 *
 * @module
 */
import "./src/cli.ts"
