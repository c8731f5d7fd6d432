/**
 * Issue 15, point 3: slow clients must not blind `/health`. 64 slowloris connections, each
 * replaced as soon as it is closed, from a process of their own, keep the probe server's 32
 * slots full for 20 s (and the 32 more it holds for a new socket's grace), while a liveness probe
 * asks `/health` once a second. Checks in real time, so it runs with nothing beside it
 * (`npm run test:alone`). Deno accepts all the connections waiting before it reads the new ones
 * (see `src/Probes.ts`): a probe in its grace gives way only when twice the slots are held.
 *
 * The sockets the server holds are counted from this process's open file descriptors (Linux
 * only): a socket accepted and not yet closed has one, a connection still waiting to be
 * accepted has none, and between checks the server's are this process's only TCP sockets but
 * for its listening one.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { readdirSync, readFileSync, readlinkSync } from "node:fs"
import process from "node:process"
import { fileURLToPath } from "node:url"
import { DEFAULT_MAX_CONNECTIONS } from "../../src/Probes.ts"
import { HOST, sleepReal, start, waitForReal } from "../support/probes.ts"

const ATTACKERS = 64
const CHECKS = 20

/**
 * The TCP sockets this process has open: its socket descriptors but for Unix sockets (a child's
 * standard streams are Unix sockets on Node, and Deno opens some of its own).
 */
const tcpSockets = () => {
  const unix = new Set(
    readFileSync("/proc/self/net/unix", "utf8").split("\n").map((line) =>
      line.trim().split(/\s+/)[6]
    ),
  )
  let n = 0
  for (const fd of readdirSync("/proc/self/fd")) {
    try {
      const link = readlinkSync(`/proc/self/fd/${fd}`)
      if (link.startsWith("socket:[") && !unix.has(link.slice(8, -1))) n++
    } catch {
      // Closed since it was listed.
    }
  }
  return n
}

/**
 * The client process of `test/fixtures/probes/slowloris.mjs`, for the scope: `start` begins the
 * connections, and `state.connects` is how many it has made so far.
 */
const slowloris = (port: number) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const script = fileURLToPath(new URL("../fixtures/probes/slowloris.mjs", import.meta.url))
      const args = [script, String(port), String(ATTACKERS), "100", "60000"]
      const child = spawn(
        process.execPath,
        "Deno" in globalThis ? ["run", "-A", ...args] : args,
        { stdio: ["pipe", "pipe", "inherit"] },
      )
      const state = { connects: 0 }
      child.stdout.on("data", (chunk: Uint8Array) => {
        const last = new TextDecoder().decode(chunk).trim().split("\n").at(-1)
        const n = Number(last?.split(" ")[1])
        if (Number.isFinite(n)) state.connects = n
      })
      return { child, state, start: Effect.sync(() => child.stdin.write("start\n")) }
    }),
    ({ child }) => Effect.sync(() => void child.kill("SIGKILL")),
  )

/** One liveness check: GET /health, given 1 s; its status, or the error's name. */
const check = (port: number) =>
  Effect.promise(async () => {
    try {
      const response = await fetch(`http://${HOST}:${port}/health`, {
        signal: AbortSignal.timeout(1000),
      })
      await response.text()
      return response.status
    } catch (e) {
      return e instanceof Error ? e.name : String(e)
    }
  })

describe("Probes", () => {
  it.live(
    `/health answers while ${ATTACKERS} reconnecting slowloris connections keep every slot taken`,
    () =>
      Effect.gen(function* () {
        const cap = DEFAULT_MAX_CONNECTIONS
        const { port } = yield* start()
        expect(yield* check(port)).toBe(200)
        const load = yield* slowloris(port)
        // The TCP sockets of this process other than those the server holds (the listening one):
        // the check's are closed an instant after its answer.
        yield* sleepReal(200)
        const others = tcpSockets()
        const held = () => tcpSockets() - others
        yield* load.start
        yield* waitForReal(() => held() >= cap, 5000, `the server holds ${cap} sockets`)

        // The sockets held, sampled every 20 ms between checks (a check opens two sockets).
        let checking = false
        let samples = 0
        let full = 0
        let over = 0
        let most = 0
        const sampler = setInterval(() => {
          if (checking) return
          const n = held()
          samples++
          if (n >= cap) full++
          if (n > cap) over++
          most = Math.max(most, n)
        }, 20)
        yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(sampler)))

        const connectsBefore = load.state.connects
        const began = Date.now()
        const results: Array<{ status: number | string; millis: number }> = []
        for (let i = 0; i < CHECKS; i++) {
          yield* sleepReal(Math.max(0, began + i * 1000 - Date.now()))
          checking = true
          const asked = Date.now()
          const status = yield* check(port)
          results.push({ status, millis: Date.now() - asked })
          // Let the check's sockets close before sampling again.
          yield* sleepReal(50)
          checking = false
        }
        yield* sleepReal(Math.max(0, began + CHECKS * 1000 - Date.now()))
        clearInterval(sampler)
        const seconds = (Date.now() - began) / 1000
        const connects = load.state.connects - connectsBefore

        const answered = results.filter((r) => r.status === 200).length
        console.log(
          `Probes slowloris: /health answered 200 to ${answered}/${CHECKS} checks over ${
            seconds.toFixed(1)
          } s (${results.map((r) => `${r.status} ${r.millis}ms`).join(", ")}); sockets held ` +
            `at most ${most}, ${cap} or more in ${full}/${samples} samples, more in ${over}; ${
              Math.round(connects / seconds)
            } slowloris connections/s`,
        )
        expect(answered).toBeGreaterThanOrEqual(CHECKS - 1)
        // The hard limit: the sockets over the cap are each in their grace.
        expect(most).toBeLessThanOrEqual(2 * cap)
        // The load was on throughout: every slot was taken in nearly every sample.
        expect(full).toBeGreaterThanOrEqual(samples * 0.9)
      }).pipe(Effect.scoped),
    60_000,
  )
})
