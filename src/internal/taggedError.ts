/**
 * The class `Data.TaggedError(tag)<Fields>` makes, spelled out: JSR's fast check takes a
 * superclass only as a name whose type is written down, never as a call.
 */
import type { Cause, Types } from "effect"

/** The constructor of a tagged error with `Fields`: what `Data.TaggedError(tag)` returns. */
export type TaggedErrorClass<Tag extends string, Fields extends Record<string, any>> = new (
  args: Types.VoidIfEmpty<Readonly<Fields>>,
) => Cause.YieldableError & { readonly _tag: Tag } & Readonly<Fields>
