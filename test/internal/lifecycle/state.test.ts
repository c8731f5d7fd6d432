/**
 * The worker's state changes only through `moveTo`: logged at DEBUG, `Failed` final (the drain
 * that follows a failure keeps the state that says why the shutdown came), none entered twice.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref, References } from "effect"
import { LifecycleState, moveTo } from "../../../src/internal/lifecycle/state.ts"
import { TransportError } from "../../../src/WorkerError.ts"
import { captureLogs } from "../../support/logs.ts"

const moves = (run: (state: Ref.Ref<LifecycleState>) => Effect.Effect<void>) =>
  Effect.gen(function* () {
    const logs = captureLogs()
    const state = yield* Ref.make<LifecycleState>(LifecycleState.Starting())
    yield* run(state).pipe(
      Effect.provide(logs.layer),
      Effect.provideService(References.MinimumLogLevel, "Debug"),
    )
    return { final: (yield* Ref.get(state))._tag, said: logs.lines.map((l) => l.message) }
  })

describe("moveTo", () => {
  it.effect("logs each change; a state entered already is not entered again", () =>
    Effect.gen(function* () {
      const { final, said } = yield* moves((state) =>
        Effect.gen(function* () {
          yield* moveTo(state, LifecycleState.Running())
          yield* moveTo(state, LifecycleState.Draining())
          yield* moveTo(state, LifecycleState.Draining())
        })
      )
      expect(final).toBe("Draining")
      expect(said).toEqual([
        "The worker's state: Starting → Running",
        "The worker's state: Running → Draining",
      ])
    }))

  it.effect("Failed is final: the drain after it keeps it", () =>
    Effect.gen(function* () {
      const error = new TransportError({ reason: "closed", message: "gone" })
      const { final, said } = yield* moves((state) =>
        Effect.gen(function* () {
          yield* moveTo(state, LifecycleState.Running())
          yield* moveTo(state, LifecycleState.Failed({ error }))
          yield* moveTo(state, LifecycleState.Draining())
        })
      )
      expect(final).toBe("Failed")
      expect(said).toEqual([
        "The worker's state: Starting → Running",
        "The worker's state: Running → Failed",
      ])
    }))
})
