/**
 * Test support: waits in real time, as Promises, for the tests that drive real processes and the
 * real broker (`logs.ts` has the waits on Effect's scheduler, which a TestClock may drive). No
 * Effect here, so that the chaos scripts use them too.
 */

/** Resolves after `ms` of real time. */
export const sleep = (ms: number): Promise<void> =>
  new Promise<void>((resolve) => setTimeout(resolve, ms))

export interface PollOptions {
  /** How long to poll before giving up, in ms. */
  readonly ms: number
  /** The pause between two polls, in ms: 50 unless said. */
  readonly every?: number
  /** What the error adds when it gives up: the output of a process, the last value read. */
  readonly said?: () => string
}

/**
 * Polls `check` until it gives a value (anything but `undefined` or `false`), and resolves with
 * that value; after `options.ms`, rejects naming `what`. A `check` that throws ends the wait with
 * its error (a process that ended while it was awaited).
 */
export const pollUntil = async <A>(
  what: string,
  check: () => A | undefined | false | Promise<A | undefined | false>,
  { ms, every = 50, said = () => "" }: PollOptions,
): Promise<A> => {
  const deadline = Date.now() + ms
  for (;;) {
    const value = await check()
    if (value !== undefined && value !== false) return value
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms${said()}`)
    await sleep(every)
  }
}
