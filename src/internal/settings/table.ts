/**
 * The settings table: one row per variable of the spec, from which `WorkerSettings`,
 * `SettingsOverrides`, the `Config` that reads the environment and the README's table all
 * come. Adding a setting is adding a row; checks between fields are in `Settings.ts`.
 * The order is the README's, and the order in which problems are listed.
 */
import { hostname } from "node:os"
import { Duration } from "effect"
import type { LogLevel, Option, Redacted } from "effect"
import { urlsProblem } from "../amqp/url.ts"
import { boolean, duration, integer, literal, logLevel, type Row, secret, text } from "./row.ts"

/** Each setting's row: `Row<its value once read, what an override in code may give>`. */
// A type, not an interface: an interface has no index signature, which `Table` asks for.
export type SettingsTable = {
  readonly inQueue: Row<string, string>
  readonly outQueue: Row<string, string>
  readonly concurrency: Row<number, number>
  readonly deliveryLimit: Row<number, number>
  readonly queueDeliveryLimit: Row<number, number>
  readonly retryBackoffBase: Row<Duration.Duration, Duration.Input>
  readonly retryBackoffMax: Row<Duration.Duration, Duration.Input>
  readonly consumerTimeout: Row<Duration.Duration, Duration.Input>
  readonly shutdownGrace: Row<Duration.Duration, Duration.Input>
  readonly shutdownHooksTimeout: Row<Duration.Duration, Duration.Input>
  readonly progressMinInterval: Row<Duration.Duration, Duration.Input>
  readonly maxMessageBytes: Row<number, number>
  readonly maxOutputBytes: Row<number, number>
  readonly taskTimeout: Row<Duration.Duration, Duration.Input>
  readonly hostname: Row<string, string>
  readonly healthCheckHost: Row<string, string>
  readonly healthCheckPort: Row<number, number>
  readonly brokerUrl: Row<
    Option.Option<Redacted.Redacted<string>>,
    string | Redacted.Redacted<string>
  >
  readonly heartbeat: Row<number, number>
  readonly transport: Row<"amqp" | "memory", "amqp" | "memory">
  readonly mode: Row<"service" | "job", "service" | "job">
  readonly jobMaxTasks: Row<number, number>
  readonly jobIdleTimeout: Row<Duration.Duration, Duration.Input>
  readonly jobConnectTimeout: Row<Duration.Duration, Duration.Input>
  readonly logLevel: Row<LogLevel.LogLevel, LogLevel.LogLevel>
  readonly logErrorText: Row<boolean, boolean>
  readonly taskOverrunGrace: Row<Duration.Duration, Duration.Input>
  readonly probeTimeout: Row<Duration.Duration, Duration.Input>
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
