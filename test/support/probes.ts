/**
 * A probe server on an ephemeral port of 127.0.0.1, and waits in real time: shared by
 * `test/Probes.test.ts` and the throughput comparison of `test/timed/Probes.test.ts`.
 */
import { Duration, Effect } from "effect"
import * as Probes from "../../src/Probes.ts"

export const HOST = "127.0.0.1"

export const start = (options: Partial<Probes.ProbeServerOptions> = {}) =>
  Probes.make({
    host: HOST,
    port: 0,
    health: Effect.succeedNone,
    readiness: [],
    probeTimeout: Duration.seconds(3),
    metrics: Effect.succeed("# TYPE up gauge\nup 1\n"),
    versionFile: "/nonexistent/version.json",
    sdkVersion: "9.9.9",
    ...options,
  })

export const sleepReal = (millis: number) =>
  Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, millis)))

/** Polls `check` in real time, every 10 ms, for at most `millis`. */
export const waitForReal = (check: () => boolean, millis: number, what: string) =>
  Effect.gen(function* () {
    const deadline = Date.now() + millis
    while (!check()) {
      if (Date.now() > deadline) {
        return yield* Effect.die(new Error(`Gave up waiting until ${what}`))
      }
      yield* sleepReal(10)
    }
  })
