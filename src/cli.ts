#!/usr/bin/env node
/**
 * The `async-task-worker` executable: `async-task-worker run <module>[:export]`. See
 * {@link Command}.
 *
 * @since 0.1.0
 */
import * as Command from "./Command.ts"
import * as Process from "./Process.ts"

Process.runMain(Command.main)
