/**
 * The worker's API: the namespaces the README, the docs and the examples name, and every error a
 * worker fails or throws with. The test harness (`@async-task/worker/testing`), the wire codec
 * (`@async-task/worker/protocol`) and the conformance kit (`@async-task/worker/conformance`) are
 * entry points of their own; the SDK's other modules are its own.
 *
 * @since 0.1.0
 */

/** @since 0.1.0 */
export * as Concurrency from "./Concurrency.ts"
/** @since 0.1.0 */
export * as MemoryBroker from "./MemoryBroker.ts"
/** @since 0.1.0 */
export * as Probes from "./Probes.ts"
/** @since 0.1.0 */
export * as Protocol from "./Protocol.ts"
/** @since 0.1.0 */
export * as Settings from "./Settings.ts"
/** @since 0.1.0 */
export * as TaskContext from "./TaskContext.ts"
/** @since 0.3.0 */
export * as Thread from "./Thread.ts"
/** @since 0.3.0 */
export * as Transient from "./Transient.ts"
/** @since 0.1.0 */
export * as Transport from "./Transport.ts"
/** @since 0.1.0 */
export * as Worker from "./Worker.ts"
/** @since 0.1.0 */
export {
  BrokerUnreachable,
  ConcurrencyError,
  FatalError,
  IdleHookError,
  LeaseLost,
  MessageEncodeError,
  ProbeError,
  ProbeServerError,
  PublishError,
  RetryableError,
  SettingsError,
  TransportError,
  WorkerDefinitionError,
} from "./WorkerError.ts"
/** @since 0.3.0 */
export {
  MissingServiceError,
  ServicesError,
  StartupHookError,
  TasksTakenBack,
} from "./WorkerError.ts"
