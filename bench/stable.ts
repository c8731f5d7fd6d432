/**
 * How a bench says its medians are stable: the median of the runs so far, after each run, and the
 * run from which it stayed within a margin of the last one.
 */

export const median = (xs: ReadonlyArray<number>): number =>
  [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/**
 * The number of runs after which the median of the runs so far stayed within `margin(final)` of
 * the final median: `xs.length` if only the last one did.
 */
export const settledAfter = (
  xs: ReadonlyArray<number>,
  margin: (final: number) => number,
): number => {
  const final = median(xs)
  let from = xs.length
  for (let i = xs.length; i >= 1; i--) {
    if (Math.abs(median(xs.slice(0, i)) - final) > margin(final)) break
    from = i
  }
  return from
}
