/**
 * Test support: the log lines a program writes, captured, and a bounded wait on the scheduler.
 */
import { setImmediate } from "node:timers"
import { Effect, Logger, References } from "effect"

export interface LogLine {
  /** The level, upper-cased: `INFO`, `WARN`, `ERROR`, … */
  readonly level: string
  readonly message: string
  readonly annotations: Readonly<Record<string, unknown>>
}

/**
 * A logger layer keeping every line; `settled(taskId)` is the task's decision lines. It stands in
 * for Effect's default logger only: the tracer's logger stays, as under `WorkerLogger.layer`.
 */
export const captureLogs = () => {
  const lines: Array<LogLine> = []
  const capture = Logger.make(({ fiber, logLevel, message }) => {
    lines.push({
      level: logLevel.toUpperCase(),
      message: (Array.isArray(message) ? message : [message]).map(String).join(" "),
      annotations: { ...fiber.getRef(References.CurrentLogAnnotations) },
    })
  })
  const layer = Logger.layer([capture, Logger.tracerLogger])
  const settled = (taskId: string) =>
    lines.filter((l) =>
      l.message.startsWith("Delivery settled:") && l.annotations.task_id === taskId
    )
  return { lines, layer, settled }
}

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
