/**
 * The npm package as a Node user gets it (issue 18): the tarball `npm pack` makes from `dist/`,
 * installed into a fresh project outside the repository with `npm i <tarball> effect` (today's
 * Effect, without a peer warning); a strict TypeScript worker, a test of it with the typed
 * harness and an Effect app of its own, compiled against the package with their declarations
 * emitted and every library's checked (`test/fixtures/npm-package/`), by TypeScript 5.9 and by
 * TypeScript 7; the app launched as the process (`Worker.launch`) on Node 22, 24 and 26, on
 * RabbitMQ, its probes served from its own router, drained on SIGTERM before its own finalizers;
 * the CLI running the worker on the embedded broker, on Node 22 from the compiled `.js` through
 * `npx`, on Node 24 from the `.ts` itself; the worker started
 * through `npx` draining and exiting 0 within its shutdown bound when `npx` itself is sent SIGTERM
 * (which npx does not pass on); and the one line the CLI answers instead on a Node that strips no
 * types, and on a Node too old for the SDK (the system's, v20 here).
 *
 * It drives the Nodes itself: it runs in the suite's pass on Node 22, and is skipped in the passes
 * on Node 24, Node 26 and Deno.
 */
import { spawn, spawnSync, type SpawnSyncReturns } from "node:child_process"
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
} from "node:fs"
import { tmpdir } from "node:os"
import { delimiter, dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import process from "node:process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  node22Binary,
  node24Binary,
  node26Binary,
  onNode22,
  pathWithoutBins,
  systemNode,
} from "../support/nodes.ts"
import { checkBuild, ROOT } from "../support/runtimes.ts"
import { ensureVhosts, platform, QUORUM_VHOST, uniqueName, urlFor } from "./broker.ts"
import { expectAppServes } from "./effectApp.ts"
import { pollUntil, sleep } from "../support/waits.ts"
import { oneLine, show } from "../support/spawned.ts"

interface PackageJson {
  readonly peerDependencies: Record<string, string>
  readonly devDependencies: Record<string, string>
}

const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as PackageJson
const FIXTURES = join(ROOT, "test/fixtures/npm-package")

/**
 * A user's environment with `node` on PATH first: the machine's own (proxies and certificates
 * included), without what npm and vitest set for the suite's run (`npm_config_local_prefix`
 * would point a child npm at this repository) and without any `node_modules/.bin`.
 */
const userEnv = (node: string): Record<string, string> => {
  const env: Record<string, string> = {}
  for (const [key, value] of Object.entries(process.env)) {
    if (value === undefined || key.startsWith("npm_") || key.startsWith("VITEST")) continue
    if (["INIT_CWD", "NODE_OPTIONS", "NODE_ENV", "PATH"].includes(key)) continue
    env[key] = value
  }
  env.PATH = [dirname(node), pathWithoutBins()].join(delimiter)
  env.NO_COLOR = "1"
  env.HEALTH_CHECK_HOST = "127.0.0.1"
  env.HEALTH_CHECK_PORT = "0"
  return env
}

describe.runIf(onNode22())("the npm package in a fresh Node project", () => {
  const node22 = node22Binary()
  const node24 = node24Binary()
  const node26 = node26Binary()
  let dir = ""
  let project = ""
  let packed: ReadonlyArray<string> = []
  let installed: SpawnSyncReturns<string> | undefined

  /** Runs `command` in the project (or `cwd`) as a user would, on `node` (22 by default). */
  const run = (
    command: string,
    args: ReadonlyArray<string>,
    options: {
      readonly node?: string
      readonly cwd?: string
      readonly input?: string
      readonly env?: Record<string, string>
    } = {},
  ) =>
    spawnSync(command, args, {
      cwd: options.cwd ?? project,
      env: { ...userEnv(options.node ?? node22), ...options.env },
      encoding: "utf8",
      input: options.input ?? "",
      timeout: 180_000,
    })
  /** The CLI's local trial of `module` on `node`, given one task. */
  const trial = (module: string, task: string, node: string) =>
    run("npx", ["async-task-worker", "run", module, "--memory"], { node, input: `${task}\n` })
  const ok = (result: SpawnSyncReturns<string>, what: string) => {
    if (result.status !== 0) throw new Error(`${what} failed: ${show(result)}`)
    return result.stdout
  }

  beforeAll(() => {
    checkBuild()
    ensureVhosts()
    dir = mkdtempSync(join(tmpdir(), "npm-package-"))
    project = join(dir, "project")
    // The build `npm test` made: `prepack` would rebuild dist/ under the tests that run it.
    const [tarball] = JSON.parse(
      ok(
        run("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", dir], {
          cwd: ROOT,
        }),
        "npm pack",
      ),
    ) as ReadonlyArray<
      { readonly filename: string; readonly files: ReadonlyArray<{ path: string }> }
    >
    packed = tarball!.files.map((f) => f.path)
    mkdirSync(project)
    ok(run("npm", ["init", "-y"]), "npm init")
    ok(run("npm", ["pkg", "set", "type=module"]), "npm pkg set")
    // As the README says it: the package and today's Effect, no version given.
    installed = run("npm", [
      "install",
      "--no-audit",
      "--no-fund",
      join(dir, tarball!.filename),
      "effect",
    ])
    ok(installed, "npm install")
    ok(
      run("npm", [
        "install",
        "--save-dev",
        "--no-audit",
        "--no-fund",
        "--prefer-offline",
        `typescript@${pkg.devDependencies["typescript"]}`,
        `typescript7@${pkg.devDependencies["typescript7"]}`,
        `@types/node@${pkg.devDependencies["@types/node"]}`,
      ]),
      "npm install --save-dev",
    )
    for (
      const file of ["tsconfig.json", "worker.ts", "orphan.ts", "harness.ts", "http.ts", "app.ts"]
    ) {
      cpSync(join(FIXTURES, file), join(project, file))
    }
  }, 300_000)
  afterAll(() => {
    if (dir !== "") rmSync(dir, { recursive: true, force: true })
  })

  it("the tarball holds dist/, src/, cli.ts, docs/, the README, changelog, licence and package.json, no more", () => {
    const tops = [...new Set(packed.map((path) => path.split("/")[0]))].sort()
    expect(tops).toEqual([
      "CHANGELOG.md",
      "LICENSE",
      "README.md",
      "cli.ts",
      "dist",
      "docs",
      "examples",
      "package.json",
      "src",
    ])
    expect(packed).toContain("dist/cli.js")
    expect(packed).toContain("dist/index.d.ts")
    expect(packed).toContain("docs/protocol.md")
    // docs/conformance.md's workload worker, and nothing else of examples/.
    expect(packed.filter((path) => path.startsWith("examples/"))).toEqual([
      "examples/conformance/worker.ts",
    ])
  })

  it("every link of the installed README and docs resolves: a file in the package, a heading, or a URL", () => {
    const root = join(project, "node_modules/@async-task/worker")
    const headings = (markdown: string) =>
      new Set(
        [...markdown.matchAll(/^#+ (.+)$/gm)].map(([, title]) =>
          title!.trim().toLowerCase().replace(/[^\w\- ]/g, "").replace(/ /g, "-")
        ),
      )
    const pages = ["README.md", ...packed.filter((path) => /^docs\/[^/]+\.md$/.test(path))]
    expect(pages).toContain("docs/conformance.md")
    let count = 0
    for (const page of pages) {
      const text = readFileSync(join(root, page), "utf8")
      for (const [, link] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        count++
        if (/^https:\/\//.test(link!)) continue
        const [file, anchor] = link!.split("#")
        const target = file === "" ? page : join(dirname(page), file!)
        expect(existsSync(join(root, target)), `${page}: link ${link} in the package`).toBe(true)
        if (anchor !== undefined && target.endsWith(".md")) {
          const found = headings(readFileSync(join(root, target), "utf8"))
          expect(found, `${page}: anchor ${link}`).toContain(anchor)
        }
      }
    }
    expect(count).toBeGreaterThan(20)
  })

  it(
    "the conformance report links the installed docs/protocol.md, and its workload worker runs",
    () => {
      const page = run(node22, [
        "--input-type=module",
        "-e",
        'import * as Conformance from "@async-task/worker/conformance"; console.log(Conformance.PROTOCOL_PAGE)',
      ])
      expect(page.status, show(page)).toBe(0)
      const url = new URL(page.stdout.trim())
      expect(realpathSync(fileURLToPath(url))).toBe(
        realpathSync(join(project, "node_modules/@async-task/worker/docs/protocol.md")),
      )
      // As docs/conformance.md says: copied out of node_modules, where Node strips no types.
      cpSync(
        join(project, "node_modules/@async-task/worker/examples/conformance/worker.ts"),
        join(project, "conformance.ts"),
      )
      const cli = trial(
        "./conformance.ts",
        '{"steps":[{"progress":0.5}],"end":{"succeed":[1]}}',
        node24,
      )
      expect(cli.status, show(cli)).toBe(0)
      expect(cli.stdout).toContain(
        '{"task_id":"local-1","data":{"message_type":"success","response":{"ok":true,"echo":[1]}}}',
      )
    },
    60_000,
  )

  it("`npm i <tarball> effect` installs today's Effect, which meets the peer range, unwarned", () => {
    const said = `${installed!.stdout}\n${installed!.stderr}`
    expect(said, said).not.toMatch(/peer/i)
    expect(pkg.peerDependencies).toEqual({ effect: "^4.1.0" })
    const effect = JSON.parse(
      readFileSync(join(project, "node_modules/effect/package.json"), "utf8"),
    ) as { readonly version: string }
    const [major = 0, minor = 0] = effect.version.split(".").map(Number)
    expect(major, effect.version).toBe(4)
    expect(minor, effect.version).toBeGreaterThanOrEqual(1)
  })

  // The compiler that builds dist/ and TypeScript 7, the native one, as an app would run either.
  it.each([["typescript", "5"], ["typescript7", "7"]])(
    "a strict worker, its typed harness test and an Effect app compile against the package on %s (TypeScript %s), declarations included",
    (compiler) => {
      // tsc exits non-zero on any error: an unused `@ts-expect-error` in harness.ts, a type
      // of the app's exports that its declarations cannot name (TS2742), or an error in any
      // library's declarations (skipLibCheck is off).
      rmSync(join(project, "out"), { recursive: true, force: true })
      const tsc = run(node22, [`node_modules/${compiler}/bin/tsc`, "-p", "."])
      expect(tsc.status, show(tsc)).toBe(0)
      expect(tsc.stdout).toBe("")
      const declarations = readFileSync(join(project, "out/app.d.ts"), "utf8")
      expect(declarations).toContain("export declare const AppLive: ")
      expect(declarations).toContain("export declare const WorkerLive: ")
      const harness = run(node22, ["out/harness.js"])
      expect(harness.status, show(harness)).toBe(0)
      expect(harness.stdout).toContain(
        'RESULT {"words":3,"first":"one","types":["started","progress","success"]}',
      )
    },
    120_000,
  )

  describe.each([["22", node22], ["24", node24], ["26", node26]])(
    "the Effect app on Node %s",
    (_, node) => {
      it(
        "runs tasks on RabbitMQ, serves the worker's probes from its own router, and on SIGTERM drains before its own finalizers",
        async () => {
          expect(existsSync(join(project, "out/app.js")), "compiled by the test above").toBe(true)
          const broker = await platform(QUORUM_VHOST)
          const name = uniqueName("npm-app")
          const [inQueue, outQueue] = [`${name}_in`, `${name}_out`]
          const app = spawn(node, ["out/app.js"], {
            cwd: project,
            env: {
              ...userEnv(node),
              BROKER_URL: urlFor(QUORUM_VHOST),
              IN_QUEUE_NAME: inQueue,
              OUT_QUEUE_NAME: outQueue,
              APP_PORT: "0",
              WORKER_CONCURRENCY: "2",
              WORKER_SHUTDOWN_GRACE_S: "2",
            },
            stdio: ["ignore", "pipe", "pipe"],
          })
          let output = ""
          app.stdout.setEncoding("utf8").on("data", (chunk: string) => void (output += chunk))
          app.stderr.setEncoding("utf8").on("data", (chunk: string) => void (output += chunk))
          const exited = new Promise<number | null>((resolve) => app.once("close", resolve))
          const events = () =>
            output.split("\n").filter((line) => line.startsWith("EVENT ")).map((line) =>
              line.slice("EVENT ".length)
            )
          const said = () => `:\n${output.slice(-4000)}`
          // Given up at once if the app has exited: what it did not do, it will not.
          const waitFor = <A>(what: string, found: () => A | undefined, ms = 20_000) =>
            pollUntil(`the app to ${what}`, () => {
              const value = found()
              if (value === undefined && app.exitCode !== null) {
                throw new Error(`the app exited before it could ${what}${said()}`)
              }
              return value
            }, { ms, every: 20, said })
          try {
            const port = await waitFor(
              "listen",
              () => /Listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(output)?.[1],
            )
            // Built once the worker had started and connected: the startup hook ran, before any
            // task, with the Database open.
            expect(events()).toEqual(["database opened", "startup hook"])

            const get = async (path: string) => {
              const response = await fetch(`http://127.0.0.1:${port}${path}`)
              return { status: response.status, text: await response.text() }
            }
            await expectAppServes(get)
            expect(await get("/worker/health")).toEqual({
              status: 200,
              text: '{"status":"ok"}',
            })

            broker.publish(inQueue, broker.envelope("t-first", { id: "first", millis: 1 }))
            await broker.readUntil(outQueue, (all) => all.some((m) => m.type === "success"))
            // Two in flight when the app is interrupted: one ends within the grace, one does not.
            broker.publish(inQueue, broker.envelope("t-short", { id: "short", millis: 500 }))
            broker.publish(inQueue, broker.envelope("t-long", { id: "long", millis: 30_000 }))
            await broker.confirmed()
            await waitFor(
              "start both tasks",
              () =>
                ["task short started", "task long started"].every((e) => events().includes(e))
                  ? true
                  : undefined,
            )
            process.kill(app.pid!, "SIGTERM")
            const code = await Promise.race([exited, sleep(20_000).then(() => "late" as const)])
            expect(code, output.slice(-4000)).toBe(0)

            const after = events()
            expect(after).toEqual(expect.arrayContaining(["task short done", "shutdown hook"]))
            expect(after).not.toContain("task long done")
            // The drain, then the worker's shutdown hooks, and only then the app's own finalizer.
            expect(after.indexOf("task short done")).toBeLessThan(after.indexOf("shutdown hook"))
            expect(after.at(-1)).toBe("database closed")
            // The long task was requeued, not concluded: it waits in the queue for a worker.
            const out = await broker.drain(outQueue)
            expect(out.filter((m) => m.type === "success").map((m) => JSON.parse(m.text).task_id))
              .toEqual(["t-short"])
            expect(await broker.count(inQueue)).toBe(1)
          } finally {
            if (app.exitCode === null) app.kill("SIGKILL")
            await broker.remove(inQueue, outQueue)
            await broker.close()
          }
        },
        90_000,
      )
    },
  )

  it("npx async-task-worker runs the compiled worker on Node 22, --memory", () => {
    const cli = run("npx", ["async-task-worker", "run", "./out/worker.js", "--memory"], {
      input: '{"text":"one two three"}\n',
    })
    expect(cli.status, show(cli)).toBe(0)
    expect(cli.stdout).toContain(
      '{"task_id":"local-1","data":{"message_type":"success","response":{"words":3,"first":"one"}}}',
    )
  }, 60_000)

  it(
    "npx async-task-worker on RabbitMQ, npx sent SIGTERM: the worker drains and exits 0 within its shutdown bound",
    async () => {
      expect(existsSync(join(project, "out/orphan.js")), "compiled by the test above").toBe(true)
      const grace = 2
      // Lifecycle.shutdownBound: max(grace, 5) + 17 seconds.
      const bound = (Math.max(grace, 5) + 17) * 1000
      const broker = await platform(QUORUM_VHOST)
      const name = uniqueName("npx-orphan")
      const [inQueue, outQueue] = [`${name}_in`, `${name}_out`]
      // On RabbitMQ, not --memory: npx's end also ends the input it shares with the trial, which
      // would stop the trial for another reason.
      const npx = spawn("npx", ["async-task-worker", "run", "./out/orphan.js"], {
        cwd: project,
        env: {
          ...userEnv(node22),
          BROKER_URL: urlFor(QUORUM_VHOST),
          IN_QUEUE_NAME: inQueue,
          OUT_QUEUE_NAME: outQueue,
          WORKER_SHUTDOWN_GRACE_S: String(grace),
        },
        stdio: ["ignore", "pipe", "pipe"],
      })
      let output = ""
      npx.stdout.setEncoding("utf8").on("data", (chunk: string) => void (output += chunk))
      npx.stderr.setEncoding("utf8").on("data", (chunk: string) => void (output += chunk))
      const npxExited = new Promise<void>((resolve) => npx.once("exit", () => resolve()))
      const waitFor = <A>(what: string, found: () => A | undefined, ms: number) =>
        pollUntil(`the worker to ${what}`, found, {
          ms,
          every: 20,
          said: () => `:\n${output.slice(-4000)}`,
        })
      const seen = (text: string) => () => (output.includes(text) ? true : undefined)
      let worker = 0
      try {
        worker = Number(
          await waitFor("say its pid", () => /^PID (\d+)$/m.exec(output)?.[1], 30_000),
        )
        // npx runs the CLI through a shell: the worker is its grandchild, not npx itself.
        expect(worker).not.toBe(npx.pid)
        await waitFor("start", seen("Worker count-words started"), 30_000)
        broker.publish(inQueue, broker.envelope("t-npx", { text: "one two" }))
        await broker.readUntil(outQueue, (all) => all.some((m) => m.type === "success"))

        process.kill(npx.pid!, "SIGTERM")
        const sent = Date.now()
        await npxExited
        const code = await waitFor("exit", () => /^EXIT (\d+)$/m.exec(output)?.[1], bound)
        expect(Date.now() - sent).toBeLessThan(bound)
        expect(code, output.slice(-4000)).toBe("0")
        expect(output).toContain("The process that started the worker has exited: shutting down")
        // Gone (or a zombie, for an init that does not reap it): no longer consuming.
        await waitFor("be gone", () => {
          try {
            const stat = readFileSync(`/proc/${worker}/stat`, "utf8")
            return /^\d+ \(.*\) Z/.test(stat) ? true : undefined
          } catch {
            return true
          }
        }, 5_000)
      } finally {
        if (npx.exitCode === null) npx.kill("SIGKILL")
        if (worker !== 0 && !/^EXIT /m.test(output)) {
          try {
            process.kill(worker, "SIGKILL")
          } catch {
            // gone
          }
        }
        await broker.remove(inQueue, outQueue)
        await broker.close()
      }
    },
    90_000,
  )

  it("on Node 24, the CLI runs worker.ts itself, and node runs the harness test's .ts", () => {
    const cli = trial("./worker.ts", '{"text":"one two"}', node24)
    expect(cli.status, show(cli)).toBe(0)
    expect(cli.stdout).toContain(
      '{"task_id":"local-1","data":{"message_type":"success","response":{"words":2,"first":"one"}}}',
    )
    const harness = run(node24, ["harness.ts"], { node: node24 })
    expect(harness.status, show(harness)).toBe(0)
    expect(harness.stdout).toContain('RESULT {"words":3')
  }, 60_000)

  it(
    "on a Node that strips no types (22, --no-experimental-strip-types), worker.ts: exit 2 and one line saying what to do",
    () => {
      const cli = run("npx", ["async-task-worker", "run", "./worker.ts", "--memory"], {
        input: '{"text":"one"}\n',
        env: { NODE_OPTIONS: "--no-experimental-strip-types" },
      })
      expect(oneLine(cli)).toMatch(
        /^async-task-worker: cannot load \.\/worker\.ts: Node v22\.\d+\.\d+ strips no types from \.ts files, as it runs with --no-experimental-strip-types: run it without that flag, or compile it with tsc and run the \.js$/,
      )
    },
    60_000,
  )

  it(
    "on a Node older than the SDK supports (the system's), the CLI says what it needs: exit 2, one line",
    () => {
      const node20 = systemNode()
      const version = ok(run(node20, ["--version"], { node: node20 }), "node --version").trim()
      // The premise: this project's machines have Node 20 as their own.
      expect(version).toMatch(/^v20\./)
      const cli = run("npx", ["async-task-worker", "run", "./out/worker.js", "--memory"], {
        node: node20,
        input: '{"text":"one"}\n',
      })
      expect(oneLine(cli)).toBe(
        `async-task-worker: Node ${version} is too old: the SDK needs Node 22.19 or later ` +
          "(22 LTS or 24), or Deno 2",
      )
    },
    60_000,
  )
})
