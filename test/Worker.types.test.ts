/**
 * The type errors of `Worker.run` as a user reads them, from the TypeScript compiler (the pinned
 * one) over a file of its own, against the sources, with the project's options.
 */
import { createRequire } from "node:module"
import { join } from "node:path"
import type * as TS from "typescript"
import { describe, expect, it } from "vitest"
import { ROOT } from "./support/runtimes.ts"

const ts: typeof TS = createRequire(join(ROOT, "package.json"))("typescript")

/** The compiler's errors on `source`, a file in `test/`, each message chain on one line. */
const errorsOf = (source: string): Array<string> => {
  const file = join(ROOT, "test", "worker-types-case.ts")
  const config = ts.getParsedCommandLineOfConfigFile(join(ROOT, "tsconfig.json"), {}, {
    ...ts.sys,
    onUnRecoverableConfigFileDiagnostic: () => {},
  })!
  const host = ts.createCompilerHost(config.options)
  const getSourceFile = host.getSourceFile
  host.getSourceFile = (name, ...rest) =>
    name === file
      ? ts.createSourceFile(name, source, ts.ScriptTarget.Latest)
      : getSourceFile(name, ...rest)
  const fileExists = host.fileExists
  host.fileExists = (name) => name === file || fileExists(name)
  const program = ts.createProgram([file], config.options, host)
  return ts.getPreEmitDiagnostics(program, program.getSourceFile(file))
    .map((d) => ts.flattenDiagnosticMessageText(d.messageText, " ").replace(/\s+/g, " "))
}

describe("Worker.run's types", () => {
  it("a handler's requirement with no layer: the error leads with it, not with onIdle", () => {
    const errors = errorsOf(`
import { Context, Effect, Schema } from "effect"
import * as Worker from "../src/Worker.ts"
class Database extends Context.Service<Database, { readonly n: number }>()("app/Database") {}
const worker = Worker.make({
  name: "needy",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ n: Schema.Number }),
  timeout: "10 seconds",
  handler: () =>
    Effect.gen(function* () {
      return { n: (yield* Database).n }
    }),
})
Worker.run(worker)
`)
    expect(errors).toHaveLength(1)
    expect(errors[0]).not.toContain("onIdle")
    expect(errors[0]).toMatch(
      /^Argument of type 'Worker<.*, Database, never>' is not assignable to parameter of type 'Worker<.*, Database, never> & HandlerRequires<Database>'\. Property '"the handler requires services: give them with Worker\.run\(worker, \{ layer \}\)"' is missing/,
    )
  }, 60_000)

  it("retryOn takes a rule or a list of them, each answering a boolean or a duration", () => {
    const errors = errorsOf(`
import { Duration, Schema } from "effect"
import * as Transient from "../src/Transient.ts"
import * as Worker from "../src/Worker.ts"
const definition = {
  name: "fetching",
  input: Schema.Struct({ url: Schema.String }),
  output: Schema.Struct({ n: Schema.Number }),
  timeout: "10 seconds",
  handler: async () => ({ n: 1 }),
} as const
Worker.make({ ...definition, retryOn: Transient.network })
Worker.make({ ...definition, retryOn: [Transient.network, Transient.httpStatus([503])] })
Worker.make({ ...definition, retryOn: (error) => error instanceof RangeError && Duration.seconds(5) })
Worker.make({ ...definition, retryOn: () => "30 seconds" })
Worker.make({ ...definition, retryOn: () => "soon" })
Worker.make({ ...definition, retryOn: ["ECONNRESET"] })
export const rule: Transient.Rule = (error) => error === undefined
`)
    expect(errors).toHaveLength(2)
    expect(errors[0]).toContain(`Type '"soon"' is not assignable to type 'boolean | Input'`)
    expect(errors[1]).toMatch(/^Type 'string' is not assignable to type 'Rule'/)
  }, 60_000)
})
