/**
 * The computation of examples/threads/worker.ts, run on a thread of the worker's pool: a score
 * that costs CPU (a hash of the text, `rounds` times), with progress on the way. The event loop
 * of the worker stays free meanwhile: heartbeats, confirms and probes go on.
 */
import type { ThreadContext } from "../../src/Thread.ts"

export const score = async (
  input: { readonly text: string; readonly rounds?: number | undefined },
  ctx: ThreadContext,
): Promise<{ readonly score: number }> => {
  const rounds = input.rounds ?? 20_000_000
  const step = Math.max(1, Math.floor(rounds / 4))
  let hash = 0
  for (let i = 0; i < rounds; i++) {
    hash = (hash * 31 + input.text.charCodeAt(i % input.text.length)) >>> 0
    if (i > 0 && i % step === 0) await ctx.progress(i / rounds)
  }
  ctx.logger.info("scored", { rounds })
  return { score: hash }
}
