/**
 * The worker's settings: every variable of the spec, read with `Config` from the environment
 * (or given in code), validated as a whole so that one message lists every problem, plus the
 * lease time-budget check.
 *
 * @since 0.1.0
 */
import { hostname as osHostname } from "node:os"
import {
  Config,
  ConfigError,
  Context,
  Duration,
  Effect,
  Either,
  Layer,
  LogLevel,
  Option,
  Redacted,
} from "effect"
import { isNegativeOrNaN } from "./internal/duration.ts"
import { SettingsError } from "./WorkerError.ts"

/**
 * Resolved settings: durations decoded once, every value checked.
 *
 * @since 0.1.0
 * @category models
 */
export interface WorkerSettings {
  /** `IN_QUEUE_NAME`, default `<name>_queue_in`. */
  readonly inQueue: string
  /** `OUT_QUEUE_NAME`, default `<name>_queue_out`. */
  readonly outQueue: string
  /** `WORKER_CONCURRENCY`, default the definition's, else 1: tasks run at once (and prefetch). */
  readonly concurrency: number
  /** `WORKER_DELIVERY_LIMIT`, default 5: the last attempt; later deliveries are abandoned. */
  readonly deliveryLimit: number
  /** `WORKER_RETRY_BACKOFF_BASE_S`, default 1 s. */
  readonly retryBackoffBase: Duration.Duration
  /** `WORKER_RETRY_BACKOFF_MAX_S`, default 60 s: also caps a `RetryableError`'s own delay. */
  readonly retryBackoffMax: Duration.Duration
  /** `WORKER_CONSUMER_TIMEOUT_S`, default 1800 s: the broker's bound on a lease. */
  readonly consumerTimeout: Duration.Duration
  /** `WORKER_SHUTDOWN_GRACE_S`, default 25 s: how long in-flight tasks may finish at shutdown. */
  readonly shutdownGrace: Duration.Duration
  /** `WORKER_SHUTDOWN_HOOKS_TIMEOUT_S`, default 5 s: all shutdown hooks together. */
  readonly shutdownHooksTimeout: Duration.Duration
  /** `WORKER_PROGRESS_MIN_INTERVAL_S`, default 1 s: at most one progress message per task per interval. */
  readonly progressMinInterval: Duration.Duration
  /** `WORKER_MAX_MESSAGE_BYTES`, default 16 MiB: larger messages are poison, unparsed. */
  readonly maxMessageBytes: number
  /** `WORKER_TASK_TIMEOUT_S`, default the definition's `timeout`. */
  readonly taskTimeout: Duration.Duration
  /** `HOSTNAME`, default the host's name: sent in `started`. */
  readonly hostname: string
  /** `HEALTH_CHECK_HOST`, default `0.0.0.0`. */
  readonly healthCheckHost: string
  /** `HEALTH_CHECK_PORT`, default 8083. */
  readonly healthCheckPort: number
  /** `BROKER_URL`: absent means no RabbitMQ configured. Redacted: it holds the password. */
  readonly brokerUrl: Option.Option<Redacted.Redacted<string>>
  /** `WORKER_TRANSPORT`, default `amqp`: `memory` runs on the embedded broker, for local trials. */
  readonly transport: TransportKind
  /** `WORKER_MODE`, default `service`: `job` takes a bounded number of tasks, then exits. */
  readonly mode: WorkerMode
  /** `WORKER_JOB_MAX_TASKS`, default 1: deliveries a job takes (counted on arrival). */
  readonly jobMaxTasks: number
  /** `WORKER_JOB_IDLE_TIMEOUT_S`, default 10 s: a job with nothing in hand this long exits 0. */
  readonly jobIdleTimeout: Duration.Duration
  /** `WORKER_JOB_CONNECT_TIMEOUT_S`, default 30 s: a job that cannot reach the broker this long exits 1. */
  readonly jobConnectTimeout: Duration.Duration
  /** `LOG_LEVEL`, default `info`: `debug`, `info`, `warning`, `error`, `critical` or `none`. */
  readonly logLevel: LogLevel.LogLevel
  /** `WORKER_TASK_OVERRUN_GRACE_S`, default 30 s: a handler running this long past its deadline fails `/health`. */
  readonly taskOverrunGrace: Duration.Duration
  /** `WORKER_PROBE_TIMEOUT_S`, default 3 s: the time a readiness probe has. */
  readonly probeTimeout: Duration.Duration
}

/**
 * Where the worker's tasks come from.
 *
 * @since 0.1.0
 * @category models
 */
export type TransportKind = "amqp" | "memory"

/**
 * How the worker runs: a long-lived service, or a job that exits once its tasks are done.
 *
 * @since 0.1.0
 * @category models
 */
export type WorkerMode = "service" | "job"

/**
 * The worker's settings service.
 *
 * @since 0.1.0
 * @category tags
 */
export class Settings
  extends Context.Tag("@async-task/worker/Settings")<Settings, WorkerSettings>() {}

/**
 * Settings given in code; they win over the environment. Durations are `DurationInput`
 * (a bare number is milliseconds, as everywhere in Effect).
 *
 * @since 0.1.0
 * @category models
 */
export interface SettingsOverrides {
  readonly inQueue?: string | undefined
  readonly outQueue?: string | undefined
  readonly concurrency?: number | undefined
  readonly deliveryLimit?: number | undefined
  readonly retryBackoffBase?: Duration.DurationInput | undefined
  readonly retryBackoffMax?: Duration.DurationInput | undefined
  readonly consumerTimeout?: Duration.DurationInput | undefined
  readonly shutdownGrace?: Duration.DurationInput | undefined
  readonly shutdownHooksTimeout?: Duration.DurationInput | undefined
  readonly progressMinInterval?: Duration.DurationInput | undefined
  readonly maxMessageBytes?: number | undefined
  readonly taskTimeout?: Duration.DurationInput | undefined
  readonly hostname?: string | undefined
  readonly healthCheckHost?: string | undefined
  readonly healthCheckPort?: number | undefined
  readonly brokerUrl?: string | Redacted.Redacted<string> | undefined
  readonly transport?: TransportKind | undefined
  readonly mode?: WorkerMode | undefined
  readonly jobMaxTasks?: number | undefined
  readonly jobIdleTimeout?: Duration.DurationInput | undefined
  readonly jobConnectTimeout?: Duration.DurationInput | undefined
  readonly logLevel?: LogLevel.LogLevel | undefined
  readonly taskOverrunGrace?: Duration.DurationInput | undefined
  readonly probeTimeout?: Duration.DurationInput | undefined
}

/**
 * What a worker definition contributes to the defaults.
 *
 * @since 0.1.0
 * @category models
 */
export interface SettingsDefaults {
  readonly name: string
  readonly timeout: Duration.Duration
  readonly concurrency?: number | undefined
}

/**
 * The margin the lease time budget keeps between a task's worst case and the consumer timeout.
 *
 * @since 0.1.0
 * @category constants
 */
export const LEASE_MARGIN = Duration.seconds(60)

const MAX_INT32 = 2 ** 31 - 1

// Python's level names (as the platform's other workers log), and Effect's own where they differ.
const LOG_LEVELS: Readonly<Record<string, LogLevel.LogLevel>> = {
  trace: LogLevel.Trace,
  debug: LogLevel.Debug,
  info: LogLevel.Info,
  warning: LogLevel.Warning,
  warn: LogLevel.Warning,
  error: LogLevel.Error,
  critical: LogLevel.Fatal,
  fatal: LogLevel.Fatal,
  none: LogLevel.None,
}

type Raw<A> = Either.Either<A, string>

const seconds = (key: string, description: string, fallback: number | undefined) => {
  const base = Config.number(key).pipe(Config.withDescription(`${description} (seconds)`))
  const read = fallback === undefined ? base : base.pipe(Config.withDefault(fallback))
  // As milliseconds, not `Duration.seconds(s)`: a Duration turns a negative value into zero, and
  // the validation in `make` must still see the sign.
  return read.pipe(Config.map((s): Duration.DurationInput => s * 1000))
}

const given = <A>(value: A | undefined, config: Config.Config<A>): Config.Config<A> =>
  value === undefined ? config : Config.succeed(value)

const decodeDuration = (name: string, input: Duration.DurationInput): Raw<Duration.Duration> => {
  const decoded = Duration.decodeUnknown(input)
  if (Option.isNone(decoded)) return Either.left(`${name} is not a duration`)
  return Either.right(decoded.value)
}

const flattenConfigError = (error: ConfigError.ConfigError): Array<string> => {
  switch (error._op) {
    case "And":
    case "Or":
      return [...flattenConfigError(error.left), ...flattenConfigError(error.right)]
    case "InvalidData":
    case "MissingData":
    case "SourceUnavailable":
    case "Unsupported":
      return [`${error.path.join(".")}: ${error.message}`]
  }
}

/**
 * Reads and validates the settings from the ambient `ConfigProvider` (the environment by
 * default), with `overrides` winning over it. Fails with every problem at once.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  defaults: SettingsDefaults,
  overrides: SettingsOverrides = {},
): Effect.Effect<WorkerSettings, SettingsError> => {
  const o = overrides
  const fields = {
    inQueue: given(
      o.inQueue,
      Config.string("IN_QUEUE_NAME").pipe(
        Config.withDescription("the input queue"),
        Config.withDefault(`${defaults.name}_queue_in`),
      ),
    ),
    outQueue: given(
      o.outQueue,
      Config.string("OUT_QUEUE_NAME").pipe(
        Config.withDescription("the output queue"),
        Config.withDefault(`${defaults.name}_queue_out`),
      ),
    ),
    concurrency: given(
      o.concurrency,
      Config.integer("WORKER_CONCURRENCY").pipe(
        Config.withDescription("tasks run at once, and the prefetch"),
        Config.withDefault(defaults.concurrency ?? 1),
      ),
    ),
    deliveryLimit: given(
      o.deliveryLimit,
      Config.integer("WORKER_DELIVERY_LIMIT").pipe(
        Config.withDescription("the last attempt of a task"),
        Config.withDefault(5),
      ),
    ),
    retryBackoffBase: given(
      o.retryBackoffBase,
      seconds("WORKER_RETRY_BACKOFF_BASE_S", "first retry backoff", 1),
    ),
    retryBackoffMax: given(
      o.retryBackoffMax,
      seconds("WORKER_RETRY_BACKOFF_MAX_S", "longest retry backoff", 60),
    ),
    consumerTimeout: given(
      o.consumerTimeout,
      seconds("WORKER_CONSUMER_TIMEOUT_S", "the broker's consumer timeout", 1800),
    ),
    shutdownGrace: given(
      o.shutdownGrace,
      seconds("WORKER_SHUTDOWN_GRACE_S", "time for in-flight tasks at shutdown", 25),
    ),
    shutdownHooksTimeout: given(
      o.shutdownHooksTimeout,
      seconds("WORKER_SHUTDOWN_HOOKS_TIMEOUT_S", "time for all shutdown hooks", 5),
    ),
    progressMinInterval: given(
      o.progressMinInterval,
      seconds(
        "WORKER_PROGRESS_MIN_INTERVAL_S",
        "least time between two progress messages of a task",
        1,
      ),
    ),
    maxMessageBytes: given(
      o.maxMessageBytes,
      Config.integer("WORKER_MAX_MESSAGE_BYTES").pipe(
        Config.withDescription("the largest inbound message"),
        Config.withDefault(16 * 1024 * 1024),
      ),
    ),
    taskTimeout: given(
      o.taskTimeout,
      seconds("WORKER_TASK_TIMEOUT_S", "a task's time limit", Duration.toSeconds(defaults.timeout)),
    ),
    hostname: given(
      o.hostname,
      Config.string("HOSTNAME").pipe(
        Config.withDescription("the name sent in started messages"),
        Config.withDefault(osHostname()),
      ),
    ),
    healthCheckHost: given(
      o.healthCheckHost,
      Config.string("HEALTH_CHECK_HOST").pipe(
        Config.withDescription("the probe server's address"),
        Config.withDefault("0.0.0.0"),
      ),
    ),
    healthCheckPort: given(
      o.healthCheckPort,
      Config.integer("HEALTH_CHECK_PORT").pipe(
        Config.withDescription("the probe server's port"),
        Config.withDefault(8083),
      ),
    ),
    brokerUrl: o.brokerUrl === undefined
      ? Config.option(
        Config.redacted("BROKER_URL").pipe(Config.withDescription("the RabbitMQ URL")),
      )
      : Config.succeed(
        Option.some(Redacted.isRedacted(o.brokerUrl) ? o.brokerUrl : Redacted.make(o.brokerUrl)),
      ),
    transport: given(
      o.transport,
      Config.literal("amqp", "memory")("WORKER_TRANSPORT").pipe(
        Config.withDescription("amqp (RabbitMQ at BROKER_URL) or memory (the embedded broker)"),
        Config.withDefault("amqp" as const),
      ),
    ),
    mode: given(
      o.mode,
      Config.literal("service", "job")("WORKER_MODE").pipe(
        Config.withDescription("service, or job (bounded tasks, then exit)"),
        Config.withDefault("service" as const),
      ),
    ),
    jobMaxTasks: given(
      o.jobMaxTasks,
      Config.integer("WORKER_JOB_MAX_TASKS").pipe(
        Config.withDescription("deliveries a job takes"),
        Config.withDefault(1),
      ),
    ),
    jobIdleTimeout: given(
      o.jobIdleTimeout,
      seconds("WORKER_JOB_IDLE_TIMEOUT_S", "idle time after which a job exits", 10),
    ),
    jobConnectTimeout: given(
      o.jobConnectTimeout,
      seconds("WORKER_JOB_CONNECT_TIMEOUT_S", "time a job waits for the broker", 30),
    ),
    logLevel: given(
      o.logLevel,
      Config.string("LOG_LEVEL").pipe(
        Config.withDescription("debug, info, warning, error, critical or none"),
        Config.withDefault("info"),
        Config.mapOrFail((name) => {
          const level = LOG_LEVELS[name.trim().toLowerCase()]
          return level === undefined
            ? Either.left(
              ConfigError.InvalidData(
                ["LOG_LEVEL"],
                `must be debug, info, warning, error, critical or none, got "${name}"`,
              ),
            )
            : Either.right(level)
        }),
      ),
    ),
    taskOverrunGrace: given(
      o.taskOverrunGrace,
      seconds("WORKER_TASK_OVERRUN_GRACE_S", "time past its deadline before /health fails", 30),
    ),
    probeTimeout: given(
      o.probeTimeout,
      seconds("WORKER_PROBE_TIMEOUT_S", "the time a readiness probe has", 3),
    ),
  }
  // Each key is read on its own (with `Config.all`, one value that does not parse would skip the
  // checks below): every parse error is reported together with every out-of-range value.
  return Effect.all(fields, { mode: "either" }).pipe(
    Effect.flatMap((r) => {
      const problems: Array<string> = []
      // A key that did not parse is reported once; its placeholder never leaves this function.
      const parsed = <A>(field: Either.Either<A, ConfigError.ConfigError>, placeholder: A): A => {
        if (Either.isRight(field)) return field.right
        problems.push(...flattenConfigError(field.left))
        return placeholder
      }
      const int = (
        name: string,
        field: Either.Either<number, ConfigError.ConfigError>,
        min: number,
        max = MAX_INT32,
      ): number => {
        if (Either.isLeft(field)) return parsed(field, min)
        const value = field.right
        if (!Number.isInteger(value) || value < min || value > max) {
          problems.push(`${name} must be an integer from ${min} to ${max}, got ${value}`)
        }
        return value
      }
      // A duration with a problem is `undefined`, so that it is not compared with the others.
      const duration = (
        name: string,
        field: Either.Either<Duration.DurationInput, ConfigError.ConfigError>,
        positive: boolean,
      ): Duration.Duration | undefined => {
        if (Either.isLeft(field)) {
          problems.push(...flattenConfigError(field.left))
          return undefined
        }
        const input = field.right
        const d = decodeDuration(name, input)
        if (Either.isLeft(d)) {
          problems.push(d.left)
          return undefined
        }
        const ms = Duration.toMillis(d.right)
        if (isNegativeOrNaN(input) || !Number.isFinite(ms) || (positive && ms === 0)) {
          problems.push(
            `${name} must be a finite duration${positive ? " above zero" : ", not negative"}`,
          )
          return undefined
        }
        return d.right
      }
      const text = (name: string, field: Either.Either<string, ConfigError.ConfigError>) => {
        if (Either.isLeft(field)) return parsed(field, "")
        if (field.right.trim() === "") problems.push(`${name} must not be empty`)
        return field.right
      }
      const inQueue = text("inQueue (IN_QUEUE_NAME)", r.inQueue)
      const outQueue = text("outQueue (OUT_QUEUE_NAME)", r.outQueue)
      if (Either.isRight(r.inQueue) && Either.isRight(r.outQueue) && inQueue === outQueue) {
        problems.push("the input and output queues must differ")
      }
      const concurrency = int("concurrency (WORKER_CONCURRENCY)", r.concurrency, 1)
      const deliveryLimit = int("deliveryLimit (WORKER_DELIVERY_LIMIT)", r.deliveryLimit, 1)
      const maxMessageBytes = int(
        "maxMessageBytes (WORKER_MAX_MESSAGE_BYTES)",
        r.maxMessageBytes,
        1,
      )
      const healthCheckPort = int(
        "healthCheckPort (HEALTH_CHECK_PORT)",
        r.healthCheckPort,
        0,
        65535,
      )
      const hostname = text("hostname (HOSTNAME)", r.hostname)
      const retryBackoffBase = duration(
        "retryBackoffBase (WORKER_RETRY_BACKOFF_BASE_S)",
        r.retryBackoffBase,
        false,
      )
      const retryBackoffMax = duration(
        "retryBackoffMax (WORKER_RETRY_BACKOFF_MAX_S)",
        r.retryBackoffMax,
        false,
      )
      const consumerTimeout = duration(
        "consumerTimeout (WORKER_CONSUMER_TIMEOUT_S)",
        r.consumerTimeout,
        true,
      )
      const shutdownGrace = duration(
        "shutdownGrace (WORKER_SHUTDOWN_GRACE_S)",
        r.shutdownGrace,
        false,
      )
      const shutdownHooksTimeout = duration(
        "shutdownHooksTimeout (WORKER_SHUTDOWN_HOOKS_TIMEOUT_S)",
        r.shutdownHooksTimeout,
        false,
      )
      const progressMinInterval = duration(
        "progressMinInterval (WORKER_PROGRESS_MIN_INTERVAL_S)",
        r.progressMinInterval,
        false,
      )
      const taskTimeout = duration("taskTimeout (WORKER_TASK_TIMEOUT_S)", r.taskTimeout, true)
      const mode = parsed(r.mode, "service")
      const taskOverrunGrace = duration(
        "taskOverrunGrace (WORKER_TASK_OVERRUN_GRACE_S)",
        r.taskOverrunGrace,
        false,
      )
      const probeTimeout = duration("probeTimeout (WORKER_PROBE_TIMEOUT_S)", r.probeTimeout, true)
      const jobMaxTasks = int("jobMaxTasks (WORKER_JOB_MAX_TASKS)", r.jobMaxTasks, 1)
      const jobIdleTimeout = duration(
        "jobIdleTimeout (WORKER_JOB_IDLE_TIMEOUT_S)",
        r.jobIdleTimeout,
        true,
      )
      const jobConnectTimeout = duration(
        "jobConnectTimeout (WORKER_JOB_CONNECT_TIMEOUT_S)",
        r.jobConnectTimeout,
        true,
      )
      if (
        retryBackoffBase !== undefined && retryBackoffMax !== undefined &&
        Duration.greaterThan(retryBackoffBase, retryBackoffMax)
      ) {
        problems.push("retryBackoffBase must not exceed retryBackoffMax")
      }
      if (
        taskTimeout !== undefined && retryBackoffMax !== undefined && consumerTimeout !== undefined
      ) {
        const worstCase = Duration.sum(Duration.sum(taskTimeout, retryBackoffMax), LEASE_MARGIN)
        if (!Duration.lessThan(worstCase, consumerTimeout)) {
          problems.push(
            `the task timeout (${Duration.format(taskTimeout)}) + the longest backoff ` +
              `(${Duration.format(retryBackoffMax)}) + 60s must be less than the consumer ` +
              `timeout (${Duration.format(consumerTimeout)}), or the broker takes the ` +
              "task back while it still runs",
          )
        }
      }
      // Placeholders (`Duration.zero`) only stand where a problem has been listed.
      const settings: WorkerSettings = {
        inQueue,
        outQueue,
        // A job takes one delivery at a time, so that it never holds more than it will run.
        concurrency: mode === "job" ? 1 : concurrency,
        deliveryLimit,
        retryBackoffBase: retryBackoffBase ?? Duration.zero,
        retryBackoffMax: retryBackoffMax ?? Duration.zero,
        consumerTimeout: consumerTimeout ?? Duration.zero,
        shutdownGrace: shutdownGrace ?? Duration.zero,
        shutdownHooksTimeout: shutdownHooksTimeout ?? Duration.zero,
        progressMinInterval: progressMinInterval ?? Duration.zero,
        maxMessageBytes,
        taskTimeout: taskTimeout ?? Duration.zero,
        hostname,
        healthCheckHost: parsed(r.healthCheckHost, ""),
        healthCheckPort,
        brokerUrl: parsed(r.brokerUrl, Option.none()),
        transport: parsed(r.transport, "amqp"),
        mode,
        jobMaxTasks,
        jobIdleTimeout: jobIdleTimeout ?? Duration.zero,
        jobConnectTimeout: jobConnectTimeout ?? Duration.zero,
        logLevel: parsed(r.logLevel, LogLevel.Info),
        taskOverrunGrace: taskOverrunGrace ?? Duration.zero,
        probeTimeout: probeTimeout ?? Duration.zero,
      }
      return problems.length === 0
        ? Effect.succeed(settings)
        : Effect.fail(new SettingsError({ problems }))
    }),
  )
}

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
