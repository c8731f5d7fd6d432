import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Fiber, Option, Result, Stream } from "effect"
import { TestClock } from "effect/testing"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import * as Command from "../src/Command.ts"
import { VERSION } from "../src/internal/version.ts"
import * as Process from "../src/Process.ts"
import type { WireMessage } from "../src/Protocol.ts"

const fixtures = fileURLToPath(new URL("./fixtures/command/", import.meta.url))

const run = (module: string, exportName = "worker", memory = false) =>
  Result.succeed({ _tag: "Run", module, exportName, memory })

describe("Command", () => {
  describe("parse", () => {
    it("asks for help, wherever the flag is", () => {
      for (const argv of [["--help"], ["-h"], ["run", "./w.ts", "--help"], ["serve", "-h"]]) {
        expect(Command.parse(argv)).toEqual(Result.succeed({ _tag: "Help" }))
      }
    })

    it("asks for the version", () => {
      for (const argv of [["--version"], ["-V"], ["run", "./w.ts", "-V"]]) {
        expect(Command.parse(argv)).toEqual(Result.succeed({ _tag: "Version" }))
      }
    })

    it("reads conformance's options, and says which one is wrong", () => {
      expect(Command.parse([
        "conformance",
        "--broker",
        "amqp://h/v",
        "--service",
        "ocr",
        "--delivery-limit",
        "3",
        "--rabbitmqctl",
      ])).toEqual(Result.succeed({
        _tag: "Conformance",
        options: { brokerUrl: "amqp://h/v", service: "ocr", deliveryLimit: 3 },
        unacked: "rabbitmqctl",
      }))
      const base = ["conformance", "--broker", "amqp://h", "--service", "s"]
      expect(Command.parse([...base, "--management", "http://m"])).toEqual(Result.succeed({
        _tag: "Conformance",
        options: { brokerUrl: "amqp://h", service: "s" },
        unacked: { management: "http://m" },
      }))
      expect(Command.parse(["conformance", "--service", "s"])).toEqual(
        Result.fail("conformance needs --broker <url>"),
      )
      expect(Command.parse([...base, "--timeout", "soon"])).toEqual(
        Result.fail('--timeout needs a number of seconds above 0, not "soon"'),
      )
      expect(Command.parse([...base, "--delivery-limit", "0"])).toEqual(
        Result.fail('--delivery-limit needs a whole number from 1, not "0"'),
      )
      expect(Command.parse([...base, "--max-message-bytes", "65536"])).toEqual(Result.succeed({
        _tag: "Conformance",
        options: { brokerUrl: "amqp://h", service: "s", maxMessageBytes: 65536 },
        unacked: undefined,
      }))
      expect(Command.parse([...base, "--progress-interval", "0x10"])).toEqual(
        Result.fail('--progress-interval needs a number of seconds above 0, not "0x10"'),
      )
      expect(Command.parse([...base, "--service", "t"])).toEqual(
        Result.fail("--service is given twice"),
      )
      expect(Command.parse([...base, "--rabbitmqctl", "--management", "http://m"])).toEqual(
        Result.fail("--management and --rabbitmqctl both tell the unacked count: give one"),
      )
      expect(Command.parse(["conformance", "--broker", "rabbit", "--service", "s"])).toEqual(
        Result.fail('--broker needs an AMQP URL, not "rabbit"'),
      )
      expect(Command.parse(["conformance", "--broker"])).toEqual(
        Result.fail("--broker needs a value"),
      )
      expect(Command.parse(["conformance", "--verbose"])).toEqual(
        Result.fail('unknown option "--verbose" of conformance'),
      )
    })

    it("runs a module's worker, by default the export named worker", () => {
      expect(Command.parse(["run", "./w.ts"])).toEqual(run("./w.ts"))
      expect(Command.parse(["run", "/srv/app/w.ts"])).toEqual(run("/srv/app/w.ts"))
    })

    it("module:export names the export", () => {
      expect(Command.parse(["run", "./w.ts:makeWorker"])).toEqual(run("./w.ts", "makeWorker"))
      expect(Command.parse(["run", "./w.ts:default"])).toEqual(run("./w.ts", "default"))
      expect(Command.parse(["run", "./w.ts:$w_2"])).toEqual(run("./w.ts", "$w_2"))
    })

    it("--memory runs on the embedded broker, before or after the module", () => {
      expect(Command.parse(["run", "./w.ts", "--memory"])).toEqual(run("./w.ts", "worker", true))
      expect(Command.parse(["run", "--memory", "./w.ts:make"])).toEqual(
        run("./w.ts", "make", true),
      )
    })

    it("a colon in a Windows path or a file: URL is not an export", () => {
      expect(Command.parse(["run", "C:\\work\\w.ts"])).toEqual(run("C:\\work\\w.ts"))
      expect(Command.parse(["run", "C:\\work\\w.ts:make"])).toEqual(run("C:\\work\\w.ts", "make"))
      expect(Command.parse(["run", "C:/work/w.ts"])).toEqual(run("C:/work/w.ts"))
      expect(Command.parse(["run", "file:///srv/w.ts"])).toEqual(run("file:///srv/w.ts"))
      expect(Command.parse(["run", "file:///srv/w.ts:make"])).toEqual(
        run("file:///srv/w.ts", "make"),
      )
      expect(Command.parse(["run", "file:///C:/work/w.ts"])).toEqual(run("file:///C:/work/w.ts"))
    })

    const usageErrors: ReadonlyArray<readonly [string, ReadonlyArray<string>, string]> = [
      ["no command", [], "missing command"],
      ["an unknown command", ["serve", "./w.ts"], 'unknown command "serve"'],
      ["an unknown option", ["run", "./w.ts", "--fast"], 'unknown option "--fast"'],
      ["no module", ["run"], "run needs a module"],
      ["no module, only an option", ["run", "--memory"], "run needs a module"],
      ["two modules", ["run", "./a.ts", "./b.ts"], "run takes one module, got 2"],
    ]
    for (const [what, argv, says] of usageErrors) {
      it(`${what}: one line saying what is wrong`, () => {
        const parsed = Command.parse(argv)
        expect(Result.isFailure(parsed)).toBe(true)
        const message = Result.getFailure(parsed).pipe(Option.getOrThrow)
        expect(message).toContain(says)
        expect(message).not.toContain("\n")
      })
    }
  })

  describe("load", () => {
    const loaded = (module: string, exportName = "worker") =>
      Effect.result(Command.load(fixtures, module, exportName))

    const loadError = (module: string, exportName = "worker") =>
      Effect.flip(Command.load(fixtures, module, exportName))

    it.effect("a worker export", () =>
      Effect.gen(function* () {
        const worker = yield* Command.load(fixtures, "./worker.ts", "worker")
        expect(worker._tag).toBe("Worker")
        expect(worker.name).toBe("count-words")
        expect((yield* Command.load(fixtures, "worker.ts", "default")).name).toBe("count-words")
      }))

    it.effect("an absolute path and a file: URL", () =>
      Effect.gen(function* () {
        const path = join(fixtures, "worker.ts")
        expect((yield* Command.load("/elsewhere", path, "worker")).name).toBe("count-words")
        const url = pathToFileURL(path).href
        expect((yield* Command.load("/elsewhere", url, "worker")).name).toBe("count-words")
      }))

    it.effect("a factory, sync or async, is called", () =>
      Effect.gen(function* () {
        expect((yield* Command.load(fixtures, "./worker.ts", "makeWorker")).name).toBe(
          "count-words",
        )
        expect((yield* Command.load(fixtures, "./worker.ts", "makeWorkerLater")).name).toBe(
          "count-words",
        )
      }))

    it.effect("a missing file", () =>
      Effect.gen(function* () {
        const error = yield* loadError("./missing.ts")
        expect(error.startsWith("cannot load ./missing.ts: ")).toBe(true)
        expect(error).not.toContain("\n")
      }))

    it.effect("a missing export: the message names the exports there are, workers first", () =>
      Effect.gen(function* () {
        expect(yield* loadError("./worker.ts", "nope")).toBe(
          './worker.ts has no export named "nope" (its workers: default, worker; its other ' +
            "exports: answer, broken, makeWorker, makeWorkerLater, notAFactory, withArguments)",
        )
      }))

    it.effect("a missing export of a module with no worker, many exports, or none", () =>
      Effect.gen(function* () {
        const dir = mkdtempSync(join(tmpdir(), "command-load-"))
        try {
          const many = join(dir, "many.mjs")
          writeFileSync(
            many,
            Array.from({ length: 12 }, (_, i) => `export const e${i + 10} = ${i}\n`).join(""),
          )
          const error = yield* Effect.flip(Command.load(dir, many, "worker"))
          expect(error).toBe(
            `${many} has no export named "worker" (it exports no worker; its exports: ` +
              "e10, e11, e12, e13, e14, e15, e16, e17, and 4 more)",
          )
          const none = join(dir, "none.mjs")
          writeFileSync(none, "export {}\n")
          expect(yield* Effect.flip(Command.load(dir, none, "worker"))).toBe(
            `${none} has no export named "worker" (it exports nothing)`,
          )
        } finally {
          rmSync(dir, { recursive: true, force: true })
        }
      }))

    it.effect("a factory that throws: its message's first line", () =>
      Effect.gen(function* () {
        expect(yield* loadError("./worker.ts", "broken")).toBe(
          'the factory "broken" of ./worker.ts failed: no model file',
        )
      }))

    it.effect("exports that are not workers", () =>
      Effect.gen(function* () {
        for (const name of ["answer", "notAFactory", "withArguments"]) {
          const error = yield* loadError("./worker.ts", name)
          expect(error).toContain(`the export "${name}" of ./worker.ts is not a worker`)
          expect(error).not.toContain("\n")
        }
      }))

    it.effect("a module whose Worker.make throws: the definition error, in one line", () =>
      Effect.gen(function* () {
        const error = yield* loadError("./invalid.ts")
        expect(error).toBe(
          "cannot load ./invalid.ts: The worker needs a name of letters, digits, '.', '_' or '-' " +
            '(at most 200 characters), such as "count-words".',
        )
        expect(Result.isFailure(yield* loaded("./invalid.ts"))).toBe(true)
      }))
  })

  describe("main", () => {
    const main = (argv: ReadonlyArray<string>, stdinLines?: Stream.Stream<string>) =>
      Effect.gen(function* () {
        const proc = yield* Process.makeTest({
          argv,
          cwd: fixtures,
          ...(stdinLines ? { stdinLines } : {}),
        })
        const fiber = yield* Command.main.pipe(
          Effect.provideService(Process.Process, proc.process),
          Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromUnknown({})),
          Effect.forkChild,
        )
        return { proc, fiber }
      })

    it.effect("--help: the usage on stdout, exit 0", () =>
      Effect.gen(function* () {
        const { fiber, proc } = yield* main(["--help"])
        expect(yield* Fiber.join(fiber)).toBe(0)
        expect(yield* proc.out).toEqual([Command.USAGE])
        expect(yield* proc.err).toEqual([])
      }))

    it.effect("--version: the SDK's version on stdout, exit 0", () =>
      Effect.gen(function* () {
        const { fiber, proc } = yield* main(["--version"])
        expect(yield* Fiber.join(fiber)).toBe(0)
        expect(yield* proc.out).toEqual([VERSION])
      }))

    it.effect("a usage error: exit 2 and one line on stderr", () =>
      Effect.gen(function* () {
        const { fiber, proc } = yield* main(["serve", "./worker.ts"])
        expect(yield* Fiber.join(fiber)).toBe(2)
        expect(yield* proc.err).toEqual([
          'async-task-worker: unknown command "serve": expected run or conformance (see --help)',
        ])
        expect(yield* proc.out).toEqual([])
      }))

    it.effect("a module that cannot be loaded: exit 2 and one line on stderr", () =>
      Effect.gen(function* () {
        const { fiber, proc } = yield* main(["run", "./invalid.ts"])
        expect(yield* Fiber.join(fiber)).toBe(2)
        const err = yield* proc.err
        expect(err).toHaveLength(1)
        expect(err[0]).toContain("async-task-worker: cannot load ./invalid.ts: The worker needs")
      }))

    it.effect("run without BROKER_URL: exit 2, saying so", () =>
      Effect.gen(function* () {
        const { fiber, proc } = yield* main(["run", "./worker.ts"])
        expect(yield* Fiber.join(fiber)).toBe(2)
        const err = yield* proc.err
        expect(err).toHaveLength(1)
        expect(err[0]).toContain("BROKER_URL is not set")
        expect(err[0]).toMatch(
          /or run on the embedded broker with --memory \(WORKER_TRANSPORT=memory\)$/,
        )
      }))

    it.effect(
      "run --memory: each line of stdin a task, each message published printed, exit 0",
      () =>
        Effect.gen(function* () {
          const { fiber, proc } = yield* main(
            ["run", "./worker.ts:makeWorker", "--memory"],
            Stream.make('{"text":"one two three"}'),
          )
          // The module loads by a real import: test time moves only once it has, however long a
          // busy machine takes, and a real pause lets it.
          for (let i = 0; i < 2000 && fiber.pollUnsafe() === undefined; i++) {
            yield* TestClock.adjust("20 millis")
            yield* TestClock.withLive(Effect.sleep("10 millis"))
          }
          expect(yield* Fiber.join(fiber)).toBe(0)
          const out = (yield* proc.out).map((line) => JSON.parse(line) as WireMessage)
          expect(out.map((m) => m.data.message_type)).toEqual(["started", "success"])
          expect(out[1]!.data.response).toEqual({ words: 3 })
        }),
      30_000,
    )
  })

  it("VERSION is package.json's version", () => {
    const pkg = JSON.parse(
      readFileSync(new URL("../package.json", import.meta.url), "utf8"),
    ) as { readonly version: string }
    expect(VERSION).toBe(pkg.version)
  })
})
