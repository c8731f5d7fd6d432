/**
 * What a row of the settings table is, and what is done with the rows: read from the
 * environment (or taken from code) and checked one by one, and shown as the README's table.
 * The rows themselves are in `table.ts`; the checks between fields in `Settings.ts`.
 */
import * as Config from "effect/Config"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as LogLevel from "effect/LogLevel"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as SchemaIssue from "effect/SchemaIssue"
import { decodeDuration, isNegativeOrNaN } from "../codec/duration.ts"

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
 * One setting. `A` is its resolved type, `I` what code may give instead of the environment.
 * `read` is a method so that a table can hold rows of any `I`: the overrides' type comes from
 * each row's own `I` (`Inputs`), never from this bivariance.
 */
export interface Row<A, I> {
  readonly env: string
  /** One line: the variable's `Config` description and its meaning in the README. */
  readonly meaning: string
  /** The README's default cell. */
  readonly shownDefault: string
  /** The value given in code, else the environment's, and the problem with it if any. */
  read(label: string, defaults: SettingsDefaults, given: I | undefined): Config.Config<Checked<A>>
}

type Checked<A> = Result.Result<A, string>

/** The rows by field name, in the order they are checked and shown. */
export type Table = { readonly [field: string]: Row<unknown, unknown> }

/** The resolved settings a table describes. */
export type Values<T extends Table> = {
  readonly [K in keyof T]: T[K] extends Row<infer A, any> ? A : never
}

/** What code may give instead of the environment, field by field. */
export type Inputs<T extends Table> = {
  readonly [K in keyof T]?: (T[K] extends Row<any, infer I> ? I : never) | undefined
}

/**
 * A default is a value, or comes from the worker's definition; the README cannot show the
 * latter by itself, so such a row says how it is shown.
 */
type Default<V> =
  | { readonly default: V; readonly shownDefault?: string }
  | { readonly default: (defaults: SettingsDefaults) => V; readonly shownDefault: string }

type Spec<V> = Default<V> & { readonly env: string; readonly meaning: string }

const resolve = <V>(spec: Default<V>, defaults: SettingsDefaults): V =>
  typeof spec.default === "function"
    ? (spec.default as (defaults: SettingsDefaults) => V)(defaults)
    : spec.default

const rowOf = <R, A, I>(options: {
  readonly env: string
  readonly meaning: string
  readonly shownDefault: string
  readonly config: (defaults: SettingsDefaults) => Config.Config<R>
  readonly given: (input: I) => R
  readonly check: (label: string, raw: R) => Checked<A>
}): Row<A, I> => ({
  env: options.env,
  meaning: options.meaning,
  shownDefault: options.shownDefault,
  read: (label, defaults, given) =>
    (given === undefined ? options.config(defaults) : Config.succeed(options.given(given))).pipe(
      Config.map((raw) => options.check(label, raw)),
    ),
})

/**
 * A variable's text that does not read as its kind, in Effect 3's words (`Expected an integer
 * value but received "x"`), which the settings' messages keep.
 */
const invalid = (env: string, message: string): Config.ConfigError =>
  new Config.ConfigError(
    new Schema.SchemaError(
      new SchemaIssue.Pointer([env], new SchemaIssue.InvalidValue({ message })),
    ),
  )

type Parse<V> = (text: string) => Result.Result<V, string>

/** The variable's text, described for `Config`. */
const variable = (env: string, description: string): Config.Config<string> =>
  Config.schema(Schema.String.annotate({ description }), env)

/** The variable's text, read by `parse`. */
const parsed = <V>(parse: Parse<V>) => (env: string, description: string): Config.Config<V> =>
  variable(env, description).pipe(Config.mapEffect((text) => {
    const result = parse(text)
    return Result.isSuccess(result)
      ? Effect.succeed(result.success)
      : Effect.fail(invalid(env, result.failure))
  }))

const received = (text: string) => `but received ${JSON.stringify(text)}`

// Effect 3's readings of a variable, kept so that what a variable accepts does not change:
// Effect 4's `Config.Int`, `Number` and `Boolean` refuse spaces around a number, and take y/n.
const asNumber: Parse<number> = (text) => {
  const n = Number(text)
  return Number.isNaN(n)
    ? Result.fail(`Expected a number value ${received(text)}`)
    : Result.succeed(n)
}

const asInteger: Parse<number> = (text) => {
  const n = Number(text)
  return Number.isInteger(n)
    ? Result.succeed(n)
    : Result.fail(`Expected an integer value ${received(text)}`)
}

const BOOLEANS: Readonly<Record<string, boolean>> = {
  true: true,
  yes: true,
  on: true,
  1: true,
  false: false,
  no: false,
  off: false,
  0: false,
}

const asBoolean: Parse<boolean> = (text) =>
  Object.hasOwn(BOOLEANS, text)
    ? Result.succeed(BOOLEANS[text]!)
    : Result.fail(`Expected a boolean value ${received(text)}`)

const asOneOf = <L extends string>(values: ReadonlyArray<L>): Parse<L> => (text) => {
  const found = values.find((value) => value === text)
  return found === undefined
    ? Result.fail(`Expected one of (${values.join(", ")}) ${received(text)}`)
    : Result.succeed(found)
}

/**
 * A row with a default: the environment's value read by `read`, described by the meaning (or
 * `description`), defaulted, then turned by `then` into what code may give instead (`R`).
 */
const row = <V, R, A, I>(
  spec: Spec<V>,
  options: {
    readonly read: (env: string, description: string) => Config.Config<V>
    /** How the README shows a default given as a value (default: as code). */
    readonly shown?: (value: V) => string
    readonly description?: string
    readonly then: (config: Config.Config<V>) => Config.Config<R>
    readonly given: (input: I) => R
    readonly check: (label: string, raw: R) => Checked<A>
  },
): Row<A, I> =>
  rowOf({
    env: spec.env,
    meaning: spec.meaning,
    shownDefault: spec.shownDefault ??
      (options.shown ?? ((value) => `\`${value}\``))(spec.default as V),
    config: (defaults) =>
      options.then(
        // The default made only when the variable is absent: the host's name asks Deno for a
        // permission that a set HOSTNAME spares.
        Config.option(options.read(spec.env, options.description ?? spec.meaning)).pipe(
          Config.map(Option.getOrElse(() => resolve(spec, defaults))),
        ),
      ),
    given: options.given,
    check: options.check,
  })

/** What most rows do between the environment and the check: nothing. */
const asIs = <V>(config: Config.Config<V>): Config.Config<V> => config

const MAX_INT32 = 2 ** 31 - 1

/** An integer from `min` to `max` (the largest 32-bit one unless given). */
export const integer = (
  spec: Spec<number> & { readonly min: number; readonly max?: number },
): Row<number, number> => {
  const { min, max = MAX_INT32 } = spec
  return row(spec, {
    read: parsed(asInteger),
    shown: String,
    then: asIs,
    given: (input: number) => input,
    check: (label, value) =>
      !Number.isInteger(value) || value < min || value > max
        ? Result.fail(`${label} must be an integer from ${min} to ${max}, got ${value}`)
        : Result.succeed(value),
  })
}

/**
 * A duration: seconds in the environment, a `Duration.Input` in code (a bare number is
 * milliseconds, as everywhere in Effect). Never negative, infinite, or zero unless `allowZero`.
 */
export const duration = (
  spec: Spec<number> & { readonly allowZero: boolean },
): Row<Duration.Duration, Duration.Input> =>
  row(spec, {
    read: parsed(asNumber),
    shown: (seconds) => `${seconds} s`,
    description: `${spec.meaning} (seconds)`,
    // As milliseconds, not `Duration.seconds(s)`, so that the check sees the input itself (a
    // NaN one would be a zero Duration).
    then: Config.map((s): Duration.Input => s * 1000),
    given: (input: Duration.Input) => input,
    check: (label, input) => {
      const decoded = decodeDuration(input)
      if (Option.isNone(decoded)) return Result.fail(`${label} is not a duration`)
      const ms = Duration.toMillis(decoded.value)
      if (isNegativeOrNaN(input) || !Number.isFinite(ms) || (!spec.allowZero && ms === 0)) {
        return Result.fail(
          `${label} must be a finite duration${spec.allowZero ? ", not negative" : " above zero"}`,
        )
      }
      return Result.succeed(decoded.value)
    },
  })

/** A string, blank only if `allowEmpty`. */
export const text = (
  spec: Spec<string> & { readonly allowEmpty: boolean },
): Row<string, string> =>
  row(spec, {
    read: variable,
    then: asIs,
    given: (input: string) => input,
    check: (label, value) =>
      !spec.allowEmpty && value.trim() === ""
        ? Result.fail(`${label} must not be empty`)
        : Result.succeed(value),
  })

/** One of a few names. */
export const literal = <const L extends string>(
  spec: Spec<NoInfer<L>> & { readonly values: readonly [L, ...Array<L>] },
): Row<L, L> =>
  row(spec, {
    read: parsed(asOneOf(spec.values)),
    then: asIs,
    given: (input: L) => input,
    check: (_label, value) => Result.succeed(value),
  })

/** A yes or no: `true` or `false` in the environment (also yes/no, on/off, 1/0, as in Effect 3). */
export const boolean = (spec: Spec<boolean>): Row<boolean, boolean> =>
  row(spec, {
    read: parsed(asBoolean),
    then: asIs,
    given: (input: boolean) => input,
    check: (_label, value) => Result.succeed(value),
  })

// Python's level names (as the platform's other workers log), and Effect's own where they differ.
const LOG_LEVELS: Readonly<Record<string, LogLevel.LogLevel>> = {
  trace: "Trace",
  debug: "Debug",
  info: "Info",
  warning: "Warn",
  warn: "Warn",
  error: "Error",
  critical: "Fatal",
  fatal: "Fatal",
  none: "None",
}

/** A log level by name in the environment (any case), a `LogLevel` (`"Info"`) in code. */
export const logLevel = (spec: Spec<string>): Row<LogLevel.LogLevel, LogLevel.LogLevel> =>
  row(spec, {
    read: variable,
    then: Config.mapEffect((name) => {
      const level = LOG_LEVELS[name.trim().toLowerCase()]
      return level === undefined
        ? Effect.fail(
          invalid(spec.env, `must be debug, info, warning, error, critical or none, got "${name}"`),
        )
        : Effect.succeed(level)
    }),
    given: (input: LogLevel.LogLevel) => input,
    check: (_label, level) => Result.succeed(level),
  })

/**
 * A secret, absent by default: redacted from the moment it is read, so never shown. `check`
 * says what is wrong with a value (after the setting's name), in words that never quote it.
 */
export const secret = (spec: {
  readonly env: string
  readonly meaning: string
  readonly check?: (value: string) => string | undefined
}): Row<Option.Option<Redacted.Redacted<string>>, string | Redacted.Redacted<string>> =>
  rowOf({
    env: spec.env,
    meaning: spec.meaning,
    shownDefault: "none",
    config: () =>
      Config.option(
        Config.schema(
          Schema.Redacted(Schema.String).annotate({ description: spec.meaning }),
          spec.env,
        ),
      ),
    given: (input: string | Redacted.Redacted<string>) =>
      Option.some(Redacted.isRedacted(input) ? input : Redacted.make(input)),
    check: (label, value) => {
      const problem = Option.isSome(value) && spec.check !== undefined
        ? spec.check(Redacted.value(value.value))
        : undefined
      return problem === undefined ? Result.succeed(value) : Result.fail(`${label} ${problem}`)
    },
  })

const formatter = SchemaIssue.makeFormatterStandardSchemaV1()

/** A `Config` failure as `VARIABLE: problem` lines. */
const problemsOf = (error: Config.ConfigError): Array<string> => {
  const cause = error.cause
  if (cause._tag === "SourceError") return [cause.message]
  return formatter(cause.issue).issues.map(({ message, path = [] }) =>
    `${path.map((key) => String(typeof key === "object" ? key.key : key)).join(".")}: ${message}`
  )
}

/**
 * Every row of `table`, read on its own (with `Config.all`, one value that does not parse would
 * hide the others' problems). A row with a problem has no value, so that the checks between
 * fields do not compare it with the others; with no problem, every row has its value.
 */
export const readTable = <T extends Table>(
  table: T,
  defaults: SettingsDefaults,
  given: Inputs<T>,
): Effect.Effect<{
  readonly values: Partial<Values<T>>
  readonly problems: ReadonlyArray<string>
}> => {
  const rows = Object.entries(table) as Array<[keyof T & string, Row<unknown, unknown>]>
  return Effect.forEach(rows, ([field, { env, read }]) => {
    return Effect.result(read(`${field} (${env})`, defaults, given[field])).pipe(
      Effect.map((result) => [field, result] as const),
    )
  }).pipe(Effect.map((results) => {
    const values: Partial<Record<keyof T, unknown>> = {}
    const problems: Array<string> = []
    for (const [field, result] of results) {
      if (Result.isFailure(result)) problems.push(...problemsOf(result.failure))
      else if (Result.isFailure(result.success)) problems.push(result.success.failure)
      else values[field] = result.success.success
    }
    return { values: values as Partial<Values<T>>, problems }
  }))
}

/**
 * The README's settings table, one line per row: the variable, its name in code (the field of
 * `SettingsOverrides` and `WorkerSettings`), its default and meaning (unpadded: `deno fmt
 * README.md` pads it). To regenerate it, from the repository's root: `deno eval 'import { renderTable } from
 * "./src/internal/settings/row.ts"; import { table } from "./src/internal/settings/table.ts";
 * console.log(renderTable(table))'`.
 */
export const renderTable = (table: Table): string => {
  const line = (cells: ReadonlyArray<string>) => `| ${cells.join(" | ")} |`
  return [
    line(["variable", "in code", "default", "meaning"]),
    line(["---", "---", "---", "---"]),
    ...Object.entries(table).map(([field, { env, shownDefault, meaning }]) =>
      line([`\`${env}\``, `\`${field}\``, shownDefault, meaning])
    ),
  ].join("\n")
}
