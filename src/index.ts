/**
 * @since 0.1.0
 */

/** @since 0.1.0 */
export * as AmqpTransport from "./AmqpTransport.ts"
/** @since 0.1.0 */
export * as Concurrency from "./Concurrency.ts"
/** @since 0.1.0 */
export * as Decision from "./Decision.ts"
/** @since 0.1.0 */
export * as DeliveryEngine from "./DeliveryEngine.ts"
/** @since 0.1.0 */
export * as Drain from "./Drain.ts"
/** @since 0.3.0 */
export * as EventLoop from "./EventLoop.ts"
/** @since 0.1.0 */
export * as JobMode from "./JobMode.ts"
/** @since 0.1.0 */
export * as LeaseRenewal from "./LeaseRenewal.ts"
/** @since 0.1.0 */
export * as Lifecycle from "./Lifecycle.ts"
/** @since 0.1.0 */
export * as MemoryBroker from "./MemoryBroker.ts"
/** @since 0.1.0 */
export * as Process from "./Process.ts"
/** @since 0.1.0 */
export * as Probes from "./Probes.ts"
/** @since 0.1.0 */
export * as ProgressThrottle from "./ProgressThrottle.ts"
/** @since 0.1.0 */
export * as Prometheus from "./Prometheus.ts"
/** @since 0.1.0 */
export * as Protocol from "./Protocol.ts"
/** @since 0.1.0 */
export * as RuntimeMetrics from "./RuntimeMetrics.ts"
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
export * as WorkerLogger from "./WorkerLogger.ts"
/** @since 0.1.0 */
export * as WorkerMetrics from "./WorkerMetrics.ts"
/** @since 0.1.0 */
export * as WorkerProgram from "./WorkerProgram.ts"
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
