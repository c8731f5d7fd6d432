import * as Effect from "effect/Effect"

/**
 * A startup or shutdown hook, or a readiness probe: an Effect (which may require the handler's
 * services), or a function, possibly `async`, given an `AbortSignal` that fires when its time
 * is up or the worker stops. Public as `Worker.Hook`.
 *
 * @since 0.1.0
 * @category models
 */
export type Hook<R> =
  | Effect.Effect<unknown, unknown, R>
  | ((signal: AbortSignal) => PromiseLike<unknown> | unknown)

/** Whether `u` can be run as a {@link Hook}. */
export const isHook = (u: unknown): boolean => Effect.isEffect(u) || typeof u === "function"

/**
 * The hook as an Effect: interrupting it fires the signal given to a function hook. A defect (an
 * exception thrown inside an Effect hook) is a failure like any other: one hook's bug must not
 * skip the hooks after it, nor the shutdown.
 */
export const toEffect = <R>(hook: Hook<R>): Effect.Effect<void, unknown, R> =>
  Effect.isEffect(hook)
    ? Effect.asVoid(hook).pipe(Effect.catchDefect(Effect.fail))
    : Effect.tryPromise({ try: async (signal) => void (await hook(signal)), catch: (e) => e })
