/**
 * What a row of the settings table is, and what is done with the rows: read from the
 * environment (or taken from code) and checked one by one, and shown as the README's table.
 * The rows themselves are in `table.ts`; the checks between fields in `Settings.ts`.
 */
import { Config, ConfigError, Duration, Effect, Either, LogLevel, Option, Redacted } from "effect"
import type { SettingsDefaults } from "../../Settings.ts"
import { isNegativeOrNaN } from "../codec/duration.ts"

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

type Checked<A> = Either.Either<A, string>

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
 * A row with a default: the environment's value read by `read`, described by the meaning (or
 * `description`), defaulted, then turned by `then` into what code may give instead (`R`).
 */
const row = <V, R, A, I>(
  spec: Spec<V>,
  options: {
    readonly read: (env: string) => Config.Config<V>
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
        options.read(spec.env).pipe(
          Config.withDescription(options.description ?? spec.meaning),
          Config.withDefault(resolve(spec, defaults)),
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
    read: Config.integer,
    shown: String,
    then: asIs,
    given: (input: number) => input,
    check: (label, value) =>
      !Number.isInteger(value) || value < min || value > max
        ? Either.left(`${label} must be an integer from ${min} to ${max}, got ${value}`)
        : Either.right(value),
  })
}

/**
 * A duration: seconds in the environment, a `DurationInput` in code (a bare number is
 * milliseconds, as everywhere in Effect). Never negative, infinite, or zero unless `allowZero`.
 */
export const duration = (
  spec: Spec<number> & { readonly allowZero: boolean },
): Row<Duration.Duration, Duration.DurationInput> =>
  row(spec, {
    read: Config.number,
    shown: (seconds) => `${seconds} s`,
    description: `${spec.meaning} (seconds)`,
    // As milliseconds, not `Duration.seconds(s)`: a Duration turns a negative value into zero,
    // and the check must still see the sign.
    then: Config.map((s): Duration.DurationInput => s * 1000),
    given: (input: Duration.DurationInput) => input,
    check: (label, input) => {
      const decoded = Duration.decodeUnknown(input)
      if (Option.isNone(decoded)) return Either.left(`${label} is not a duration`)
      const ms = Duration.toMillis(decoded.value)
      if (isNegativeOrNaN(input) || !Number.isFinite(ms) || (!spec.allowZero && ms === 0)) {
        return Either.left(
          `${label} must be a finite duration${spec.allowZero ? ", not negative" : " above zero"}`,
        )
      }
      return Either.right(decoded.value)
    },
  })

/** A string, blank only if `allowEmpty`. */
export const text = (
  spec: Spec<string> & { readonly allowEmpty: boolean },
): Row<string, string> =>
  row(spec, {
    read: Config.string,
    then: asIs,
    given: (input: string) => input,
    check: (label, value) =>
      !spec.allowEmpty && value.trim() === ""
        ? Either.left(`${label} must not be empty`)
        : Either.right(value),
  })

/** One of a few names. */
export const literal = <const L extends string>(
  spec: Spec<NoInfer<L>> & { readonly values: readonly [L, ...Array<L>] },
): Row<L, L> =>
  row(spec, {
    read: Config.literal(...spec.values),
    then: asIs,
    given: (input: L) => input,
    check: (_label, value) => Either.right(value),
  })

/** A yes or no: `true` or `false` in the environment (`Config.boolean` also takes yes/no, on/off, 1/0). */
export const boolean = (spec: Spec<boolean>): Row<boolean, boolean> =>
  row(spec, {
    read: Config.boolean,
    then: asIs,
    given: (input: boolean) => input,
    check: (_label, value) => Either.right(value),
  })

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

/** A log level by name in the environment (any case), a `LogLevel` in code. */
export const logLevel = (spec: Spec<string>): Row<LogLevel.LogLevel, LogLevel.LogLevel> =>
  row(spec, {
    read: Config.string,
    then: Config.mapOrFail((name) => {
      const level = LOG_LEVELS[name.trim().toLowerCase()]
      return level === undefined
        ? Either.left(
          ConfigError.InvalidData(
            [spec.env],
            `must be debug, info, warning, error, critical or none, got "${name}"`,
          ),
        )
        : Either.right(level)
    }),
    given: (input: LogLevel.LogLevel) => input,
    check: (_label, level) => Either.right(level),
  })

/** A secret, absent by default: redacted from the moment it is read, so never shown. */
export const secret = (spec: {
  readonly env: string
  readonly meaning: string
}): Row<Option.Option<Redacted.Redacted<string>>, string | Redacted.Redacted<string>> =>
  rowOf({
    env: spec.env,
    meaning: spec.meaning,
    shownDefault: "none",
    config: () =>
      Config.option(Config.redacted(spec.env).pipe(Config.withDescription(spec.meaning))),
    given: (input: string | Redacted.Redacted<string>) =>
      Option.some(Redacted.isRedacted(input) ? input : Redacted.make(input)),
    check: (_label, value) => Either.right(value),
  })

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
    return Effect.either(read(`${field} (${env})`, defaults, given[field])).pipe(
      Effect.map((result) => [field, result] as const),
    )
  }).pipe(Effect.map((results) => {
    const values: Partial<Record<keyof T, unknown>> = {}
    const problems: Array<string> = []
    for (const [field, result] of results) {
      if (Either.isLeft(result)) problems.push(...flattenConfigError(result.left))
      else if (Either.isLeft(result.right)) problems.push(result.right.left)
      else values[field] = result.right.right
    }
    return { values: values as Partial<Values<T>>, problems }
  }))
}

/**
 * The README's settings table, one line per row (unpadded: `deno fmt README.md` pads it). To
 * regenerate it: `deno eval 'import { renderTable } from "../src/internal/settings.ts";
 * import { table } from "../src/internal/settingsTable.ts"; console.log(renderTable(table))'`.
 */
export const renderTable = (table: Table): string => {
  const line = (cells: ReadonlyArray<string>) => `| ${cells.join(" | ")} |`
  return [
    line(["variable", "default", "meaning"]),
    line(["---", "---", "---"]),
    ...Object.values(table).map(({ env, shownDefault, meaning }) =>
      line([`\`${env}\``, shownDefault, meaning])
    ),
  ].join("\n")
}
