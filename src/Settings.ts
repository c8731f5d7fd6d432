/**
 * The worker's settings: every variable of the spec, read with `Config` from the environment
 * (or given in code), validated as a whole so that one message lists every problem, plus the
 * lease time-budget check. Each variable is a field of `WorkerSettings` and `SettingsOverrides`
 * and one row of `internal/settings/table.ts`, from which the reading and the README's table
 * come.
 *
 * @since 0.1.0
 */
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { readTable, type SettingsDefaults } from "./internal/settings/row.ts"
import { type SettingsOverrides, table, type WorkerSettings } from "./internal/settings/table.ts"
import { SettingsError } from "./WorkerError.ts"

// Written out field by field where the table's rows are, so that a user reads each field's type
// (and its variable), and no type of the table's.
export type { SettingsOverrides, WorkerSettings } from "./internal/settings/table.ts"

/**
 * Where the worker's tasks come from: `memory` runs on the embedded broker, for local trials.
 *
 * @since 0.1.0
 * @category models
 */
export type TransportKind = WorkerSettings["transport"]

/**
 * How the worker runs: a long-lived service, or a job that exits once its tasks are done.
 *
 * @since 0.1.0
 * @category models
 */
export type WorkerMode = WorkerSettings["mode"]

const SettingsService: Context.ServiceClass<
  Settings,
  "@async-task/worker/Settings",
  WorkerSettings
> = Context.Service<Settings, WorkerSettings>()("@async-task/worker/Settings")

/**
 * The worker's settings service.
 *
 * @since 0.1.0
 * @category services
 */
export class Settings extends SettingsService {}

export type { SettingsDefaults } from "./internal/settings/row.ts"

/**
 * The margin the lease time budget keeps between a task's worst case and the consumer timeout.
 *
 * @since 0.1.0
 * @category constants
 */
export const LEASE_MARGIN: Duration.Duration = Duration.seconds(60)

// The checks between fields, after each field's own. A field that failed its own check is
// absent here, so that it is not compared with the others.
const relate = (s: Partial<WorkerSettings>): {
  readonly problems: ReadonlyArray<string>
  readonly settings: Partial<WorkerSettings>
} => {
  const problems: Array<string> = []
  const { retryBackoffBase, retryBackoffMax, taskTimeout, consumerTimeout } = s
  if (s.inQueue !== undefined && s.inQueue === s.outQueue) {
    problems.push("the input and output queues must differ")
  }
  if (
    retryBackoffBase !== undefined && retryBackoffMax !== undefined &&
    Duration.isGreaterThan(retryBackoffBase, retryBackoffMax)
  ) {
    problems.push("retryBackoffBase must not exceed retryBackoffMax")
  }
  if (taskTimeout !== undefined && retryBackoffMax !== undefined && consumerTimeout !== undefined) {
    const worstCase = Duration.sum(Duration.sum(taskTimeout, retryBackoffMax), LEASE_MARGIN)
    if (!Duration.isLessThan(worstCase, consumerTimeout)) {
      problems.push(
        `the task timeout (${Duration.format(taskTimeout)}) + the longest backoff ` +
          `(${Duration.format(retryBackoffMax)}) + 60s must be less than the consumer ` +
          `timeout (${Duration.format(consumerTimeout)}), or the broker takes the ` +
          "task back while it still runs: raise WORKER_CONSUMER_TIMEOUT_S, which the worker " +
          "asks of RabbitMQ 3.12 and later (older brokers: raise consumer_timeout in their " +
          "rabbitmq.conf too)",
      )
    }
  }
  const { deliveryLimit, queueDeliveryLimit } = s
  if (
    deliveryLimit !== undefined && queueDeliveryLimit !== undefined &&
    deliveryLimit > queueDeliveryLimit
  ) {
    problems.push(
      `the delivery limit (WORKER_DELIVERY_LIMIT, ${deliveryLimit}) is above the input queue's ` +
        `own delivery-limit (WORKER_QUEUE_DELIVERY_LIMIT, ${queueDeliveryLimit}; RabbitMQ 4 ` +
        "gives a quorum queue 20): the broker would drop a task that keeps failing before the " +
        "worker concludes it. Lower the worker's limit, or raise the queue's (a policy's " +
        "delivery-limit) and say so in WORKER_QUEUE_DELIVERY_LIMIT",
    )
  }
  // A job takes one delivery at a time, so that it never holds more than it will run.
  return { problems, settings: s.mode === "job" ? { ...s, concurrency: 1 } : s }
}

/**
 * Reads and validates the settings from the ambient `ConfigProvider` (the environment by
 * default: `ConfigProvider.ConfigProvider`, where an empty variable counts as unset), with
 * `overrides` winning over it. Fails with every problem at once.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  defaults: SettingsDefaults,
  overrides: SettingsOverrides = {},
): Effect.Effect<WorkerSettings, SettingsError> =>
  readTable(table, defaults, overrides).pipe(
    Effect.flatMap(({ values, problems }) => {
      const related = relate(values)
      const all = [...problems, ...related.problems]
      return all.length === 0
        // With no problem, every row has its value (`readTable`).
        ? Effect.succeed(related.settings as WorkerSettings)
        : Effect.fail(new SettingsError({ problems: all }))
    }),
  )

/**
 * The settings of a worker, from the environment and `overrides`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (
  defaults: SettingsDefaults,
  overrides?: SettingsOverrides,
): Layer.Layer<Settings, SettingsError> => Layer.effect(Settings, make(defaults, overrides))
