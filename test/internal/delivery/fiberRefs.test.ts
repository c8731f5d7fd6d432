/**
 * The FiberRefs shortcut a delivery sets its annotations and context with gives what
 * `Effect.locally` and `Effect.logInfo` would: the same log line, the same services.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, FiberRef, HashMap, Logger } from "effect"
import { withTaskRefs } from "../../../src/internal/delivery/fiberRefs.ts"

class Database extends Context.Tag("test/Database")<Database, { readonly name: string }>() {}

/**
 * What a handler sees: its log line's annotations, and its services. `Database` is in the
 * fiber's context by the FiberRef under test, which the compiler cannot see.
 */
const observe: Effect.Effect<{
  readonly lines: ReadonlyArray<Record<string, unknown>>
  readonly database: string
}> = Effect.gen(function* () {
  const lines: Array<Record<string, unknown>> = []
  const logger = Logger.make(({ annotations }) => {
    lines.push(Object.fromEntries(HashMap.toEntries(annotations)))
  })
  yield* Effect.logInfo("inside the handler").pipe(
    Effect.provide(Logger.replace(Logger.defaultLogger, logger)),
  )
  const database = yield* Database
  return { lines, database: database.name }
}) as Effect.Effect<any>

const annotationsOf = (taskId: string) =>
  HashMap.make(["service", "svc"] as [string, unknown], ["task_id", taskId], ["attempt", 1])

const contextOf = (name: string) => Context.make(Database, { name })

describe("withTaskRefs", () => {
  it.effect("gives what Effect.locally of the annotations and the context gives", () =>
    Effect.gen(function* () {
      const expected = yield* observe.pipe(
        Effect.locally(FiberRef.currentLogAnnotations, annotationsOf("t-1")),
        Effect.locally(FiberRef.currentContext, contextOf("db-1")),
      )
      const actual = yield* Effect.gen(function* () {
        yield* Effect.updateFiberRefs((id, refs) =>
          withTaskRefs(refs, id, annotationsOf("t-1"), contextOf("db-1"))
        )
        return yield* observe
      }).pipe(Effect.fork, Effect.flatMap((fiber) => fiber.await), Effect.flatten)
      expect(actual).toEqual(expected)
      expect(actual.lines).toEqual([{ service: "svc", task_id: "t-1", attempt: 1 }])
      expect(actual.database).toBe("db-1")
    }))

  it.effect("the next delivery's values replace the last's on the same fiber", () =>
    Effect.gen(function* () {
      const second = yield* Effect.gen(function* () {
        yield* Effect.updateFiberRefs((id, refs) =>
          withTaskRefs(refs, id, annotationsOf("t-1"), contextOf("db-1"))
        )
        yield* Effect.updateFiberRefs((id, refs) =>
          withTaskRefs(refs, id, annotationsOf("t-2"), contextOf("db-2"))
        )
        return yield* observe
      }).pipe(Effect.fork, Effect.flatMap((fiber) => fiber.await), Effect.flatten)
      const expected = yield* observe.pipe(
        Effect.locally(FiberRef.currentLogAnnotations, annotationsOf("t-2")),
        Effect.locally(FiberRef.currentContext, contextOf("db-2")),
      )
      expect(second).toEqual(expected)
    }))
})
