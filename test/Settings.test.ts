import { describe, expect, expectTypeOf, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, type LogLevel, Option, Redacted } from "effect"
import { hostname as osHostname } from "node:os"
import { inspect } from "node:util"
import * as Settings from "../src/Settings.ts"
import { SettingsError } from "../src/WorkerError.ts"

const definition: Settings.SettingsDefaults = { name: "count-words", timeout: Duration.minutes(5) }

// The environment is simulated with a ConfigProvider: process.env is never read or written.
const load = (
  env: Record<string, string> = {},
  overrides?: Settings.SettingsOverrides,
  defaults: Settings.SettingsDefaults = definition,
) =>
  Settings.make(defaults, overrides).pipe(
    Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env })),
  )

const loadError = (
  env: Record<string, string> = {},
  overrides?: Settings.SettingsOverrides,
  defaults?: Settings.SettingsDefaults,
) => Effect.flip(load(env, overrides, defaults))

const millis = Duration.toMillis

const PASSWORD = "s3cr3t-Pa55w0rd"
const BROKER_URL = `amqp://worker:${PASSWORD}@rabbit.internal:5672/tasks`

describe("Settings", () => {
  describe("defaults", () => {
    it.effect("follow the spec and the worker definition", () =>
      Effect.gen(function* () {
        const s = yield* load()
        expect(s.inQueue).toBe("count-words_queue_in")
        expect(s.outQueue).toBe("count-words_queue_out")
        expect(s.concurrency).toBe(1)
        expect(s.deliveryLimit).toBe(5)
        expect(millis(s.retryBackoffBase)).toBe(1_000)
        expect(millis(s.retryBackoffMax)).toBe(60_000)
        expect(millis(s.consumerTimeout)).toBe(1_800_000)
        expect(millis(s.shutdownGrace)).toBe(25_000)
        expect(millis(s.shutdownHooksTimeout)).toBe(5_000)
        expect(millis(s.progressMinInterval)).toBe(1_000)
        expect(s.maxMessageBytes).toBe(16 * 1024 * 1024)
        expect(millis(s.taskTimeout)).toBe(300_000)
        expect(s.healthCheckHost).toBe("0.0.0.0")
        expect(s.healthCheckPort).toBe(8083)
        expect(s.hostname).toBe(osHostname())
        expect(s.hostname.length).toBeGreaterThan(0)
        expect(Option.isNone(s.brokerUrl)).toBe(true)
      }))

    it.effect("take the definition's concurrency", () =>
      Effect.gen(function* () {
        const s = yield* load({}, undefined, { ...definition, concurrency: 3 })
        expect(s.concurrency).toBe(3)
      }))
  })

  describe("environment", () => {
    it.effect("is read for every key", () =>
      Effect.gen(function* () {
        const s = yield* load({
          IN_QUEUE_NAME: "in-q",
          OUT_QUEUE_NAME: "out-q",
          WORKER_CONCURRENCY: "4",
          WORKER_DELIVERY_LIMIT: "7",
          WORKER_RETRY_BACKOFF_BASE_S: "0.5",
          WORKER_RETRY_BACKOFF_MAX_S: "30",
          WORKER_CONSUMER_TIMEOUT_S: "3600",
          WORKER_SHUTDOWN_GRACE_S: "10",
          WORKER_SHUTDOWN_HOOKS_TIMEOUT_S: "2",
          WORKER_PROGRESS_MIN_INTERVAL_S: "0.25",
          WORKER_MAX_MESSAGE_BYTES: "1048576",
          WORKER_TASK_TIMEOUT_S: "120",
          HOSTNAME: "pod-a",
          HEALTH_CHECK_HOST: "127.0.0.1",
          HEALTH_CHECK_PORT: "9000",
        })
        expect(s.inQueue).toBe("in-q")
        expect(s.outQueue).toBe("out-q")
        expect(s.concurrency).toBe(4)
        expect(s.deliveryLimit).toBe(7)
        expect(millis(s.retryBackoffBase)).toBe(500)
        expect(millis(s.retryBackoffMax)).toBe(30_000)
        expect(millis(s.consumerTimeout)).toBe(3_600_000)
        expect(millis(s.shutdownGrace)).toBe(10_000)
        expect(millis(s.shutdownHooksTimeout)).toBe(2_000)
        expect(millis(s.progressMinInterval)).toBe(250)
        expect(s.maxMessageBytes).toBe(1_048_576)
        expect(millis(s.taskTimeout)).toBe(120_000)
        expect(s.hostname).toBe("pod-a")
        expect(s.healthCheckHost).toBe("127.0.0.1")
        expect(s.healthCheckPort).toBe(9000)
      }))

    it.effect("wins over the definition's concurrency", () =>
      Effect.gen(function* () {
        const s = yield* load({ WORKER_CONCURRENCY: "4" }, undefined, {
          ...definition,
          concurrency: 3,
        })
        expect(s.concurrency).toBe(4)
      }))

    it.effect("accepts a zero shutdown grace", () =>
      Effect.gen(function* () {
        const s = yield* load({ WORKER_SHUTDOWN_GRACE_S: "0" })
        expect(millis(s.shutdownGrace)).toBe(0)
      }))
  })

  describe("overrides", () => {
    it.effect("win over the environment", () =>
      Effect.gen(function* () {
        const s = yield* load(
          {
            WORKER_CONCURRENCY: "4",
            WORKER_SHUTDOWN_GRACE_S: "10",
            IN_QUEUE_NAME: "env-in",
            HOSTNAME: "env-host",
            BROKER_URL: "amqp://env:env@env-host/",
          },
          {
            concurrency: 2,
            shutdownGrace: "3 seconds",
            inQueue: "code-in",
            hostname: "code-host",
            brokerUrl: BROKER_URL,
          },
        )
        expect(s.concurrency).toBe(2)
        expect(millis(s.shutdownGrace)).toBe(3_000)
        expect(s.inQueue).toBe("code-in")
        expect(s.hostname).toBe("code-host")
        expect(Option.map(s.brokerUrl, Redacted.value)).toEqual(Option.some(BROKER_URL))
      }))

    it.effect("take a bare number as milliseconds", () =>
      Effect.gen(function* () {
        const s = yield* load({}, { retryBackoffBase: 250, retryBackoffMax: Duration.seconds(2) })
        expect(millis(s.retryBackoffBase)).toBe(250)
        expect(millis(s.retryBackoffMax)).toBe(2_000)
      }))

    it.effect("mean the environment is not consulted for that key", () =>
      Effect.gen(function* () {
        const s = yield* load({ WORKER_CONCURRENCY: "lots" }, { concurrency: 2 })
        expect(s.concurrency).toBe(2)
      }))

    it.effect("are validated like the environment", () =>
      Effect.gen(function* () {
        const error = yield* loadError({}, { concurrency: 1.5, shutdownGrace: -1 })
        expect(error.problems).toHaveLength(2)
        expect(error.problems[0]).toContain("concurrency")
        expect(error.problems[1]).toContain("shutdownGrace")
      }))
  })

  describe("BROKER_URL", () => {
    it.effect("is read as a Redacted value", () =>
      Effect.gen(function* () {
        const s = yield* load({ BROKER_URL })
        expect(Option.isSome(s.brokerUrl)).toBe(true)
        if (Option.isSome(s.brokerUrl)) {
          expect(Redacted.isRedacted(s.brokerUrl.value)).toBe(true)
          expect(Redacted.value(s.brokerUrl.value)).toBe(BROKER_URL)
        }
      }))

    it.effect("never shows its password when printed or serialized", () =>
      Effect.gen(function* () {
        const s = yield* load({ BROKER_URL })
        const renderings = [
          String(s),
          JSON.stringify(s),
          inspect(s, { depth: 10 }),
          String(s.brokerUrl),
          JSON.stringify(s.brokerUrl),
          inspect(s.brokerUrl, { depth: 10 }),
        ]
        if (Option.isSome(s.brokerUrl)) {
          renderings.push(String(s.brokerUrl.value), JSON.stringify(s.brokerUrl.value))
        }
        for (const rendering of renderings) expect(rendering).not.toContain(PASSWORD)
        expect(JSON.stringify(s)).toContain("<redacted>")
      }))

    it.effect("never shows its password in a settings error", () =>
      Effect.gen(function* () {
        const environments: ReadonlyArray<Record<string, string>> = [{ BROKER_URL }, {}]
        for (const brokerUrl of environments) {
          const error = yield* loadError(
            { ...brokerUrl, WORKER_CONCURRENCY: "0", WORKER_TASK_TIMEOUT_S: "1800" },
            brokerUrl.BROKER_URL === undefined ? { brokerUrl: BROKER_URL } : undefined,
          )
          expect(error.problems.length).toBeGreaterThan(0)
          for (const rendering of [error.message, String(error), JSON.stringify(error)]) {
            expect(rendering).not.toContain(PASSWORD)
          }
        }
      }))
  })

  describe("BROKER_URL that cannot work", () => {
    it.effect("is invalid settings naming BROKER_URL, listed with the other problems", () =>
      Effect.gen(function* () {
        const error = yield* loadError({ BROKER_URL: "not-a-url", WORKER_CONCURRENCY: "0" })
        expect(error.problems).toHaveLength(2)
        expect(error.problems[0]).toContain("concurrency (WORKER_CONCURRENCY)")
        expect(error.problems[1]).toBe(
          "brokerUrl (BROKER_URL) does not parse: expected amqp://user:password@host:5672/vhost, with the user, password and vhost percent-encoded and a port from 1 to 65535",
        )
      }))

    it.effect("says what is wrong without showing the password", () =>
      Effect.gen(function* () {
        const cases: ReadonlyArray<readonly [string, string]> = [
          [`http://worker:${PASSWORD}@rabbit.internal/tasks`, "must be an amqp: or amqps: URL"],
          [`amqp://worker:${PASSWORD}@rabbit.internal:0/tasks`, "has port 0"],
          [`amqp://worker:${PASSWORD}@rabbit.internal:99999/tasks`, "does not parse"],
          [`amqp://worker:1/${PASSWORD}@rabbit.internal/tasks`, "has an @ after its host"],
          [
            `amqp://worker:${PASSWORD}@rabbit.internal/100%`,
            "has a vhost that is not percent-encoded",
          ],
        ]
        for (const [url, problem] of cases) {
          const error = yield* loadError({ BROKER_URL: url })
          expect(error.problems, url).toHaveLength(1)
          expect(error.problems[0]).toContain(`brokerUrl (BROKER_URL) ${problem}`)
          for (const rendering of [error.message, String(error), JSON.stringify(error)]) {
            expect(rendering).not.toContain(PASSWORD)
          }
        }
      }))

    it.effect("a cluster's list: each address checked, the wrong one named by its place", () =>
      Effect.gen(function* () {
        const list = `${BROKER_URL}, amqp://worker:${PASSWORD}@rabbit-2.internal/tasks`
        const s = yield* load({ BROKER_URL: list })
        expect(Option.map(s.brokerUrl, Redacted.value)).toEqual(Option.some(list))
        const error = yield* loadError({ BROKER_URL: `${BROKER_URL},amqp://worker:${PASSWORD}@` })
        expect(error.problems).toHaveLength(1)
        expect(error.problems[0]).toMatch(
          /^brokerUrl \(BROKER_URL\) \(address 2 of 2, separated by commas\) does not parse/,
        )
        expect(error.message).not.toContain(PASSWORD)
      }))

    it.effect("a heartbeat is whole seconds from 0 (none) to 600, 60 by default", () =>
      Effect.gen(function* () {
        expect((yield* load({})).heartbeat).toBe(60)
        expect((yield* load({ WORKER_HEARTBEAT_S: "0" })).heartbeat).toBe(0)
        const error = yield* loadError({ WORKER_HEARTBEAT_S: "2.5" })
        expect(error.problems.join("\n")).toContain("WORKER_HEARTBEAT_S: Expected an integer")
      }))

    it.effect("is checked when code gives it too, as a string or Redacted", () =>
      Effect.gen(function* () {
        for (const brokerUrl of ["amqp:///tasks", Redacted.make("amqp:///tasks")]) {
          const error = yield* loadError({}, { brokerUrl })
          expect(error.problems).toEqual([
            "brokerUrl (BROKER_URL) has no host (expected amqp://user:password@host:5672/vhost)",
          ])
        }
      }))
  })

  describe("validation", () => {
    it.effect("lists every problem at once, parse errors and range errors together", () =>
      Effect.gen(function* () {
        const error = yield* loadError({
          WORKER_CONCURRENCY: "many",
          WORKER_DELIVERY_LIMIT: "0",
          WORKER_SHUTDOWN_GRACE_S: "-1",
          WORKER_PROGRESS_MIN_INTERVAL_S: "soon",
          WORKER_MAX_MESSAGE_BYTES: "1.5",
          HEALTH_CHECK_PORT: "70000",
          WORKER_CONSUMER_TIMEOUT_S: "0",
        })
        expect(error).toBeInstanceOf(SettingsError)
        expect(error._tag).toBe("SettingsError")
        const expected = [
          "WORKER_CONCURRENCY",
          "WORKER_DELIVERY_LIMIT",
          "WORKER_SHUTDOWN_GRACE_S",
          "WORKER_PROGRESS_MIN_INTERVAL_S",
          "WORKER_MAX_MESSAGE_BYTES",
          "HEALTH_CHECK_PORT",
          "WORKER_CONSUMER_TIMEOUT_S",
        ]
        expect(error.problems).toHaveLength(expected.length)
        for (const key of expected) {
          expect(error.problems.filter((problem) => problem.includes(key))).toHaveLength(1)
          expect(error.message).toContain(key)
        }
        expect(error.message.startsWith("Invalid worker settings: ")).toBe(true)
      }))

    it.effect("says what is wrong with each variable, in the words it always had", () =>
      Effect.gen(function* () {
        const error = yield* loadError({
          WORKER_CONCURRENCY: "many",
          WORKER_DELIVERY_LIMIT: "0",
          WORKER_SHUTDOWN_GRACE_S: "-1",
          WORKER_PROGRESS_MIN_INTERVAL_S: "soon",
          HOSTNAME: "  ",
          WORKER_TRANSPORT: "kafka",
          WORKER_JOB_MAX_TASKS: "1.5",
          WORKER_JOB_IDLE_TIMEOUT_S: "0",
          LOG_LEVEL: "loud",
          WORKER_LOG_ERROR_TEXT: "y",
        })
        expect(error.problems).toEqual([
          'WORKER_CONCURRENCY: Expected an integer value but received "many"',
          "deliveryLimit (WORKER_DELIVERY_LIMIT) must be an integer from 1 to 2147483647, got 0",
          "shutdownGrace (WORKER_SHUTDOWN_GRACE_S) must be a finite duration, not negative",
          'WORKER_PROGRESS_MIN_INTERVAL_S: Expected a number value but received "soon"',
          "hostname (HOSTNAME) must not be empty",
          'WORKER_TRANSPORT: Expected one of (amqp, memory) but received "kafka"',
          'WORKER_JOB_MAX_TASKS: Expected an integer value but received "1.5"',
          "jobIdleTimeout (WORKER_JOB_IDLE_TIMEOUT_S) must be a finite duration above zero",
          'LOG_LEVEL: must be debug, info, warning, error, critical or none, got "loud"',
          'WORKER_LOG_ERROR_TEXT: Expected a boolean value but received "y"',
        ])
      }))

    it.effect("refuses a duration in code that names none", () =>
      Effect.gen(function* () {
        const error = yield* loadError({}, {
          shutdownGrace: {},
          taskTimeout: "soon" as Duration.Input,
        })
        expect(error.problems).toEqual([
          "shutdownGrace (WORKER_SHUTDOWN_GRACE_S) is not a duration",
          "taskTimeout (WORKER_TASK_TIMEOUT_S) is not a duration",
        ])
      }))

    it.effect("lists several parse errors", () =>
      Effect.gen(function* () {
        const error = yield* loadError({ WORKER_CONCURRENCY: "x", WORKER_TASK_TIMEOUT_S: "y" })
        expect(error.problems).toHaveLength(2)
        expect(error.problems[0]).toContain("WORKER_CONCURRENCY")
        expect(error.problems[1]).toContain("WORKER_TASK_TIMEOUT_S")
      }))

    it.effect.each([
      "WORKER_RETRY_BACKOFF_BASE_S",
      "WORKER_RETRY_BACKOFF_MAX_S",
      "WORKER_SHUTDOWN_GRACE_S",
      "WORKER_SHUTDOWN_HOOKS_TIMEOUT_S",
      "WORKER_PROGRESS_MIN_INTERVAL_S",
      "WORKER_CONSUMER_TIMEOUT_S",
      "WORKER_TASK_TIMEOUT_S",
    ])("refuses a negative %s (not silently zero)", (key) =>
      Effect.gen(function* () {
        const error = yield* loadError({ [key]: "-5" })
        expect(error.problems).toHaveLength(1)
        expect(error.problems[0]).toContain(key)
      }))

    it.effect("refuses zero and infinite timeouts", () =>
      Effect.gen(function* () {
        const error = yield* loadError({
          WORKER_CONSUMER_TIMEOUT_S: "Infinity",
          WORKER_TASK_TIMEOUT_S: "0",
        })
        expect(error.problems).toHaveLength(2)
        expect(error.problems[0]).toContain("WORKER_CONSUMER_TIMEOUT_S")
        expect(error.problems[1]).toContain("WORKER_TASK_TIMEOUT_S")
      }))

    it.effect("refuses the same queue for input and output", () =>
      Effect.gen(function* () {
        const error = yield* loadError({ IN_QUEUE_NAME: "q", OUT_QUEUE_NAME: "q" })
        expect(error.problems).toEqual(["the input and output queues must differ"])
      }))

    it.effect("refuses a delivery limit above the queue's own (RabbitMQ 4: 20), unless told the queue's is higher", () =>
      Effect.gen(function* () {
        const error = yield* loadError({ WORKER_DELIVERY_LIMIT: "25" })
        expect(error.problems).toHaveLength(1)
        expect(error.problems[0]).toContain("WORKER_DELIVERY_LIMIT, 25")
        expect(error.problems[0]).toContain("WORKER_QUEUE_DELIVERY_LIMIT, 20")
        expect((yield* load({ WORKER_DELIVERY_LIMIT: "20" })).deliveryLimit).toBe(20)
        const raised = yield* load({
          WORKER_DELIVERY_LIMIT: "25",
          WORKER_QUEUE_DELIVERY_LIMIT: "30",
        })
        expect([raised.deliveryLimit, raised.queueDeliveryLimit]).toEqual([25, 30])
        const inCode = yield* loadError({}, { deliveryLimit: 21 })
        expect(inCode.problems[0]).toContain("WORKER_DELIVERY_LIMIT, 21")
      }))

    it.effect("refuses a backoff base above the backoff max", () =>
      Effect.gen(function* () {
        const error = yield* loadError({
          WORKER_RETRY_BACKOFF_BASE_S: "10",
          WORKER_RETRY_BACKOFF_MAX_S: "5",
        })
        expect(error.problems).toEqual(["retryBackoffBase must not exceed retryBackoffMax"])
      }))
  })

  describe("LOG_LEVEL and WORKER_LOG_ERROR_TEXT", () => {
    it.effect("take Python's level names and Effect's, in any case, as Effect's levels", () =>
      Effect.gen(function* () {
        expect((yield* load()).logLevel).toBe("Info")
        const levels: ReadonlyArray<readonly [string, LogLevel.LogLevel]> = [
          ["trace", "Trace"],
          ["debug", "Debug"],
          ["info", "Info"],
          ["warning", "Warn"],
          ["warn", "Warn"],
          ["error", "Error"],
          ["critical", "Fatal"],
          ["fatal", "Fatal"],
          ["none", "None"],
          [" WARNING ", "Warn"],
          ["Info", "Info"],
        ]
        for (const [name, level] of levels) {
          expect((yield* load({ LOG_LEVEL: name })).logLevel, name).toBe(level)
        }
        expect((yield* load({ LOG_LEVEL: "debug" }, { logLevel: "Warn" })).logLevel).toBe("Warn")
      }))

    it.effect("take true/yes/on/1 and false/no/off/0, and nothing else", () =>
      Effect.gen(function* () {
        expect((yield* load()).logErrorText).toBe(true)
        for (const yes of ["true", "yes", "on", "1"]) {
          expect((yield* load({ WORKER_LOG_ERROR_TEXT: yes })).logErrorText, yes).toBe(true)
        }
        for (const no of ["false", "no", "off", "0"]) {
          expect((yield* load({ WORKER_LOG_ERROR_TEXT: no })).logErrorText, no).toBe(false)
        }
        for (const other of ["y", "n", "TRUE", "enabled"]) {
          const error = yield* loadError({ WORKER_LOG_ERROR_TEXT: other })
          expect(error.problems, other).toHaveLength(1)
          expect(error.problems[0]).toContain("WORKER_LOG_ERROR_TEXT")
        }
      }))
  })

  describe("an empty variable", () => {
    // Effect 4's environment providers read an empty variable as an unset one.
    it.effect("is unset: the default applies", () =>
      Effect.gen(function* () {
        const s = yield* load({ IN_QUEUE_NAME: "", WORKER_CONCURRENCY: "", BROKER_URL: "" })
        expect(s.inQueue).toBe("count-words_queue_in")
        expect(s.concurrency).toBe(1)
        expect(Option.isNone(s.brokerUrl)).toBe(true)
      }))
  })

  describe("lease time budget", () => {
    // Defaults: a 60 s backoff max and a 1800 s consumer timeout leave 1680 s for a task.
    const withTimeout = (seconds: number) => ({ ...definition, timeout: Duration.seconds(seconds) })

    it.effect("fails exactly at the boundary (task + backoff max + 60 s = consumer timeout)", () =>
      Effect.gen(function* () {
        const error = yield* loadError({}, undefined, withTimeout(1680))
        expect(error.problems).toHaveLength(1)
        expect(error.problems[0]).toContain("consumer timeout")
        expect(error.message).toContain("consumer timeout")
        // What fixes it, where the worker can set the lease and where only the broker can.
        expect(error.problems[0]).toContain(
          "raise WORKER_CONSUMER_TIMEOUT_S, which the worker asks of RabbitMQ 3.12 and later",
        )
        expect(error.problems[0]).toContain("raise consumer_timeout in their rabbitmq.conf")
      }))

    it.effect("passes one second under the boundary", () =>
      Effect.gen(function* () {
        const s = yield* load({}, undefined, withTimeout(1679))
        expect(millis(s.taskTimeout)).toBe(1_679_000)
      }))

    it.effect("counts the environment's task timeout, backoff max and consumer timeout", () =>
      Effect.gen(function* () {
        const atBoundary = yield* loadError({ WORKER_TASK_TIMEOUT_S: "1680" })
        expect(atBoundary.problems[0]).toContain("consumer timeout")
        const longerBackoff = yield* loadError({
          WORKER_TASK_TIMEOUT_S: "1679",
          WORKER_RETRY_BACKOFF_MAX_S: "61",
        })
        expect(longerBackoff.problems[0]).toContain("consumer timeout")
        const s = yield* load({ WORKER_TASK_TIMEOUT_S: "1680", WORKER_CONSUMER_TIMEOUT_S: "1801" })
        expect(millis(s.consumerTimeout)).toBe(1_801_000)
      }))

    it.effect("is reported together with the other problems", () =>
      Effect.gen(function* () {
        const error = yield* loadError({ WORKER_CONCURRENCY: "0", WORKER_TASK_TIMEOUT_S: "3600" })
        expect(error.problems).toHaveLength(2)
        expect(error.problems[0]).toContain("WORKER_CONCURRENCY")
        expect(error.problems[1]).toContain("consumer timeout")
      }))
  })

  describe("transport and job mode", () => {
    it.effect("default to RabbitMQ, a service, and a job of one task, idle 10 s, connect 30 s", () =>
      Effect.gen(function* () {
        const s = yield* load()
        expect(s.transport).toBe("amqp")
        expect(s.mode).toBe("service")
        expect(s.jobMaxTasks).toBe(1)
        expect(millis(s.jobIdleTimeout)).toBe(10_000)
        expect(millis(s.jobConnectTimeout)).toBe(30_000)
      }))

    it.effect("are read from the environment", () =>
      Effect.gen(function* () {
        const s = yield* load({
          WORKER_TRANSPORT: "memory",
          WORKER_MODE: "job",
          WORKER_JOB_MAX_TASKS: "20",
          WORKER_JOB_IDLE_TIMEOUT_S: "2.5",
          WORKER_JOB_CONNECT_TIMEOUT_S: "90",
        })
        expect(s.transport).toBe("memory")
        expect(s.mode).toBe("job")
        expect(s.jobMaxTasks).toBe(20)
        expect(millis(s.jobIdleTimeout)).toBe(2_500)
        expect(millis(s.jobConnectTimeout)).toBe(90_000)
      }))

    it.effect("are given in code", () =>
      Effect.gen(function* () {
        const s = yield* load(
          { WORKER_MODE: "service", WORKER_TRANSPORT: "amqp" },
          { mode: "job", transport: "memory", jobMaxTasks: 3, jobIdleTimeout: "1 minute" },
        )
        expect(s.mode).toBe("job")
        expect(s.transport).toBe("memory")
        expect(s.jobMaxTasks).toBe(3)
        expect(millis(s.jobIdleTimeout)).toBe(60_000)
      }))

    it.effect("job mode runs one task at a time, whatever the concurrency asked for", () =>
      Effect.gen(function* () {
        const fromEnv = yield* load({ WORKER_MODE: "job", WORKER_CONCURRENCY: "8" })
        expect(fromEnv.concurrency).toBe(1)
        const fromCode = yield* load({}, { mode: "job", concurrency: 8 })
        expect(fromCode.concurrency).toBe(1)
        const fromDefinition = yield* load({ WORKER_MODE: "job" }, undefined, {
          ...definition,
          concurrency: 4,
        })
        expect(fromDefinition.concurrency).toBe(1)
        // A service keeps its concurrency.
        expect((yield* load({ WORKER_CONCURRENCY: "8" })).concurrency).toBe(8)
      }))

    it.effect("job mode still validates the concurrency it does not use", () =>
      Effect.gen(function* () {
        const error = yield* loadError({ WORKER_MODE: "job", WORKER_CONCURRENCY: "0" })
        expect(error.problems).toHaveLength(1)
        expect(error.problems[0]).toContain("WORKER_CONCURRENCY")
      }))

    it.effect("are validated, every problem listed at once", () =>
      Effect.gen(function* () {
        const error = yield* loadError({
          WORKER_TRANSPORT: "kafka",
          WORKER_MODE: "batch",
          WORKER_JOB_MAX_TASKS: "0",
          WORKER_JOB_IDLE_TIMEOUT_S: "0",
          WORKER_JOB_CONNECT_TIMEOUT_S: "-1",
        })
        const expected = [
          "WORKER_TRANSPORT",
          "WORKER_MODE",
          "WORKER_JOB_MAX_TASKS",
          "WORKER_JOB_IDLE_TIMEOUT_S",
          "WORKER_JOB_CONNECT_TIMEOUT_S",
        ]
        expect(error.problems).toHaveLength(expected.length)
        for (const key of expected) {
          expect(error.problems.filter((problem) => problem.includes(key))).toHaveLength(1)
        }
      }))

    it.effect("refuse a fractional or non-numeric job size", () =>
      Effect.gen(function* () {
        for (const value of ["1.5", "many"]) {
          const error = yield* loadError({ WORKER_JOB_MAX_TASKS: value })
          expect(error.problems).toHaveLength(1)
          expect(error.problems[0]).toContain("WORKER_JOB_MAX_TASKS")
        }
      }))
  })

  // Checked by the compiler (`tsc`, `deno check`): the types come from the settings table, and
  // each kind of row must still give the precise type, not a wider one.
  describe("types", () => {
    it("are as precise as each kind of row", () => {
      expectTypeOf<Settings.WorkerSettings["inQueue"]>().toEqualTypeOf<string>()
      expectTypeOf<Settings.WorkerSettings["concurrency"]>().toEqualTypeOf<number>()
      expectTypeOf<Settings.WorkerSettings["shutdownGrace"]>().toEqualTypeOf<Duration.Duration>()
      expectTypeOf<Settings.WorkerSettings["brokerUrl"]>().toEqualTypeOf<
        Option.Option<Redacted.Redacted<string>>
      >()
      expectTypeOf<Settings.WorkerSettings["logLevel"]>().toEqualTypeOf<LogLevel.LogLevel>()
      expectTypeOf<Settings.TransportKind>().toEqualTypeOf<"amqp" | "memory">()
      expectTypeOf<Settings.WorkerMode>().toEqualTypeOf<"service" | "job">()
    })

    it("let code give durations as Duration.Input, the broker URL as a string, any key left out", () => {
      expectTypeOf<Settings.SettingsOverrides["shutdownGrace"]>().toEqualTypeOf<
        Duration.Input | undefined
      >()
      expectTypeOf<Settings.SettingsOverrides["brokerUrl"]>().toEqualTypeOf<
        string | Redacted.Redacted<string> | undefined
      >()
      expectTypeOf<Settings.SettingsOverrides["mode"]>().toEqualTypeOf<
        Settings.WorkerMode | undefined
      >()
      expectTypeOf<Partial<Settings.SettingsOverrides>>().toEqualTypeOf<
        Settings.SettingsOverrides
      >()
      expectTypeOf<keyof Settings.SettingsOverrides>().toEqualTypeOf<
        keyof Settings.WorkerSettings
      >()
    })
  })
})
