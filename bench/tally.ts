/**
 * A loop's settled tasks, as the RabbitMQ benches count them (`bench/loops.ts`, the contenders of
 * `bench/compare.ts`): `settle` as each one is, `all` once every one is, and the run's rate and
 * its process's CPU from its first task settled to its last. `all` is rejected when no task
 * settles for a minute (a broker stopped, a loop stuck), rather than waiting for ever.
 */
import process from "node:process"

/** What one loop's run measured, from its first task settled to its last. */
export interface Run {
  /** Tasks a second. */
  readonly rate: number
  /** This process's CPU time (user and system, every thread) per task, in µs. */
  readonly cpu: number
}

/** Told as a loop's first task is settled and as its last is: a profile's window. */
export interface Window {
  readonly first?: () => void
  readonly last?: () => void
}

const STALL_MS = 60_000

export const tally = (tasks: number, window: Window = {}) => {
  let settled = 0
  let first = 0
  let last = 0
  let firstCpu = process.cpuUsage()
  let cpu = 0
  let done!: () => void
  let stalled!: (error: Error) => void
  const all = new Promise<void>((resolve, reject) => {
    done = resolve
    stalled = reject
  })
  const giveUp = () =>
    stalled(new Error(`stalled: ${settled} of ${tasks} tasks settled, none for ${STALL_MS} ms`))
  let watchdog = setTimeout(giveUp, STALL_MS)
  const stop = () => clearTimeout(watchdog)
  return {
    settle: () => {
      last = performance.now()
      if (++settled === 1) {
        first = last
        firstCpu = process.cpuUsage()
        window.first?.()
      }
      if (settled === tasks) {
        const used = process.cpuUsage(firstCpu)
        cpu = used.user + used.system
        stop()
        window.last?.()
        done()
      } else if (settled % 256 === 0) {
        stop()
        watchdog = setTimeout(giveUp, STALL_MS)
      }
    },
    all: all.finally(stop),
    run: (): Run => ({
      rate: (tasks - 1) / ((last - first) / 1000),
      cpu: cpu / (tasks - 1),
    }),
  }
}
