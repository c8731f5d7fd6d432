import { describe, expect, it } from "@effect/vitest"
import { Config, ConfigProvider, Effect, Layer } from "effect"
import { launch } from "../../../src/internal/lifecycle/launch.ts"
import * as Process from "../../../src/Process.ts"
import { captureLogs } from "../../support/logs.ts"

/** An app's layer that fails to build, launched: the exit code, stderr and the error lines. */
const launched = <E>(app: Layer.Layer<never, E>) =>
  Effect.gen(function* () {
    const proc = yield* Process.makeTest()
    const logs = captureLogs()
    const code = yield* launch(app, Effect.never, undefined).pipe(
      Effect.provideService(Process.Process, proc.process),
      Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} })),
      Effect.provide(logs.layer),
    )
    const errors = logs.lines.filter((l) => l.level === "Error").map((l) => l.message)
    return { code, err: yield* proc.err, errors }
  }).pipe(Effect.scoped)

/** As `@effect/platform-node`'s `ServeError`: a tag, no message, the reason in `cause`. */
class ServeError extends Error {
  readonly _tag = "ServeError"
  constructor(cause: unknown) {
    super("", { cause })
  }
}

describe("launch", () => {
  it.effect("an app's failure with no message is said by its tag and its causes", () =>
    Effect.gen(function* () {
      const listen = Object.assign(new Error("listen EADDRINUSE: address already in use :::8080"), {
        code: "EADDRINUSE",
      })
      const { code, errors } = yield* launched(
        Layer.effectDiscard(Effect.fail(new ServeError(listen))),
      )
      expect(code).toBe(1)
      expect(errors).toEqual([
        "The app could not start: ServeError: Error: listen EADDRINUSE: address already in use :::8080",
      ])
    }))

  it.effect("a configuration the app cannot read names the variable, on one line", () =>
    Effect.gen(function* () {
      const { code, err } = yield* launched(
        Layer.effectDiscard(Effect.gen(function* () {
          yield* Config.String("APP_AMQP_URL")
        })),
      )
      expect(code).toBe(2)
      expect(err).toHaveLength(1)
      expect(err[0]).toMatch(/^The configuration could not be read: .*APP_AMQP_URL/)
      expect(err[0]).not.toContain("\n")
    }))
})
