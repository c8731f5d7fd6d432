/**
 * How late a periodic check ran: the time a blocked event loop held its timer. Every timer and
 * every socket read of the process waited alike, so a watchdog must not count that time as the
 * broker's (a confirm or a heartbeat it was waiting for may sit unread in the socket's buffer).
 */

/**
 * A clock of lateness for a check run every `periodMillis` from `startMillis` (else from its
 * first run): given the time of each run, it says how much later than due that run came (0 for
 * one on time or early).
 */
export const lateness = (
  periodMillis: number,
  startMillis?: number,
): (nowMillis: number) => number => {
  let last = startMillis
  return (now) => {
    const late = last === undefined ? 0 : now - last - periodMillis
    last = now
    return late > 0 ? late : 0
  }
}
