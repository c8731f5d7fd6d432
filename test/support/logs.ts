/**
 * Test support: the log lines a program writes, captured, and a bounded wait on the scheduler.
 */
import { Effect, HashMap, Logger } from "effect"

export interface LogLine {
  readonly level: string
  readonly message: string
  readonly annotations: Readonly<Record<string, unknown>>
}

/** A logger layer keeping every line; `settled(taskId)` is the task's decision lines. */
export const captureLogs = () => {
  const lines: Array<LogLine> = []
  const layer = Logger.replace(
    Logger.defaultLogger,
    Logger.make(({ annotations, logLevel, message }) => {
      lines.push({
        level: logLevel.label,
        message: (Array.isArray(message) ? message : [message]).map(String).join(" "),
        annotations: Object.fromEntries(HashMap.toEntries(annotations)),
      })
    }),
  )
  const settled = (taskId: string) =>
    lines.filter((l) =>
      l.message.startsWith("Delivery settled:") && l.annotations.task_id === taskId
    )
  return { lines, layer, settled }
}

/** Yields to other fibers until `check` holds, a bounded number of times. */
export const waitUntil = (check: () => boolean | Effect.Effect<boolean>, what: string) =>
  Effect.gen(function* () {
    for (let i = 0; i < 2000; i++) {
      const result = check()
      if (typeof result === "boolean" ? result : yield* result) return
      yield* Effect.yieldNow()
    }
    return yield* Effect.dieMessage(`Gave up waiting until ${what}`)
  })
