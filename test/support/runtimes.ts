/**
 * The runtimes the SDK's processes run on, as tests and the chaos run start them: the Deno binary,
 * the Node CLI built into `dist/` (checked to be current) on a supported Node, and a clean
 * environment.
 */
import { existsSync, readdirSync, statSync } from "node:fs"
import { dirname, join, resolve } from "node:path"
import process from "node:process"
import { fileURLToPath, pathToFileURL } from "node:url"
import { supportedNode } from "./nodes.ts"

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..")

export type Runtime = "node" | "deno"

interface RuntimeSpec {
  /** The executable and the arguments before `run <module>`. */
  readonly command: string
  readonly args: ReadonlyArray<string>
  /** What the fixture imports as the SDK. */
  readonly sdk: string
}

/**
 * `node_modules/.bin/deno` is a Node script that runs the binary with `spawnSync` and does not
 * forward signals: a SIGTERM would end the wrapper and orphan Deno. The binary it runs is used.
 */
export const denoBinary = (): string => {
  const candidates = [
    join(ROOT, "node_modules/deno/deno"),
    join(ROOT, `node_modules/@deno/${process.platform}-${process.arch}-glibc/deno`),
    join(ROOT, "node_modules/@deno/linux-x64-glibc/deno"),
  ]
  const found = candidates.find((path) => existsSync(path))
  if (found === undefined) {
    throw new Error(
      `The Deno binary is missing (looked for ${candidates.join(", ")}): run npm install`,
    )
  }
  return found
}

const newest = (dir: string): { readonly path: string; readonly mtime: number } => {
  let best = { path: dir, mtime: 0 }
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    const candidate = entry.isDirectory() ? newest(path) : { path, mtime: statSync(path).mtimeMs }
    if (candidate.mtime > best.mtime) best = candidate
  }
  return best
}

/**
 * The Node CLI is the build in `dist/`: fails clearly when it is missing or older than `src/`;
 * with `allowStale`, an older build is only said (returned), for a run by hand.
 */
export const checkBuild = (allowStale = false): string | undefined => {
  const cli = join(ROOT, "dist/cli.js")
  if (!existsSync(cli) || !existsSync(join(ROOT, "dist/index.js"))) {
    throw new Error(
      "dist/cli.js is missing: build first with `npm run build` (node_modules/typescript/bin/tsc -p tsconfig.build.json); " +
        "`npm test` builds before it runs the tests",
    )
  }
  const source = newest(join(ROOT, "src"))
  if (source.mtime <= statSync(cli).mtimeMs) return undefined
  const message = `dist/ is older than ${source.path}: rebuild with \`npm run build\` ` +
    "(node_modules/typescript/bin/tsc -p tsconfig.build.json) so that the Node CLI runs the current sources"
  if (!allowStale) throw new Error(message)
  return message
}

/**
 * How to start the CLI on `runtime`: on Node, the build in `dist/` on the Node running the test
 * (Node 22 when that is Deno); on Deno, the sources.
 */
export const runtimeSpec = (runtime: Runtime): RuntimeSpec =>
  runtime === "node"
    ? {
      command: supportedNode(),
      args: [join(ROOT, "dist/cli.js")],
      sdk: pathToFileURL(join(ROOT, "dist/index.js")).href,
    }
    : {
      command: denoBinary(),
      args: ["run", "-A", join(ROOT, "cli.ts")],
      sdk: pathToFileURL(join(ROOT, "src/index.ts")).href,
    }

/** Only what the runtimes need from the test's environment: no BROKER_URL, no WORKER_*. */
export const baseEnv = (): Record<string, string> => {
  const env: Record<string, string> = { NO_COLOR: "1" }
  for (const key of ["PATH", "HOME", "TMPDIR", "LANG", "DENO_DIR", "XDG_CACHE_HOME"]) {
    const value = process.env[key]
    if (value !== undefined) env[key] = value
  }
  return env
}
