/**
 * Builds a worker module (JavaScript or TypeScript) into one file, for the fastest start of a
 * Deno or a Node worker:
 *
 *   node build.mjs ../worker.mjs [export] [out-dir]     (needs esbuild: npm i -D esbuild)
 *
 * writes `<out-dir>/worker.cjs` (the worker, the SDK, Effect and amqplib, run by `Worker.run`)
 * and `<out-dir>/start.cjs`, which runs it keeping V8's compiled code beside it, as
 * `node start.cjs` or `deno run start.cjs`. Deno has a code cache of its own, but a job-mode
 * start from it measured here about twice as slow as from this cache of a whole run (Node 22's
 * and 24's `NODE_COMPILE_CACHE` has not been measured against it). `start.cjs --warm`, on the
 * runtime that will run it, writes that cache (at image build) and exits.
 */
import { createHash } from "node:crypto"
import { existsSync } from "node:fs"
import { copyFile, mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises"
import { createRequire } from "node:module"
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
// amqplib's own modules, which the SDK reads to keep a broker's refusal of a vhost (an exit 2, not
// a retry) and which amqplib's package does not export: imported by their files, beside the copy
// of amqplib the SDK imports, and left where the SDK finds them in a bundle.
const sdkEntry = createRequire(resolve(module)).resolve("@async-task/worker")
const sdkRequire = createRequire(sdkEntry)
// The SDK's own code (its build, and its sources, which an example of its repository imports).
const sdkCode = ["dist", "src"].map((dir) => join(dirname(dirname(sdkEntry)), dir, ""))
const amqplibFile = (path) => JSON.stringify(join(dirname(sdkRequire.resolve("amqplib")), path))
const amqplibModules = `import * as amqplibConnection from ${amqplibFile("lib/connection.js")}\n` +
  `import * as amqplibDefs from ${amqplibFile("lib/defs.js")}\n` +
  `globalThis[Symbol.for("@async-task/worker/amqplib-modules")] = ` +
  `{ "./lib/connection.js": amqplibConnection, "./lib/defs.js": amqplibDefs }\n`
// What both the worker's bundle and its threads' are built with.
const common = {
  bundle: true,
  platform: "node",
  format: "cjs",
  target: "node22",
  // A Deno script's `if (import.meta.main) Worker.run(worker)`: the bundle runs it instead.
  // The bundle is CommonJS: no `import.meta`, through which the SDK requires amqplib's own
  // modules elsewhere (here, the entry module gives them).
  define: {
    "import.meta.main": "false",
    "import.meta.url": "undefined",
    "import.meta.resolve": "undefined",
  },
  // Whitespace and syntax only: the names stay, for the stack traces a worker's log shows. The
  // smaller file is read, and its cache loaded, faster at every start (bench/lifecycle.ts).
  minifyWhitespace: true,
  minifySyntax: true,
  logLevel: "warning",
}

// A threaded handler's module, named as `Thread.handler(new URL("./score.ts", import.meta.url),
// …)` names it, is no import: esbuild would leave it out, and `import.meta.url` means nothing in
// the bundle. Each such module of the app (a script beside the one naming it) is built into
// `threads/` beside the bundle, and the URL becomes that file's.
const CODE_URL =
  /new URL\(\s*(["'])(\.{1,2}\/[^"']+\.(?:[cm]?[jt]s))\1\s*,\s*import\.meta\.url\s*\)/g
const threadModules = {
  name: "thread-modules",
  setup(build) {
    build.onLoad({ filter: /\.[cm]?[jt]s$/ }, async (args) => {
      // The app's own scripts only: not its dependencies, nor the SDK (whose docs show the form).
      if (
        args.path.includes(join("node_modules", "")) ||
        sdkCode.some((dir) => args.path.startsWith(dir))
      ) {
        return undefined
      }
      const source = await readFile(args.path, "utf8")
      if (!source.includes("import.meta.url")) return undefined
      const threads = []
      const contents = source.replace(CODE_URL, (url, _quote, relative) => {
        const target = resolve(dirname(args.path), relative)
        // A URL in a comment or an example, of no file here, is left as it is.
        if (!existsSync(target)) return url
        const file = `${createHash("sha1").update(target).digest("hex").slice(0, 8)}.cjs`
        threads.push({ target, file })
        return `require("node:url").pathToFileURL(require("node:path").join(__dirname, "threads", ${
          JSON.stringify(file)
        }))`
      })
      // A threaded handler named some other way would fail only when the bundle starts.
      if (/Thread\.handler\(\s*new URL\([^)]*import\.meta\.url/.test(contents)) {
        throw new Error(
          `${args.path} names a threaded handler's module in a way this build cannot follow: ` +
            'write it as new URL("./module.ts", import.meta.url), a file beside it',
        )
      }
      for (const { target, file } of threads) {
        await esbuild.build({
          ...common,
          entryPoints: [target],
          outfile: join(outDir, "threads", file),
        })
      }
      const extension = args.path.slice(args.path.lastIndexOf(".") + 1)
      return { contents, loader: extension.includes("t") ? "ts" : "js" }
    })
  },
}
await rm(join(outDir, "threads"), { recursive: true, force: true })
await esbuild.build({
  ...common,
  plugins: [threadModules],
  // Resolved where the worker is, as its own imports are.
  stdin: {
    contents: amqplibModules +
      `import { Worker } from "@async-task/worker"\n` +
      `import { ${name} as worker } from ${JSON.stringify(resolve(module))}\n` +
      `Worker.run(worker)\n`,
    resolveDir: dirname(resolve(module)),
    sourcefile: "start.mjs",
  },
  outfile: join(outDir, "worker.cjs"),
})
// The digest that names the code cache, made here rather than at every start (hashing 1 MB took
// some 15 ms of a start: bench/lifecycle.ts): the first line, which start.cjs reads.
const built = join(outDir, "worker.cjs")
const code = await readFile(built, "utf8")
const digest = createHash("sha1").update(code).digest("hex").slice(0, 16)
await writeFile(built, `// digest ${digest}\n${code}`)
await copyFile(
  join(dirname(fileURLToPath(import.meta.url)), "start.cjs"),
  join(outDir, "start.cjs"),
)
console.log(`${join(outDir, "worker.cjs")} and ${join(outDir, "start.cjs")}`)
