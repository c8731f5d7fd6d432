/**
 * Test support: the log lines a program writes, captured, and waits on the scheduler — a turn of
 * the event loop, every fiber run to its next wait, a condition awaited, a fiber's end polled.
 */
import { setImmediate } from "node:timers"
import { Effect, type Fiber, type Layer, Logger, type LogLevel, References } from "effect"

export interface LogLine {
  /** Effect's level: `Info`, `Warn`, `Error`, … */
  readonly level: LogLevel.LogLevel
  readonly message: string
  readonly annotations: Readonly<Record<string, unknown>>
}

export interface Logs {
  /** Every line, in order. */
  readonly lines: ReadonlyArray<LogLine>
  /** The logger layer that keeps them. */
  readonly layer: Layer.Layer<never>
  /** The decision lines, of one task when `taskId` is given. */
  readonly settled: (taskId?: string) => ReadonlyArray<LogLine>
}

/**
 * A logger layer keeping every line. It stands in for Effect's default logger only: the tracer's
 * logger stays, as under `WorkerLogger.layer`.
 */
export const captureLogs = (): Logs => {
  const lines: Array<LogLine> = []
  const capture = Logger.make(({ fiber, logLevel, message }) => {
    lines.push({
      level: logLevel,
      message: (Array.isArray(message) ? message : [message]).map(String).join(" "),
      annotations: { ...fiber.getRef(References.CurrentLogAnnotations) },
    })
  })
  const layer = Logger.layer([capture, Logger.tracerLogger])
  const settled = (taskId?: string) =>
    lines.filter((l) =>
      l.message.startsWith("Delivery settled:") &&
      (taskId === undefined || l.annotations.task_id === taskId)
    )
  return { lines, layer, settled }
}

/** `body` run with its log lines captured: a fresh capture for each run of the effect. */
export const withLogs = <A, E, R>(
  body: (logs: Logs) => Effect.Effect<A, E, R>,
): Effect.Effect<A, E, R> =>
  Effect.suspend(() => {
    const logs = captureLogs()
    return Effect.provide(body(logs), logs.layer)
  })

/**
 * A turn of the event loop: its timers and I/O callbacks (a socket's among them) run before this
 * completes.
 */
export const nextTurn: Effect.Effect<void> = Effect.promise(() =>
  new Promise<void>((resolve) => setImmediate(resolve))
)

/**
 * Yields until `check` holds, a bounded number of times: to other fibers, and to the event loop
 * (where a socket's callbacks run), with no timer — the clock may be a `TestClock`.
 */
export const waitUntil = (check: () => boolean | Effect.Effect<boolean>, what: string) =>
  Effect.gen(function* () {
    for (let i = 0; i < 2000; i++) {
      const result = check()
      if (typeof result === "boolean" ? result : yield* result) return
      yield* Effect.yieldNow
      yield* nextTurn
    }
    return yield* Effect.die(new Error(`Gave up waiting until ${what}`))
  })

/**
 * Lets every fiber that can run, run, with the TestClock still: `times` rounds of a yield to the
 * scheduler and a turn of the event loop. Effect 4's `TestClock.adjust` looks for sleeps one
 * scheduler turn after it is called, where Effect 3's waited for every fiber of the test to
 * suspend: what a test just did may set its timers a few turns later.
 */
export const settle = (times = 20): Effect.Effect<void> =>
  Effect.gen(function* () {
    for (let i = 0; i < times; i++) {
      yield* Effect.yieldNow
      yield* nextTurn
    }
  })

/** Whether `fiber` has ended, without waiting for it. */
export const isDone = <A, E>(fiber: Fiber.Fiber<A, E>): Effect.Effect<boolean> =>
  Effect.sync(() => fiber.pollUnsafe() !== undefined)
