/**
 * `/ready`'s evaluation: the components run in parallel, each within the probe timeout, failures
 * shown without leaking their text, and concurrent requests sharing one evaluation.
 */
import type * as Scope from "effect/Scope"
import * as Cause from "effect/Cause"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Result from "effect/Result"
import { timeoutDetached } from "../detach.ts"
import { errorKind } from "../describe.ts"

/**
 * One readiness component: `check` succeeds when the component is ready, with what `/ready`
 * shows of it if anything (the broker's node).
 *
 * @since 0.1.0
 * @category models
 */
export interface ReadinessComponent {
  readonly name: string
  readonly check: Effect.Effect<string | void, unknown>
}

/**
 * One component's state in a `/ready` answer.
 *
 * @since 0.1.0
 * @category models
 */
export type ComponentStatus =
  | { readonly status: "ok"; readonly detail?: string }
  | { readonly status: "error"; readonly message: string }

/**
 * The answer of one readiness evaluation.
 *
 * @since 0.1.0
 * @category models
 */
export interface Readiness {
  readonly ready: boolean
  /** Every component, in the order given. */
  readonly components: Readonly<Record<string, ComponentStatus>>
}

/** The longest `ProbeError` message shown. */
const MAX_MESSAGE_LENGTH = 512

/** See `Probes.describeFailure`. */
export const describeFailure = (cause: Cause.Cause<unknown>): string => {
  const failure = Cause.findErrorOption(cause)
  if (Option.isSome(failure)) return describeError(failure.value)
  const defect = Cause.findDefect(cause)
  if (Result.isSuccess(defect)) return describeError(defect.success)
  return "interrupted"
}

const describeError = (error: unknown): string => {
  if (Predicate.isTagged(error, "ProbeError") && Predicate.hasProperty(error, "message")) {
    const message = String(error.message)
    return message.length > MAX_MESSAGE_LENGTH
      ? `${message.slice(0, MAX_MESSAGE_LENGTH)}…`
      : message
  }
  return errorKind(error)
}

/** See `Probes.evaluateReadiness`. */
export const evaluateReadiness = (
  components: ReadonlyArray<ReadinessComponent>,
  timeout: Duration.Input,
): Effect.Effect<Readiness> => {
  const limit = Duration.fromInputUnsafe(timeout)
  const timedOut: ComponentStatus = {
    status: "error",
    message: `timed out after ${Duration.format(limit)}`,
  }
  return Effect.forEach(
    components,
    (component) =>
      // Not `Effect.timeout*`, which would wait for a check that refuses interruption.
      timeoutDetached(
        Effect.matchCause(component.check, {
          onSuccess: (detail): ComponentStatus =>
            typeof detail === "string" ? { status: "ok", detail } : { status: "ok" },
          onFailure: (cause): ComponentStatus => ({
            status: "error",
            message: describeFailure(cause),
          }),
        }),
        limit,
      ).pipe(
        Effect.map((status) => [component.name, Option.getOrElse(status, () => timedOut)] as const),
      ),
    { concurrency: "unbounded" },
  ).pipe(
    Effect.map((entries) => ({
      ready: entries.every(([, s]) => s.status === "ok"),
      components: Object.fromEntries(entries),
    })),
  )
}

/**
 * Concurrent runs of `evaluation` share one: the first starts it in a fiber of its own, in a
 * `FiberSet` of the scope (so that a client that goes away does not cancel it for the others,
 * and the scope's end interrupts it), the rest join it. Once it has ended, the next run
 * evaluates afresh.
 */
export const shared = (
  evaluation: Effect.Effect<Readiness>,
): Effect.Effect<Effect.Effect<Readiness>, never, Scope.Scope> =>
  Effect.map(FiberSet.makeRuntime<never, Readiness, never>(), (run) => {
    let current: Fiber.Fiber<Readiness> | undefined
    return Effect.suspend(() => {
      if (current !== undefined) return Fiber.join(current)
      const fiber = run(evaluation)
      current = fiber
      // Called at once when the evaluation has already ended.
      fiber.addObserver(() => {
        if (current === fiber) current = undefined
      })
      return Fiber.join(fiber)
    })
  })
