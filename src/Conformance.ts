/**
 * The conformance kit: checks a running worker, written with any SDK in any language, against the
 * protocol (`docs/protocol.md`) on a real broker, from outside. It publishes a battery of
 * envelopes for the conformance workload (`docs/conformance.md`) to the service's input queue,
 * reads its output queue, and judges each rule it can observe, with its own reading of the bytes
 * and amqplib alone: nothing of the engine it could share a mistake with.
 *
 * `async-task-worker conformance --broker <url> --service <name>` is the same as a command.
 *
 * @since 0.2.0
 */
import { randomUUID } from "node:crypto"
import * as Effect from "effect/Effect"
import { battery } from "./internal/conformance/battery.ts"
import { judge, type RuleResult } from "./internal/conformance/rules.ts"
import { observe } from "./internal/conformance/session.ts"
import * as unacked from "./internal/conformance/unacked.ts"
import { ConformanceError } from "./WorkerError.ts"

/**
 * The kit could not run: the broker or the management API out of reach, or invalid options.
 *
 * @since 0.2.0
 * @category errors
 */
export { ConformanceError }

/**
 * Where the protocol page is read: the report links each rule to its section there. The
 * package's own copy (`docs/protocol.md`, beside `src/` and `dist/`), of the version installed;
 * the repository's where the module has no URL of its own (a CommonJS bundle).
 *
 * @since 0.2.0
 * @category constants
 */
export const PROTOCOL_PAGE: string = (() => {
  try {
    return new URL("../docs/protocol.md", import.meta.url).href
  } catch {
    // `import.meta.url` is undefined in a CommonJS bundle (examples/deploy/bundle).
    return "https://github.com/async-task/worker/blob/main/docs/protocol.md"
  }
})()

export type { RuleResult, Verdict } from "./internal/conformance/rules.ts"

/**
 * The service under test, and the settings of it that the battery depends on (as
 * `docs/conformance.md` asks the service to be run with).
 *
 * @since 0.2.0
 * @category models
 */
export interface ConformanceOptions {
  /** An AMQP URL of the broker the worker consumes from. */
  readonly brokerUrl: string
  /** The service's name: its queues are `<service>_queue_in` and `<service>_queue_out`. */
  readonly service: string
  readonly inQueue?: string | undefined
  readonly outQueue?: string | undefined
  /** The worker's delivery limit (`WORKER_DELIVERY_LIMIT`; default 5). */
  readonly deliveryLimit?: number | undefined
  /**
   * The worker's size limit (`WORKER_MAX_MESSAGE_BYTES`): given, a message one byte longer is sent,
   * which must be poison; the broker must take it (RabbitMQ 4's own limit is 16 MiB).
   */
  readonly maxMessageBytes?: number | undefined
  /** The worker's progress interval, in seconds (`WORKER_PROGRESS_MIN_INTERVAL_S`; default 1). */
  readonly progressIntervalS?: number | undefined
  /** The service's task time limit, in seconds (default 8, as the workload asks). */
  readonly taskTimeoutS?: number | undefined
  /**
   * The input queue's unacked deliveries, which AMQP does not tell: {@link managementUnacked} or
   * {@link rabbitmqctlUnacked}. Without it, the kit asks the broker ({@link discoverUnacked});
   * where nothing speaks for the broker, that rule is not observable.
   */
  readonly unacked?: (() => Promise<number>) | undefined
  /** Progress lines, as the run goes. */
  readonly log?: ((line: string) => void) | undefined
}

/**
 * Every rule's verdict; `passed` only when each rule passed.
 *
 * @since 0.2.0
 * @category models
 */
export interface ConformanceReport {
  readonly service: string
  readonly rules: ReadonlyArray<RuleResult>
  readonly passed: boolean
}

/**
 * Runs the battery against the service, which must be running and consuming.
 *
 * @since 0.2.0
 * @category constructors
 */
export const check = (
  options: ConformanceOptions,
): Effect.Effect<ConformanceReport, ConformanceError> => {
  const deliveryLimit = options.deliveryLimit ?? 5
  const progressIntervalS = options.progressIntervalS ?? 1
  const timeoutS = options.taskTimeoutS ?? 8
  // The progress case lasts 4.2 intervals, and must end within the time limit to be read.
  if (4.2 * progressIntervalS >= timeoutS) {
    return Effect.fail(
      new ConformanceError({
        message: `The progress case takes 4.2 progress intervals (${
          4.2 * progressIntervalS
        } s), more than the time limit (${timeoutS} s): run the service with a longer one`,
      }),
    )
  }
  const cases = battery(`conformance-${randomUUID().slice(0, 8)}`, {
    deliveryLimit,
    maxMessageBytes: options.maxMessageBytes,
    progressIntervalMs: progressIntervalS * 1000,
  })
  const inQueue = options.inQueue ?? `${options.service}_queue_in`
  const log = options.log ?? (() => {})
  return Effect.flatMap(unackedFor(options, inQueue, log), (unackedCount) =>
    observe(cases, {
      brokerUrl: options.brokerUrl,
      inQueue,
      outQueue: options.outQueue ?? `${options.service}_queue_out`,
      // The slowest case, the time limit's, then some for the retries' attempts.
      deadlineMs: (timeoutS + 20 + 2 * deliveryLimit) * 1000,
      quietMs: 2000,
      unacked: unackedCount,
      log,
    })).pipe(Effect.map((observed) => {
      const rules = judge(cases, observed, { progressIntervalS })
      return { service: options.service, rules, passed: rules.every((r) => r.verdict === "pass") }
    }))
}

/** The unacked count given, or the one the broker itself tells (said in the log either way). */
const unackedFor = (
  options: ConformanceOptions,
  inQueue: string,
  log: (line: string) => void,
): Effect.Effect<(() => Promise<number>) | undefined> => {
  if (options.unacked !== undefined) return Effect.succeed(options.unacked)
  return Effect.promise(() => unacked.discover(options.brokerUrl, inQueue)).pipe(
    Effect.map((found) => {
      log(
        found === undefined
          ? "The unacked count: neither a management API nor rabbitmqctl speaks for this broker"
          : `The unacked count: from ${found.description}`,
      )
      return found?.unacked
    }),
  )
}

/**
 * {@link check} as a Promise.
 *
 * @since 0.2.0
 * @category constructors
 */
export const run = (options: ConformanceOptions): Promise<ConformanceReport> =>
  Effect.runPromise(check(options))

/**
 * The report, a line per rule (`pass`, `FAIL`, `not observable`) with the section of the
 * protocol page that states it, and each failure's offending message.
 *
 * @since 0.2.0
 * @category codecs
 */
export const format = (report: ConformanceReport): string => {
  const mark = { pass: "pass", fail: "FAIL", "not observable": "n/a " } as const
  const lines = report.rules.flatMap((r) => [
    `${mark[r.verdict]}  ${r.id}: ${r.title}  (${PROTOCOL_PAGE}${r.section})`,
    ...(r.detail === undefined ? [] : [`      ${r.detail}`]),
  ])
  const failed = report.rules.filter((r) => r.verdict === "fail").length
  const unobserved = report.rules.filter((r) => r.verdict === "not observable").length
  return [
    `Conformance of ${report.service}:`,
    ...lines,
    report.passed
      ? `Every rule passed (${report.rules.length}).`
      : `${failed} rule(s) failed, ${unobserved} not observable here, of ${report.rules.length}.`,
  ].join("\n")
}

/**
 * The unacked count of RabbitMQ's management API (`http://user:pass@host:15672`), whose figures
 * lag by its collection interval (5 s by default).
 *
 * @since 0.2.0
 * @category constructors
 */
export const managementUnacked: (
  api: string,
  vhost: string,
  queue: string,
) => () => Promise<number> = unacked.management

/**
 * The unacked count as `rabbitmqctl` on this host tells it: for a broker on the same machine
 * (`command`, since 0.3.0, names another `rabbitmqctl`, a node's own).
 *
 * @since 0.2.0
 * @category constructors
 */
export const rabbitmqctlUnacked: (
  vhost: string,
  queue: string,
  command?: string,
) => () => Promise<number> = unacked.rabbitmqctl

/**
 * Where the broker at `brokerUrl` tells the unacked count of `queue` (of the URL's vhost): its
 * management API where
 * enabled (found at the broker's host, on 15672 or its AMQP port + 10 000, and checked to serve
 * that port), else `rabbitmqctl` when the broker is on this machine and that command addresses
 * its node. `undefined` when neither does. {@link check} asks it when given no `unacked`.
 *
 * @since 0.3.0
 * @category constructors
 */
export const discoverUnacked: (
  brokerUrl: string,
  queue: string,
  command?: string,
) => Promise<
  { readonly unacked: () => Promise<number>; readonly description: string } | undefined
> = unacked.discover
