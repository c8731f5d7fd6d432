// The parser ships no types: test/support/prometheus.ts types what it returns.
declare module "parse-prometheus-text-format" {
  const parsePrometheusTextFormat: (text: string) => unknown
  export default parsePrometheusTextFormat
}
