/**
 * An app's layer as the process (`Worker.launch`): the layer built, held until a stop or the end
 * of a worker's life in it, then released within the shutdown's bound; the spec's exit code, with
 * one line saying why the app could not start.
 */
import * as Cause from "effect/Cause"
import * as Config from "effect/Config"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { type ExitCode, missingPermissions, Process } from "../../Process.ts"
import type * as Settings from "../../Settings.ts"
import {
  MissingServiceError,
  ProbeServerError,
  SettingsError,
  TransportError,
} from "../../WorkerError.ts"
import { errorChain, errorKind, errorMessage, oneLine } from "../describe.ts"
import { readTable } from "../settings/row.ts"
import { table } from "../settings/table.ts"
import { shutdownBound } from "./life.ts"
import { untilStopped } from "./process.ts"
import type { ConsumingError } from "./state.ts"

/** The grace's row takes nothing from a worker's definition. */
const NO_DEFINITION: Settings.SettingsDefaults = { name: "", timeout: Duration.zero }

/**
 * The grace the app's workers drain within, as their settings read it; none if it cannot be read
 * (the workers' own settings then fail the start).
 */
const graceOf = (given: Duration.Input | undefined): Effect.Effect<Duration.Duration> =>
  readTable({ shutdownGrace: table.shutdownGrace }, NO_DEFINITION, { shutdownGrace: given }).pipe(
    Effect.map(({ values }) => values.shutdownGrace ?? Duration.zero),
    Effect.catchDefect(() => Effect.succeed(Duration.zero)),
  )

const sayOnStderr = (line: string): Effect.Effect<ExitCode, never, Process> =>
  Effect.as(Effect.flatMap(Process, (process) => process.writeErr(line)), 2 as const)

/** A worker's failure once consuming, as the exit code (the worker has logged it). */
const consumingExitCode = (error: ConsumingError): ExitCode =>
  error._tag === "MissingServiceError" || (error._tag === "TransportError" && error.isConfiguration)
    ? 2
    : 1

/** Why the app did not start, as the spec's exit code, said in one line. */
const startFailure = (error: unknown): Effect.Effect<ExitCode, never, Process> => {
  if (error instanceof TransportError) {
    // The transport logs what it meets connecting; a missing URL it only fails with.
    if (error.reason === "not_configured") return sayOnStderr(error.message)
    return Effect.succeed(error.isConfiguration ? 2 : 1)
  }
  if (error instanceof SettingsError || error instanceof ProbeServerError) {
    return sayOnStderr(error.message)
  }
  // The engine has said which service (a startup hook's own is a StartupHookError).
  if (error instanceof MissingServiceError) return Effect.succeed(2)
  if (error instanceof Config.ConfigError) {
    // Its message's later lines name the variable.
    return sayOnStderr(`The configuration could not be read: ${oneLine(error.message)}`)
  }
  return Effect.as(Effect.logError(`The app could not start: ${errorChain(error)}`), 1 as const)
}

/**
 * A defect as the exit code: a runtime that refuses a permission (Deno) is configuration, said
 * with every permission missing; any other is a failure.
 */
const defectCode = (cause: Cause.Cause<never>): Effect.Effect<ExitCode, never, Process> => {
  const defect = Cause.squash(cause)
  if (errorKind(defect) !== "NotCapable") {
    return Effect.as(Effect.logError("The app failed", cause), 1 as const)
  }
  return sayOnStderr(
    missingPermissions() ?? `A Deno permission is missing: ${errorMessage(defect)}`,
  )
}

/**
 * The app's life as the process: the layer built in a scope of its own and held until the first
 * stop, or its failure to build; then the scope released (the workers' drains, their shutdown
 * hooks and transports, then the app's own services), within the bound of the workers' grace.
 */
export const launch = <ROut, E>(
  app: Layer.Layer<ROut, E, never>,
  stop: Effect.Effect<void>,
  shutdownGrace: Duration.Input | undefined,
): Effect.Effect<ExitCode, never, Process> =>
  Effect.scoped(Effect.gen(function* () {
    const appScope = yield* Scope.make()
    const ended = yield* Deferred.make<ExitCode>()
    return yield* untilStopped({
      start: Layer.buildWithScope(app, appScope).pipe(
        Effect.andThen(Deferred.await(ended)),
        Effect.catch(startFailure),
        Effect.catchCause((cause) =>
          Cause.hasInterruptsOnly(cause) ? Effect.failCause(cause) : defectCode(cause)
        ),
      ),
      stop,
      bound: shutdownBound(yield* graceOf(shutdownGrace)),
      close: (main) => Effect.andThen(Fiber.interrupt(main), Scope.close(appScope, Exit.void)),
      // The first worker whose life ends (a job done, `worker.stop()`, a failure) ends the app.
      ended: (error) =>
        Effect.asVoid(Deferred.succeed(
          ended,
          Option.match(error, { onNone: () => 0 as const, onSome: consumingExitCode }),
        )),
    })
  }))
