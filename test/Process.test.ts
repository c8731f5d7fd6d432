import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Queue, Scope, Stream } from "effect"
import process from "node:process"
import * as Process from "../src/Process.ts"

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
  })
})
