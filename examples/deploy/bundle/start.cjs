/**
 * Runs `worker.cjs` (made by `build.mjs`) with V8's code cache kept beside it
 * (`worker.cjs.<hash of the source>.v8cache`), on Node (`node start.cjs`) or on Deno
 * (`deno run --allow-net --allow-env --allow-read --allow-sys start.cjs`, and `--allow-write`
 * to this directory for a run that may write the cache).
 * The cache is written as the process exits, so it holds what a whole run compiled (connecting,
 * a task, the shutdown): the next start compiles almost nothing. A missing cache, or one V8
 * rejects (another runtime or version), is written again; one that cannot be written (a read-only
 * file system, no right to write) is done without.
 *
 * `--warm` runs one task from stdin on the embedded broker in job mode, then writes the cache:
 * for an image build, where no broker runs (`echo '<task>' | node start.cjs --warm`).
 */
"use strict"
const fs = require("node:fs")
const path = require("node:path")
const vm = require("node:vm")
const { wrap } = require("node:module")

const file = path.join(__dirname, "worker.cjs")
const text = fs.readFileSync(file, "utf8")
const source = wrap(text)
// V8 matches a cache to its source by length only: named by a hash of the source, a cache never
// runs the code of an earlier build of the same length. build.mjs writes the hash as the file's
// first line (hashing the file here took some 15 ms of a start), and the file's time of change
// is part of the name, for a file edited after its build; a file without the line is hashed.
const digest = `${
  /^\/\/ digest ([0-9a-f]{16})\n/.exec(text)?.[1] ??
    require("node:crypto").createHash("sha1").update(source).digest("hex").slice(0, 16)
}-${Math.trunc(fs.statSync(file).mtimeMs)}`
const cacheFile = path.join(__dirname, `worker.cjs.${digest}.v8cache`)
const warm = process.argv.includes("--warm")
if (warm) {
  process.env.WORKER_TRANSPORT ??= "memory"
  process.env.WORKER_MODE ??= "job"
  process.env.WORKER_JOB_IDLE_TIMEOUT_S ??= "2"
}
let cachedData
try {
  cachedData = warm ? undefined : fs.readFileSync(cacheFile)
} catch {
  cachedData = undefined
}
const script = new vm.Script(source, { filename: file, cachedData })
if (cachedData === undefined || script.cachedDataRejected) {
  process.on("exit", () => {
    // Written whole then renamed: a start never reads half a cache (V8 would reject it anyway).
    const partial = `${cacheFile}.${process.pid}-${
      require("node:crypto").randomBytes(4).toString("hex")
    }`
    try {
      fs.writeFileSync(partial, script.createCachedData())
      fs.renameSync(partial, cacheFile)
    } catch {
      // A read-only file system, or a Deno run without the right to write here: the next start
      // compiles again, and runs as well.
      try {
        fs.rmSync(partial, { force: true })
      } catch {
        // Nothing was written.
      }
    }
  })
}
const workerModule = { exports: {}, filename: file, id: file, loaded: false }
script.runInThisContext().call(
  workerModule.exports,
  workerModule.exports,
  require,
  workerModule,
  file,
  __dirname,
)
