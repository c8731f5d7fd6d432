#!/usr/bin/env node
/**
 * The `async-task-worker` executable: `async-task-worker run <module>[:export]`. See
 * {@link Command}. The Node version is checked before the SDK and Effect load, so that an older
 * Node gets one line saying what to run instead of whatever it would fail with later.
 *
 * @since 0.1.0
 */
import module from "node:module"
import process from "node:process"

/** The oldest Node the SDK supports (Effect 4's own minimum). */
const MINIMUM_NODE = [22, 19] as const

const [major = 0, minor = 0] = process.versions.node.split(".").map(Number)
const isDeno = "Deno" in globalThis

if (
  !isDeno && (major < MINIMUM_NODE[0] || (major === MINIMUM_NODE[0] && minor < MINIMUM_NODE[1]))
) {
  process.stderr.write(
    `async-task-worker: Node v${process.versions.node} is too old: the SDK needs Node ` +
      `${MINIMUM_NODE.join(".")} or later (22 LTS or 24), or Deno 2\n`,
  )
  process.exitCode = 2
} else {
  // Node compiles every module of the SDK and Effect at every start unless its compile cache is
  // on: kept in the system's temporary directory, it takes a fifth to a third off a start's imports
  // (bench/README.md). `NODE_COMPILE_CACHE` still chooses the directory, and
  // `NODE_DISABLE_COMPILE_CACHE=1` turns it off; a directory Node cannot make leaves the start
  // uncached, never failed.
  if (!isDeno) module.enableCompileCache()
  const [Command, Process] = await Promise.all([import("./Command.ts"), import("./Process.ts")])
  Process.runMain(Command.main)
}
