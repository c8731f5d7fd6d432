/**
 * The Prometheus text parser the tests read `/metrics` with (`parse-prometheus-text-format`, a
 * port of the Python client's parser), plus the checks it leaves out: the charset of names,
 * one `# TYPE` per family, every family's series together, the closing line feed.
 */
import parsePrometheusTextFormat from "parse-prometheus-text-format"

export interface ParsedSample {
  readonly labels?: Record<string, string>
  readonly value?: string
  readonly buckets?: Record<string, string>
  readonly quantiles?: Record<string, string>
  readonly count?: string
  readonly sum?: string
}

export interface ParsedFamily {
  readonly name: string
  readonly help: string
  readonly type: "COUNTER" | "GAUGE" | "HISTOGRAM" | "SUMMARY" | "UNTYPED"
  readonly metrics: ReadonlyArray<ParsedSample>
}

const metricName = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const labelName = /^[a-zA-Z_][a-zA-Z0-9_]*$/

/**
 * Parses an exposition, throwing on anything the parser or the extra checks reject. The parser
 * keeps the labels of histograms and summaries only when a family has one series: read a
 * labelled histogram's lines with {@link lines}.
 */
export const parse = (text: string): ReadonlyArray<ParsedFamily> => {
  if (text !== "" && !text.endsWith("\n")) throw new Error("The exposition must end with \\n")
  const families = (parsePrometheusTextFormat as (text: string) => Array<ParsedFamily>)(text)
  const seen = new Set<string>()
  for (const family of families) {
    if (!metricName.test(family.name)) throw new Error(`Bad metric name ${family.name}`)
    if (seen.has(family.name)) throw new Error(`Family ${family.name} is split or repeated`)
    seen.add(family.name)
    if (family.type === "UNTYPED") throw new Error(`Family ${family.name} has no # TYPE`)
    for (const sample of family.metrics) {
      for (const name of Object.keys(sample.labels ?? {})) {
        if (!labelName.test(name)) throw new Error(`Bad label name ${name} in ${family.name}`)
      }
    }
  }
  const types = text.split("\n").filter((line) => line.startsWith("# TYPE "))
  if (new Set(types.map((line) => line.split(" ")[2])).size !== types.length) {
    throw new Error("A family has two # TYPE lines")
  }
  return families
}

/** The family named `name`, or a failure naming the families there are. */
export const family = (
  families: ReadonlyArray<ParsedFamily>,
  name: string,
): ParsedFamily => {
  const found = families.find((f) => f.name === name)
  if (found === undefined) {
    throw new Error(`No family ${name} in ${families.map((f) => f.name).join(", ")}`)
  }
  return found
}

/** The value of the counter or gauge series of `name` with exactly these labels, as a number. */
export const value = (
  families: ReadonlyArray<ParsedFamily>,
  name: string,
  labels: Record<string, string> = {},
): number => {
  const sample = family(families, name).metrics.find((m) =>
    JSON.stringify(Object.entries(m.labels ?? {}).sort()) ===
      JSON.stringify(Object.entries(labels).sort())
  )
  if (sample?.value === undefined) {
    throw new Error(`No series ${name}${JSON.stringify(labels)}`)
  }
  return toNumber(sample.value)
}

/** A sample value as Go's `strconv.ParseFloat` reads it (`+Inf`, `-Inf`, `NaN`, decimals). */
export const toNumber = (text: string): number =>
  /^[+]?inf$/i.test(text) ? Infinity : /^-inf$/i.test(text) ? -Infinity : Number(text)

/** The sample lines of the exposition whose metric name is `name` (exactly). */
export const lines = (text: string, name: string): ReadonlyArray<string> =>
  text.split("\n").filter((line) => line.startsWith(`${name} `) || line.startsWith(`${name}{`))
