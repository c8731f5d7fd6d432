/**
 * The Prometheus text exposition (format 0.0.4) of every metric in Effect's metric registry
 * (`Metric.MetricRegistry`, Effect's global one unless a program provides its own): the SDK's
 * own (see `WorkerMetrics`) and any a handler declares with Effect's `Metric`.
 *
 * Effect metric types map as follows: a counter is a `counter` and keeps its name (the SDK's
 * counters are already named `…_total`), a gauge a `gauge`, a histogram a `histogram`
 * (`_bucket{le}` cumulative up to `le="+Inf"`, then `_sum` and `_count`), a summary a `summary`
 * (`{quantile}`, `_sum`, `_count`; a quantile with no observation yet is `NaN`), and a frequency
 * a `counter` with one series per observed word in the label `key`.
 *
 * The output is deterministic: families sorted by name, series by their labels, buckets by
 * bound, frequency words by word. Metric and label names are mapped onto Prometheus' charset
 * (any other character becomes `_`, a leading digit gets a `_` in front); label values are
 * escaped (backslash, double quote, line feed) and help texts too (backslash, line feed). Where
 * two registry entries end up in the same family with different Prometheus types, the family
 * keeps the first type (counter, gauge, histogram, summary) and the others are left out; where
 * they end up as the same series (entries that differ only by description), the first is kept.
 * A user label named like the one the format adds (`le` on a histogram, `quantile` on a
 * summary, `key` on a frequency) is left out. Nothing is added: no task, client or service label.
 *
 * @since 0.1.0
 */
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"

type FamilyType = "counter" | "gauge" | "histogram" | "summary"

const typeRank: Record<FamilyType, number> = { counter: 0, gauge: 1, histogram: 2, summary: 3 }

type Labels = ReadonlyArray<readonly [name: string, value: string]>

interface Series {
  /** The rendered labels of the series, without the braces: its identity and sort key. */
  readonly id: string
  readonly lines: ReadonlyArray<string>
}

interface Family {
  readonly name: string
  readonly type: FamilyType
  help: string | undefined
  readonly series: Map<string, Series>
}

const metricName = (name: string): string => {
  const s = name.replace(/[^a-zA-Z0-9_:]/g, "_")
  return s === "" ? "_" : /^[0-9]/.test(s) ? `_${s}` : s
}

const labelName = (name: string): string => {
  const s = name.replace(/[^a-zA-Z0-9_]/g, "_")
  return s === "" ? "_" : /^[0-9]/.test(s) ? `_${s}` : s
}

const escapeLabelValue = (value: string): string =>
  value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")

const escapeHelp = (help: string): string => help.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")

/**
 * A sample value as Prometheus writes it: `+Inf`, `-Inf`, `NaN`, or the shortest decimal
 * (`1e+21` style exponents are valid floats to Prometheus' parser).
 */
const formatNumber = (n: number | bigint): string => {
  if (typeof n === "bigint") return n.toString()
  if (Number.isNaN(n)) return "NaN"
  if (n === Infinity) return "+Inf"
  if (n === -Infinity) return "-Inf"
  return String(n)
}

/** The series' labels: names mapped onto the charset, sorted, the first of a duplicate kept. */
const userLabels = (
  attributes: Metric.Metric.AttributeSet | undefined,
  reserved: string | undefined,
): Labels => {
  const byName = new Map<string, string>()
  const sorted = Object.entries(attributes ?? {})
    .map(([name, value]) => [labelName(name), value] as const)
    .sort((a, b) => compare(a[0], b[0]))
  for (const [name, value] of sorted) {
    if (name !== reserved && !byName.has(name)) byName.set(name, value)
  }
  return Array.from(byName)
}

const compare = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

const renderLabels = (labels: Labels): string =>
  labels.map(([name, value]) => `${name}="${escapeLabelValue(value)}"`).join(",")

/** `name{labels,extra} value` */
const sample = (name: string, labels: string, extra: string, value: number | bigint): string => {
  const all = labels === "" ? extra : extra === "" ? labels : `${labels},${extra}`
  return `${name}${all === "" ? "" : `{${all}}`} ${formatNumber(value)}`
}

const familyType: Record<Metric.Metric.Type, FamilyType> = {
  Counter: "counter",
  Frequency: "counter",
  Gauge: "gauge",
  Histogram: "histogram",
  Summary: "summary",
}

/** The series one registry entry contributes to its family. */
const seriesOf = (name: string, snapshot: Metric.Metric.Snapshot): ReadonlyArray<Series> => {
  switch (snapshot.type) {
    case "Counter":
    case "Gauge": {
      const labels = renderLabels(userLabels(snapshot.attributes, undefined))
      const value = snapshot.type === "Counter" ? snapshot.state.count : snapshot.state.value
      return [{ id: labels, lines: [sample(name, labels, "", value)] }]
    }
    case "Frequency": {
      const labels = userLabels(snapshot.attributes, "key")
      return Array.from(snapshot.state.occurrences).map(([word, count]) => {
        const all = renderLabels(
          [...labels, ["key", word] as const].sort((a, b) => compare(a[0], b[0])),
        )
        return { id: all, lines: [sample(name, all, "", count)] }
      })
    }
    case "Histogram": {
      const { state } = snapshot
      const labels = renderLabels(userLabels(snapshot.attributes, "le"))
      const lines: Array<string> = []
      const buckets = [...state.buckets].sort((a, b) => a[0] - b[0])
      for (const [bound, count] of buckets) {
        lines.push(sample(`${name}_bucket`, labels, `le="${formatNumber(bound)}"`, count))
      }
      if (buckets.length === 0 || buckets[buckets.length - 1]![0] !== Infinity) {
        lines.push(sample(`${name}_bucket`, labels, `le="+Inf"`, state.count))
      }
      lines.push(sample(`${name}_sum`, labels, "", state.sum))
      lines.push(sample(`${name}_count`, labels, "", state.count))
      return [{ id: labels, lines }]
    }
    case "Summary": {
      const { state } = snapshot
      const labels = renderLabels(userLabels(snapshot.attributes, "quantile"))
      const lines: Array<string> = []
      for (const [q, value] of [...state.quantiles].sort((a, b) => a[0] - b[0])) {
        lines.push(sample(name, labels, `quantile="${formatNumber(q)}"`, value ?? NaN))
      }
      lines.push(sample(`${name}_sum`, labels, "", state.sum))
      lines.push(sample(`${name}_count`, labels, "", state.count))
      return [{ id: labels, lines }]
    }
  }
}

/**
 * The text exposition of a snapshot of the registry (`Metric.snapshot`), as {@link exposition}
 * writes it: empty when there is no metric, else ending with a line feed.
 *
 * @since 0.1.0
 * @category codecs
 */
export const render = (snapshots: ReadonlyArray<Metric.Metric.Snapshot>): string => {
  // Sorted first, so that which entry wins a conflict does not depend on registration order.
  const entries = snapshots
    .map((snapshot) => ({
      name: metricName(snapshot.id),
      type: familyType[snapshot.type],
      description: snapshot.description ?? "",
      snapshot,
    }))
    .sort((a, b) =>
      compare(a.name, b.name) || typeRank[a.type] - typeRank[b.type] ||
      compare(a.description, b.description)
    )
  const families = new Map<string, Family>()
  for (const { description, name, snapshot, type } of entries) {
    let family = families.get(name)
    if (family === undefined) {
      family = { name, type, help: undefined, series: new Map() }
      families.set(name, family)
    }
    if (family.type !== type) continue
    if (family.help === undefined && description !== "") family.help = description
    for (const series of seriesOf(name, snapshot)) {
      if (!family.series.has(series.id)) family.series.set(series.id, series)
    }
  }
  const out: Array<string> = []
  for (const family of families.values()) {
    if (family.series.size === 0) continue
    if (family.help !== undefined) out.push(`# HELP ${family.name} ${escapeHelp(family.help)}`)
    out.push(`# TYPE ${family.name} ${family.type}`)
    const series = Array.from(family.series.values()).sort((a, b) => compare(a.id, b.id))
    for (const s of series) out.push(...s.lines)
  }
  return out.length === 0 ? "" : `${out.join("\n")}\n`
}

/**
 * The text exposition of every metric in the registry of the context it runs in (Effect's
 * global one unless `Metric.MetricRegistry` is provided), for `GET /metrics`.
 *
 * @since 0.1.0
 * @category codecs
 */
export const exposition: Effect.Effect<string> = Effect.map(Metric.snapshot, render)
