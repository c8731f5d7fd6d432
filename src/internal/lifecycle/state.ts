/**
 * The constructors of `Lifecycle.LifecycleState` for the life's parts (`life.ts`, `process.ts`):
 * made from its type alone, so that they need no value of the module that imports them.
 */
import { Data } from "effect"
import type { LifecycleState } from "../../Lifecycle.ts"

export const LifeState = Data.taggedEnum<LifecycleState>()
