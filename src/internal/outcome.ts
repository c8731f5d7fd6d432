// A delivery's outcome, in a module of its own: the decision line reports it and the metrics count
// each, and `Decision` counts through `WorkerMetrics`, so that `Decision.ts` holding it would make
// the two modules import each other.

/**
 * What became of the task.
 *
 * @since 0.1.0
 * @category models
 */
export type Outcome =
  | "success"
  | "failure"
  | "poison"
  | "retry"
  | "publish_failed"
  | "shutdown_requeued"
  | "cancelled"
  | "engine_error"
