/**
 * `examples/deploy`, the app its images are built from, laid out as they install it: its
 * `package.json` and `src/`, and each of its dependencies in `node_modules` where `npm ci` puts
 * them. In the repository the app has no `node_modules` of its own (the SDK it depends on is this
 * repository), so a test or a bench that runs it lays it out first: the SDK is this repository
 * (its build in `dist/`), any other dependency the repository's own copy.
 */
import { cpSync, mkdirSync, readFileSync, symlinkSync } from "node:fs"
import { dirname, join } from "node:path"
import { ROOT } from "./runtimes.ts"

/** The example app's directory. */
export const DEPLOY_APP = join(ROOT, "examples/deploy")

/** The example app's `package.json`. */
export interface AppPackage {
  readonly name: string
  readonly version: string
  readonly dependencies: Readonly<Record<string, string>>
  readonly devDependencies: Readonly<Record<string, string>>
}

/** The example app's `package.json`, read afresh. */
export const appPackage = (): AppPackage =>
  JSON.parse(readFileSync(join(DEPLOY_APP, "package.json"), "utf8")) as AppPackage

/** The SDK's own name, the one dependency of the app that is this repository. */
const SDK = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { name: string }).name

/** Lays the app out in `dir` (made if need be) and returns `dir`. */
export const layOutDeployApp = (dir: string): string => {
  mkdirSync(dir, { recursive: true })
  cpSync(join(DEPLOY_APP, "package.json"), join(dir, "package.json"))
  cpSync(join(DEPLOY_APP, "src"), join(dir, "src"), { recursive: true })
  const { dependencies, devDependencies } = appPackage()
  for (const name of Object.keys({ ...dependencies, ...devDependencies })) {
    const installed = join(dir, "node_modules", name)
    mkdirSync(dirname(installed), { recursive: true })
    symlinkSync(name === SDK ? ROOT : join(ROOT, "node_modules", name), installed, "dir")
  }
  return dir
}
