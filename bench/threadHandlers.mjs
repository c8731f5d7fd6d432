// The threaded handlers of bench/threads.ts: a no-op, and `ms` milliseconds of busy CPU.
export const noop = () => ({ ok: true })

export const burn = (input) => {
  const until = Date.now() + input.ms
  while (Date.now() < until) {
    // busy
  }
  return { ok: true }
}
