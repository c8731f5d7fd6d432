/**
 * A delivery's context on the fiber that runs it. In Effect 4 a fiber has one Context: its
 * services, its log annotations and every runtime reference besides (loggers, log level, clock,
 * tracer, scheduler, metric registry). A delivery sets its annotations, its task's scope and,
 * traced, its span there in one step, on the context its fiber started with, with the handler's
 * services merged beneath it: merged, not replacing it, as the handler's services lack what the
 * fiber runs with. `Effect.provideService` and `Effect.annotateLogs` would each be one more step
 * of every delivery, and a restore at its end (`bench/engine.ts` counts a no-op delivery's
 * steps), where the delivery's values need only hold until the fiber's next delivery. The result
 * is pinned to what they give by `test/internal/delivery/fiberContext.test.ts`.
 */
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Fiber from "effect/Fiber"
import * as References from "effect/References"
import * as Scope from "effect/Scope"
import * as Tracer from "effect/Tracer"
import type { DeliveryFiber, Restore } from "./context.ts"

/**
 * What the deliveries of a fiber that starts with `context` start from: that context, with
 * `handlerContext` beneath. The fiber's own values win where both have one: a fiber forked for
 * one delivery (`take.ts`, `DeliveryHandle`) runs with its caller's clock and loggers, not those
 * of when the engine was made. Made once per engine, whose fibers all start with its context.
 */
export const deliveryBase = <R>(
  context: Context.Context<never>,
  handlerContext: Context.Context<R>,
): Context.Context<never> => Context.merge(handlerContext, context) as Context.Context<never>

/**
 * Sets the context of a delivery on its fiber, which must be the one running this call: the
 * fiber's base with the delivery's log annotations and, when given, its task's scope and the
 * parent of its spans. Every earlier delivery's values are gone.
 */
export const enterDelivery = (
  df: DeliveryFiber,
  annotations: Readonly<Record<string, unknown>>,
  scope: Scope.Scope | undefined,
  span: Tracer.AnySpan | undefined,
): void => {
  let context = Context.add(df.base, References.CurrentLogAnnotations, annotations)
  if (scope !== undefined) context = Context.add(context, Scope.Scope, scope)
  if (span !== undefined) context = Context.add(context, Tracer.ParentSpan, span)
  df.fiber.setContext(context)
}

/** Makes `span` the parent of what the fiber, the one running this call, traces from now on. */
export const enterSpan = (fiber: Fiber.Fiber<unknown, unknown>, span: Tracer.AnySpan): void =>
  fiber.setContext(Context.add(fiber.context, Tracer.ParentSpan, span))

/**
 * Whether something other than the engine itself interrupted the delivery's fiber (a shutdown,
 * the caller of `handle`), at any time until now: the engine stops a handler by interrupting the
 * fiber as itself, and a handler that interrupts itself (`Effect.interrupt`) leaves the fiber
 * uninterrupted. Effect 4 keeps a fiber's interruptions to itself, but an interrupted fiber stays
 * interrupted and `restore` raises every interruption it got, with who sent it; an interruption
 * without a sender (`interruptUnsafe()`) is from outside too.
 */
export const interruptedFromOutside = (
  df: DeliveryFiber,
  restore: Restore,
): Effect.Effect<boolean> =>
  Effect.map(Effect.exit(restore(Effect.void)), (exit) => {
    if (Exit.isSuccess(exit)) return false
    const self = df.fiber.id
    return exit.cause.reasons.some((reason) =>
      Cause.isInterruptReason(reason) && reason.fiberId !== self
    )
  })
