/**
 * Where a worker is in its life, and why consuming ended if it did not end cleanly: what the
 * life's parts (`life.ts`, `process.ts`, `probes.ts`) move the worker through and read.
 */
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Ref from "effect/Ref"
import type {
  BrokerUnreachable,
  IdleHookError,
  MissingServiceError,
  TasksTakenBack,
  TransportError,
} from "../../WorkerError.ts"

/**
 * Where the worker is in its life; each state says which step moves the worker into it.
 *
 * @since 0.1.0
 * @category models
 */
export type LifecycleState = Data.TaggedEnum<{
  /** From the start: the settings read, the startup hooks running, the transport connecting. */
  // deno-lint-ignore ban-types
  Starting: {}
  /** The program is consuming (its transport connected, or still connecting or reconnecting). */
  // deno-lint-ignore ban-types
  Running: {}
  /**
   * Intake has stopped and the tasks in hand are finishing: the shutdown has begun (a signal,
   * the scope closing, `worker.stop()`), or a job has taken its last task. No longer ready.
   */
  // deno-lint-ignore ban-types
  Draining: {}
  /**
   * Consuming ended with `error` (the transport failing for good, the `onIdle` hook failing, a
   * job's broker out of reach, a job's tasks taken back unsettled); the shutdown follows.
   */
  Failed: { readonly error: ConsumingError }
}>

/**
 * Constructors and matchers for {@link LifecycleState}.
 *
 * @since 0.1.0
 * @category models
 */
export const LifecycleState: Data.TaggedEnum.Constructor<LifecycleState> = Data.taggedEnum<
  LifecycleState
>()

/**
 * Why consuming ended other than cleanly, once the worker had started.
 *
 * @since 0.2.0
 * @category models
 */
export type ConsumingError =
  | TransportError
  | IdleHookError
  | BrokerUnreachable
  | MissingServiceError
  | TasksTakenBack

/**
 * Moves a life to `next`: every change of its state after `Starting` goes through here, and is
 * logged at DEBUG. `Failed` is final, as it says why the shutdown came (the drain that follows it
 * keeps it), and a state entered already is not entered again.
 */
export const moveTo = (
  state: Ref.Ref<LifecycleState>,
  next: LifecycleState,
): Effect.Effect<void> =>
  Effect.flatMap(
    Ref.modify(state, (current): [LifecycleState | undefined, LifecycleState] =>
      current._tag === "Failed" || current._tag === next._tag
        ? [undefined, current]
        : [current, next]),
    (from) =>
      from === undefined
        ? Effect.void
        : Effect.logDebug(`The worker's state: ${from._tag} → ${next._tag}`),
  )
