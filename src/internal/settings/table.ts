/**
 * The settings: `WorkerSettings` and `SettingsOverrides` (a field each), and the table, one row
 * per variable of the spec, from which the `Config` that reads the environment and the README's
 * table come. Adding a setting is adding a field to both and a row; checks between fields are in
 * `Settings.ts`.
 * The order is the README's, and the order in which problems are listed.
 */
import { hostname } from "node:os"
import * as Duration from "effect/Duration"
import type * as LogLevel from "effect/LogLevel"
import type * as Option from "effect/Option"
import type * as Redacted from "effect/Redacted"
import { urlsProblem } from "../amqp/url.ts"
import { boolean, duration, integer, literal, logLevel, type Row, secret, text } from "./row.ts"

/**
 * Resolved settings: durations decoded once, every value checked. One field per row of the
 * settings table below (shown in the README), which gives each field's variable, default and
 * meaning.
 *
 * @since 0.1.0
 * @category models
 */
export interface WorkerSettings {
  /** `IN_QUEUE_NAME` */
  readonly inQueue: string
  /** `OUT_QUEUE_NAME` */
  readonly outQueue: string
  /** `WORKER_CONCURRENCY` */
  readonly concurrency: number
  /** `WORKER_DELIVERY_LIMIT` */
  readonly deliveryLimit: number
  /** `WORKER_QUEUE_DELIVERY_LIMIT` */
  readonly queueDeliveryLimit: number
  /** `WORKER_RETRY_BACKOFF_BASE_S` */
  readonly retryBackoffBase: Duration.Duration
  /** `WORKER_RETRY_BACKOFF_MAX_S` */
  readonly retryBackoffMax: Duration.Duration
  /** `WORKER_CONSUMER_TIMEOUT_S` */
  readonly consumerTimeout: Duration.Duration
  /** `WORKER_SHUTDOWN_GRACE_S` */
  readonly shutdownGrace: Duration.Duration
  /** `WORKER_SHUTDOWN_HOOKS_TIMEOUT_S` */
  readonly shutdownHooksTimeout: Duration.Duration
  /** `WORKER_PROGRESS_MIN_INTERVAL_S` */
  readonly progressMinInterval: Duration.Duration
  /** `WORKER_MAX_MESSAGE_BYTES` */
  readonly maxMessageBytes: number
  /** `WORKER_MAX_OUTPUT_BYTES` */
  readonly maxOutputBytes: number
  /** `WORKER_TASK_TIMEOUT_S` */
  readonly taskTimeout: Duration.Duration
  /** `HOSTNAME` */
  readonly hostname: string
  /** `HEALTH_CHECK_HOST` */
  readonly healthCheckHost: string
  /** `HEALTH_CHECK_PORT` */
  readonly healthCheckPort: number
  /** `BROKER_URL` */
  readonly brokerUrl: Option.Option<Redacted.Redacted<string>>
  /** `WORKER_HEARTBEAT_S` */
  readonly heartbeat: number
  /** `WORKER_TRANSPORT` */
  readonly transport: "amqp" | "memory"
  /** `WORKER_MODE` */
  readonly mode: "service" | "job"
  /** `WORKER_JOB_MAX_TASKS` */
  readonly jobMaxTasks: number
  /** `WORKER_JOB_IDLE_TIMEOUT_S` */
  readonly jobIdleTimeout: Duration.Duration
  /** `WORKER_JOB_CONNECT_TIMEOUT_S` */
  readonly jobConnectTimeout: Duration.Duration
  /** `LOG_LEVEL` */
  readonly logLevel: LogLevel.LogLevel
  /** `WORKER_LOG_ERROR_TEXT` */
  readonly logErrorText: boolean
  /** `WORKER_TASK_OVERRUN_GRACE_S` */
  readonly taskOverrunGrace: Duration.Duration
  /** `WORKER_PROBE_TIMEOUT_S` */
  readonly probeTimeout: Duration.Duration
}

/**
 * Settings given in code; they win over the environment. Durations are `Duration.Input`
 * (a bare number is milliseconds, as everywhere in Effect); the log level is Effect's
 * (`"Info"`, `"Warn"`, ...).
 *
 * @since 0.1.0
 * @category models
 */
export interface SettingsOverrides {
  /** `IN_QUEUE_NAME` */
  readonly inQueue?: string | undefined
  /** `OUT_QUEUE_NAME` */
  readonly outQueue?: string | undefined
  /** `WORKER_CONCURRENCY` */
  readonly concurrency?: number | undefined
  /** `WORKER_DELIVERY_LIMIT` */
  readonly deliveryLimit?: number | undefined
  /** `WORKER_QUEUE_DELIVERY_LIMIT` */
  readonly queueDeliveryLimit?: number | undefined
  /** `WORKER_RETRY_BACKOFF_BASE_S` */
  readonly retryBackoffBase?: Duration.Input | undefined
  /** `WORKER_RETRY_BACKOFF_MAX_S` */
  readonly retryBackoffMax?: Duration.Input | undefined
  /** `WORKER_CONSUMER_TIMEOUT_S` */
  readonly consumerTimeout?: Duration.Input | undefined
  /** `WORKER_SHUTDOWN_GRACE_S` */
  readonly shutdownGrace?: Duration.Input | undefined
  /** `WORKER_SHUTDOWN_HOOKS_TIMEOUT_S` */
  readonly shutdownHooksTimeout?: Duration.Input | undefined
  /** `WORKER_PROGRESS_MIN_INTERVAL_S` */
  readonly progressMinInterval?: Duration.Input | undefined
  /** `WORKER_MAX_MESSAGE_BYTES` */
  readonly maxMessageBytes?: number | undefined
  /** `WORKER_MAX_OUTPUT_BYTES` */
  readonly maxOutputBytes?: number | undefined
  /** `WORKER_TASK_TIMEOUT_S` */
  readonly taskTimeout?: Duration.Input | undefined
  /** `HOSTNAME` */
  readonly hostname?: string | undefined
  /** `HEALTH_CHECK_HOST` */
  readonly healthCheckHost?: string | undefined
  /** `HEALTH_CHECK_PORT` */
  readonly healthCheckPort?: number | undefined
  /** `BROKER_URL` */
  readonly brokerUrl?: string | Redacted.Redacted<string> | undefined
  /** `WORKER_HEARTBEAT_S` */
  readonly heartbeat?: number | undefined
  /** `WORKER_TRANSPORT` */
  readonly transport?: "amqp" | "memory" | undefined
  /** `WORKER_MODE` */
  readonly mode?: "service" | "job" | undefined
  /** `WORKER_JOB_MAX_TASKS` */
  readonly jobMaxTasks?: number | undefined
  /** `WORKER_JOB_IDLE_TIMEOUT_S` */
  readonly jobIdleTimeout?: Duration.Input | undefined
  /** `WORKER_JOB_CONNECT_TIMEOUT_S` */
  readonly jobConnectTimeout?: Duration.Input | undefined
  /** `LOG_LEVEL` */
  readonly logLevel?: LogLevel.LogLevel | undefined
  /** `WORKER_LOG_ERROR_TEXT` */
  readonly logErrorText?: boolean | undefined
  /** `WORKER_TASK_OVERRUN_GRACE_S` */
  readonly taskOverrunGrace?: Duration.Input | undefined
  /** `WORKER_PROBE_TIMEOUT_S` */
  readonly probeTimeout?: Duration.Input | undefined
}

/**
 * Each setting's row: `Row<its value once read, what an override in code may give>`, from the
 * two interfaces above, so that a field without its row, or a row without its fields, does not
 * compile.
 */
// A type, not an interface: an interface has no index signature, which `Table` asks for.
export type SettingsTable = {
  readonly [K in keyof WorkerSettings]-?: Row<
    WorkerSettings[K],
    Exclude<SettingsOverrides[K], undefined>
  >
}

/** The rows, by field name. */
export const table: SettingsTable = {
  inQueue: text({
    env: "IN_QUEUE_NAME",
    default: (definition) => `${definition.name}_queue_in`,
    shownDefault: "`<name>_queue_in`",
    allowEmpty: false,
    meaning: "the queue tasks are taken from",
  }),
  outQueue: text({
    env: "OUT_QUEUE_NAME",
    default: (definition) => `${definition.name}_queue_out`,
    shownDefault: "`<name>_queue_out`",
    allowEmpty: false,
    meaning: "the queue results are published to; not the input queue",
  }),
  concurrency: integer({
    env: "WORKER_CONCURRENCY",
    default: (definition) => definition.concurrency ?? 1,
    shownDefault: "the definition's, else 1",
    min: 1,
    meaning: "tasks at once, and the prefetch; 1 in job mode",
  }),
  deliveryLimit: integer({
    env: "WORKER_DELIVERY_LIMIT",
    default: 5,
    min: 1,
    meaning: "the last attempt, then `TASK_ABANDONED_AFTER_REDELIVERIES`",
  }),
  queueDeliveryLimit: integer({
    env: "WORKER_QUEUE_DELIVERY_LIMIT",
    default: 20,
    min: 1,
    meaning: "the input queue's own delivery-limit (RabbitMQ 4's: 20)",
  }),
  retryBackoffBase: duration({
    env: "WORKER_RETRY_BACKOFF_BASE_S",
    default: 1,
    allowZero: true,
    meaning: "the first retry's backoff, doubled for each later one",
  }),
  retryBackoffMax: duration({
    env: "WORKER_RETRY_BACKOFF_MAX_S",
    default: 60,
    allowZero: true,
    meaning: "the longest backoff, a `RetryableError`'s delay included",
  }),
  consumerTimeout: duration({
    env: "WORKER_CONSUMER_TIMEOUT_S",
    default: 1800,
    allowZero: false,
    meaning: "lease asked of the broker; `timeout + backoff max + 60 s` fit",
  }),
  shutdownGrace: duration({
    env: "WORKER_SHUTDOWN_GRACE_S",
    default: 25,
    allowZero: true,
    meaning: "the drain: how long in-flight tasks may finish at shutdown",
  }),
  shutdownHooksTimeout: duration({
    env: "WORKER_SHUTDOWN_HOOKS_TIMEOUT_S",
    default: 5,
    allowZero: true,
    meaning: "all shutdown hooks together",
  }),
  progressMinInterval: duration({
    env: "WORKER_PROGRESS_MIN_INTERVAL_S",
    default: 1,
    allowZero: true,
    meaning: "at most one progress message per task per interval",
  }),
  maxMessageBytes: integer({
    env: "WORKER_MAX_MESSAGE_BYTES",
    default: 16 * 1024 * 1024,
    shownDefault: "16 MiB",
    min: 1,
    meaning: "larger messages are poison, unparsed",
  }),
  maxOutputBytes: integer({
    env: "WORKER_MAX_OUTPUT_BYTES",
    default: 16 * 1024 * 1024,
    shownDefault: "16 MiB",
    // A `failure` (a code, 8 KiB of message, a task id) always fits.
    min: 16 * 1024,
    meaning: "larger: a result fails `OUTPUT_TOO_LARGE`, progress dropped",
  }),
  taskTimeout: duration({
    env: "WORKER_TASK_TIMEOUT_S",
    default: (definition) => Duration.toSeconds(definition.timeout),
    shownDefault: "the definition's",
    allowZero: false,
    meaning: "the handler's time limit",
  }),
  hostname: text({
    env: "HOSTNAME",
    default: () => hostname(),
    shownDefault: "the host's name",
    allowEmpty: false,
    meaning: "sent in `started`",
  }),
  healthCheckHost: text({
    env: "HEALTH_CHECK_HOST",
    default: "0.0.0.0",
    allowEmpty: true,
    meaning: "the probe server's address",
  }),
  healthCheckPort: integer({
    env: "HEALTH_CHECK_PORT",
    default: 8083,
    min: 0,
    max: 65535,
    meaning: "the probe server's port",
  }),
  brokerUrl: secret({
    env: "BROKER_URL",
    meaning: "the RabbitMQ URL, or its nodes' URLs, by commas; redacted",
    check: urlsProblem,
  }),
  heartbeat: integer({
    env: "WORKER_HEARTBEAT_S",
    // RabbitMQ's own default: the broker drops a client silent for two heartbeats, and a 45 s
    // block of the event loop (CPU-bound handler code) must not cost the task a second run.
    default: 60,
    shownDefault: "60 s",
    min: 0,
    max: 600,
    meaning: "AMQP heartbeat (0: none); a dead connection is left within 3",
  }),
  transport: literal({
    env: "WORKER_TRANSPORT",
    values: ["amqp", "memory"],
    default: "amqp",
    meaning: "`amqp` (RabbitMQ, `BROKER_URL`) or `memory` (embedded broker)",
  }),
  mode: literal({
    env: "WORKER_MODE",
    values: ["service", "job"],
    default: "service",
    meaning: "`service`, or `job`: prefetch 1, bounded tasks, then exit",
  }),
  jobMaxTasks: integer({
    env: "WORKER_JOB_MAX_TASKS",
    default: 1,
    min: 1,
    meaning: "deliveries a job takes, counted on arrival",
  }),
  jobIdleTimeout: duration({
    env: "WORKER_JOB_IDLE_TIMEOUT_S",
    default: 10,
    allowZero: false,
    meaning: "a job with nothing in hand this long exits 0",
  }),
  jobConnectTimeout: duration({
    env: "WORKER_JOB_CONNECT_TIMEOUT_S",
    default: 30,
    allowZero: false,
    meaning: "a job that cannot reach the broker this long exits 1",
  }),
  logLevel: logLevel({
    env: "LOG_LEVEL",
    default: "info",
    meaning: "`debug`, `info`, `warning`, `error`, `critical` or `none`",
  }),
  logErrorText: boolean({
    env: "WORKER_LOG_ERROR_TEXT",
    default: true,
    meaning: "`false`: unexpected errors' text and stack stay out of logs",
  }),
  taskOverrunGrace: duration({
    env: "WORKER_TASK_OVERRUN_GRACE_S",
    default: 30,
    allowZero: true,
    meaning: "a handler this long past its deadline fails `/health`",
  }),
  probeTimeout: duration({
    env: "WORKER_PROBE_TIMEOUT_S",
    default: 3,
    allowZero: false,
    meaning: "the time each readiness probe has",
  }),
}
