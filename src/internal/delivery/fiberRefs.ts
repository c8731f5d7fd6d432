/**
 * A delivery's log annotations and handler context, set on its fiber in one step. Every task
 * sets both; `FiberRefs.updateManyAs` would, but it first compares each new value with the one
 * it replaces (two HashMaps and two Contexts compared structurally), a cost `bench/engine.ts`
 * shows on every no-op delivery, when a new task's values always differ. The result is pinned to
 * what `Effect.locally` gives by `test/internal/delivery/fiberRefs.test.ts`.
 */
import { type Context, Equal, type FiberId, FiberRef, FiberRefs, type HashMap } from "effect"

/** Makes `value` the fiber's own value of `ref`: the head of its stack of values. */
const setOwn = (
  locals: FiberRefs.FiberRefs["locals"],
  id: FiberId.Runtime,
  ref: FiberRef.FiberRef<any>,
  value: unknown,
): void => {
  const stack = locals.get(ref)
  if (stack === undefined) return void locals.set(ref, [[id, value]])
  const own = stack[0][0] === id || Equal.equals(stack[0][0], id)
  locals.set(ref, own ? [[id, value], ...stack.slice(1)] : [[id, value], ...stack])
}

/** `refs` with the log annotations and the context of the fiber `id` replaced. */
export const withTaskRefs = (
  refs: FiberRefs.FiberRefs,
  id: FiberId.Runtime,
  annotations: HashMap.HashMap<string, unknown>,
  context: Context.Context<any>,
): FiberRefs.FiberRefs => {
  const locals = new Map(refs.locals)
  setOwn(locals, id, FiberRef.currentLogAnnotations, annotations)
  setOwn(locals, id, FiberRef.currentContext, context)
  return FiberRefs.unsafeMake(locals)
}

/** `refs` with the context of the fiber `id` replaced: a traced handler's, with its span. */
export const withContext = (
  refs: FiberRefs.FiberRefs,
  id: FiberId.Runtime,
  context: Context.Context<any>,
): FiberRefs.FiberRefs => {
  const locals = new Map(refs.locals)
  setOwn(locals, id, FiberRef.currentContext, context)
  return FiberRefs.unsafeMake(locals)
}
