/**
 * The worker's shutdown hooks, run after the drain: in order, all within one budget, each with
 * what the ones before it left.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import type { Hook } from "../../WorkerDefinition.ts"
import { errorText } from "../describe.ts"
import { timeoutDetached } from "../detach.ts"
import * as Hooks from "./hooks.ts"

/**
 * Runs hooks in order, all of them within `budget`, each with what is left of it. A hook that
 * refuses to be interrupted is left behind (`timeoutDetached`) when its time is up, so that the hooks
 * after it still run.
 */
export const runShutdownHooks = <R>(
  hooks: ReadonlyArray<Hook<R>>,
  budget: Duration.Duration,
): Effect.Effect<boolean, never, R> =>
  Effect.gen(function* () {
    const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(budget)
    let clean = true
    for (const [i, hook] of hooks.entries()) {
      // A hook still starts once the budget is spent, with a millisecond: time for one that
      // finishes at once (a flush) after one that hung, well within the bound's slack.
      const left = Math.max(1, deadline - (yield* Clock.currentTimeMillis))
      const result = yield* Effect.result(
        timeoutDetached(Hooks.toEffect(hook), Duration.millis(left)),
      )
      if (Result.isFailure(result)) {
        clean = false
        yield* Effect.logError(`Shutdown hook ${i + 1} failed: ${errorText(result.failure)}`)
      } else if (Option.isNone(result.success)) {
        clean = false
        yield* Effect.logError(
          `Shutdown hook ${i + 1} did not finish within the shutdown hooks' time (${
            Duration.format(budget)
          })`,
        )
      }
    }
    return clean
  })
