/**
 * Builds a Node worker into one file, for the fastest start Node 20 allows:
 *
 *   node build.mjs ../worker.mjs [export] [out-dir]     (needs esbuild: npm i -D esbuild)
 *
 * writes `<out-dir>/worker.cjs` (the worker, the SDK, Effect and amqplib, run by `Worker.run`)
 * and `<out-dir>/start.cjs`, which runs it keeping V8's compiled code beside it. Node 20 has no
 * compile cache of its own: without them, a start compiles each of Effect's modules again.
 * `node <out-dir>/start.cjs --warm` writes that cache (at image build) and exits.
 */
import { copyFile, mkdir, readdir, rm } from "node:fs/promises"
import { dirname, join, resolve } from "node:path"
import process from "node:process"
import { fileURLToPath } from "node:url"
import * as esbuild from "esbuild"

const [module = "./worker.mjs", name = "worker", out = "bundle"] = process.argv.slice(2)
const outDir = resolve(out)
await mkdir(outDir, { recursive: true })
// The caches of an earlier build: start.cjs would never read them again.
for (const name of await readdir(outDir)) {
  if (name.endsWith(".v8cache")) await rm(join(outDir, name), { force: true })
}
await esbuild.build({
  // Resolved where the worker is, as its own imports are.
  stdin: {
    contents: `import { Worker } from "@async-task/worker"\n` +
      `import { ${name} as worker } from ${JSON.stringify(resolve(module))}\n` +
      `Worker.run(worker)\n`,
    resolveDir: dirname(resolve(module)),
    sourcefile: "start.mjs",
  },
  outfile: join(outDir, "worker.cjs"),
  bundle: true,
  platform: "node",
  format: "cjs",
  target: "node20",
  logLevel: "warning",
})
await copyFile(
  join(dirname(fileURLToPath(import.meta.url)), "start.cjs"),
  join(outDir, "start.cjs"),
)
console.log(`${join(outDir, "worker.cjs")} and ${join(outDir, "start.cjs")}`)
