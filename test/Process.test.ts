import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Queue, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import process from "node:process"
import * as Process from "../src/Process.ts"

/** A parent pid the test changes, and how often the watch has read it. */
const parent = (pid: number) => {
  const state = { pid, reads: 0 }
  return {
    state,
    parentPid: () => {
      state.reads++
      return state.pid
    },
  }
}

describe("Process", () => {
  describe("makeTest", () => {
    it.effect("sends a signal to every listener, SIGTERM by default", () =>
      Effect.gen(function* () {
        const test = yield* Process.makeTest()
        const first = yield* test.process.signals
        const second = yield* test.process.signals
        yield* test.signal()
        yield* test.signal("SIGINT")
        expect(Array.from(yield* Queue.takeAll(first))).toEqual(["SIGTERM", "SIGINT"])
        expect(Array.from(yield* Queue.takeAll(second))).toEqual(["SIGTERM", "SIGINT"])
      }))

    it.effect("keeps what is written, line by line", () =>
      Effect.gen(function* () {
        const test = yield* Process.makeTest()
        yield* test.process.writeOut("one")
        yield* test.process.writeErr("oops")
        yield* test.process.writeOut("two")
        expect(yield* test.out).toEqual(["one", "two"])
        expect(yield* test.err).toEqual(["oops"])
      }))

    it.effect("gives the arguments, standard input and working directory it is made with", () =>
      Effect.gen(function* () {
        const test = yield* Process.makeTest({
          argv: ["run", "./w.ts"],
          stdinLines: Stream.make("a", "b"),
          cwd: "/srv",
        })
        expect(test.process.argv).toEqual(["run", "./w.ts"])
        expect(test.process.cwd).toBe("/srv")
        expect(Array.from(yield* Stream.runCollect(test.process.stdinLines))).toEqual(["a", "b"])
      }))
  })

  describe("the launcher's exit", () => {
    it.effect("is a stop, noticed within a second of the parent's pid changing, once", () =>
      Effect.gen(function* () {
        const launcher = parent(4242)
        const test = yield* Process.makeTest({ parentPid: launcher.parentPid })
        const stops = yield* test.process.signals
        yield* TestClock.adjust("10 seconds")
        expect(yield* Queue.size(stops)).toBe(0)
        // npx gone: the orphan is adopted by the init.
        launcher.state.pid = 1
        yield* TestClock.adjust("999 millis")
        expect(yield* Queue.size(stops)).toBe(0)
        yield* TestClock.adjust("1 millis")
        expect(yield* Queue.take(stops)).toBe("LauncherExited")
        yield* TestClock.adjust("1 minute")
        expect(yield* Queue.size(stops)).toBe(0)
      }))

    it.effect("is no stop when the launcher is not a package runner: nohup, setsid, a supervisor", () =>
      Effect.gen(function* () {
        const launcher = parent(4242)
        const test = yield* Process.makeTest({
          parentPid: launcher.parentPid,
          packageRunner: false,
        })
        const stops = yield* test.process.signals
        // The shell that ran `nohup … &` exits: the worker was detached from it on purpose.
        launcher.state.pid = 1
        yield* TestClock.adjust("1 minute")
        expect(yield* Queue.size(stops)).toBe(0)
        yield* test.signal("SIGTERM")
        expect(yield* Queue.take(stops)).toBe("SIGTERM")
      }))

    it.effect("is seen at once when the launcher was gone before the watch began", () =>
      Effect.gen(function* () {
        const launcher = parent(4242)
        const test = yield* Process.makeTest({ parentPid: launcher.parentPid })
        launcher.state.pid = 77 // a subreaper adopted it
        const stops = yield* test.process.signals
        expect(yield* Queue.take(stops)).toBe("LauncherExited")
      }))

    it.effect("is no stop after a signal: a Ctrl-C reaches npx too, and its end is no second signal", () =>
      Effect.gen(function* () {
        const launcher = parent(4242)
        const test = yield* Process.makeTest({ parentPid: launcher.parentPid })
        const stops = yield* test.process.signals
        yield* test.signal("SIGINT")
        launcher.state.pid = 1
        yield* TestClock.adjust("5 seconds")
        expect(Array.from(yield* Queue.takeAll(stops))).toEqual(["SIGINT"])
        // A signal after it is a second signal still.
        yield* test.signal("SIGINT")
        expect(Array.from(yield* Queue.takeAll(stops))).toEqual(["SIGINT"])
      }))

    it.effect("never comes while the parent stays the same", () =>
      Effect.gen(function* () {
        const launcher = parent(4242)
        const test = yield* Process.makeTest({ parentPid: launcher.parentPid })
        const stops = yield* test.process.signals
        yield* TestClock.adjust("1 hour")
        expect(yield* Queue.size(stops)).toBe(0)
        expect(launcher.state.reads).toBeGreaterThan(3600)
      }))

    it.effect.each([
      { when: "the worker is PID 1", pid: 1, launcher: 4242 },
      { when: "its parent is an init, PID 1 (tini, dumb-init)", pid: 7, launcher: 1 },
      { when: "its parent is outside its PID namespace (0)", pid: 7, launcher: 0 },
    ])("is never watched for when $when", ({ pid, launcher }) =>
      Effect.gen(function* () {
        const source = parent(launcher)
        const test = yield* Process.makeTest({ parentPid: source.parentPid, pid })
        const stops = yield* test.process.signals
        const before = source.state.reads
        source.state.pid = 99
        yield* TestClock.adjust("1 hour")
        expect(yield* Queue.size(stops)).toBe(0)
        expect(source.state.reads).toBe(before)
      }))

    it.effect("is watched for only while the scope lives", () =>
      Effect.gen(function* () {
        const launcher = parent(4242)
        const test = yield* Process.makeTest({ parentPid: launcher.parentPid })
        const scope = yield* Scope.make()
        yield* test.process.signals.pipe(Scope.provide(scope))
        yield* TestClock.adjust("3 seconds")
        yield* Scope.close(scope, Exit.void)
        const reads = launcher.state.reads
        yield* TestClock.adjust("1 hour")
        expect(launcher.state.reads).toBe(reads)
      }))

    it.effect("is not watched for by a test process made without a parent", () =>
      Effect.gen(function* () {
        const test = yield* Process.makeTest()
        const stops = yield* test.process.signals
        yield* TestClock.adjust("1 hour")
        expect(yield* Queue.size(stops)).toBe(0)
      }))
  })

  describe("missingPermissions", () => {
    it.skipIf(process.versions.deno !== undefined)("says nothing off Deno", () => {
      expect(Process.missingPermissions()).toBeUndefined()
      expect(Process.missingPermissions({ read: ["./w.ts"], net: ["127.0.0.1:5672"] }))
        .toBeUndefined()
    })

    it.skipIf(process.versions.deno === undefined)("says nothing when all is granted (-A)", () => {
      expect(Process.missingPermissions()).toBeUndefined()
      expect(Process.missingPermissions({ read: ["./w.ts"], net: ["127.0.0.1:5672"] }))
        .toBeUndefined()
    })
  })

  describe("layer", () => {
    it.effect("listens for SIGTERM and SIGINT only while the scope lives", () =>
      Effect.gen(function* () {
        const real = yield* Process.Process
        const before = {
          SIGTERM: process.listenerCount("SIGTERM"),
          SIGINT: process.listenerCount("SIGINT"),
        }
        const scope = yield* Scope.make()
        const signals = yield* real.signals.pipe(Scope.provide(scope))
        expect(process.listenerCount("SIGTERM")).toBe(before.SIGTERM + 1)
        expect(process.listenerCount("SIGINT")).toBe(before.SIGINT + 1)
        process.emit("SIGTERM", "SIGTERM")
        expect(yield* Queue.take(signals)).toBe("SIGTERM")
        yield* Scope.close(scope, Exit.void)
        expect(process.listenerCount("SIGTERM")).toBe(before.SIGTERM)
        expect(process.listenerCount("SIGINT")).toBe(before.SIGINT)
      }).pipe(Effect.provide(Process.layer)))

    it.effect("watches the real launcher: the test runner, still there, is no stop", () =>
      Effect.gen(function* () {
        const stops = yield* (yield* Process.Process).signals
        yield* TestClock.adjust("10 seconds")
        expect(yield* Queue.size(stops)).toBe(0)
      }).pipe(Effect.provide(Process.layer)))
  })
})
