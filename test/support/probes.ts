/**
 * A probe server on an ephemeral port of 127.0.0.1, a process of clients pressing on it, and
 * waits in real time: shared by the probe tests and `bench/probes.ts`.
 */
import { Duration, Effect, Schema } from "effect"
import { spawn } from "node:child_process"
import process from "node:process"
import { fileURLToPath } from "node:url"
import * as Probes from "../../src/Probes.ts"
import * as Worker from "../../src/Worker.ts"
import { sleep } from "./waits.ts"

export const HOST = "127.0.0.1"

/** The probe routes' options: healthy, nothing to check for readiness, `options` winning. */
export const routeOptions = (
  options: Partial<Probes.ProbeRoutesOptions> = {},
): Probes.ProbeRoutesOptions => ({
  health: Effect.succeedNone,
  readiness: [],
  probeTimeout: Duration.seconds(3),
  metrics: Effect.succeed("# TYPE up gauge\nup 1\n"),
  versionFile: "/nonexistent/version.json",
  sdkVersion: "9.9.9",
  ...options,
})

/** A probe server with `routeOptions` on an ephemeral port of `HOST`, `options` winning. */
export const start = (options: Partial<Probes.ProbeServerOptions> = {}) =>
  Probes.make({ host: HOST, port: 0, ...routeOptions(options) })

/** A probe's answer, its body parsed when it is JSON. */
export interface Reply {
  readonly status: number
  readonly headers: Headers
  readonly text: string
  readonly body: any
}

/** The `Reply` that `response` makes. */
export const reply = async (response: Response): Promise<Reply> => {
  const text = await response.text()
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    body = undefined
  }
  return { status: response.status, headers: response.headers, text, body }
}

export const sleepReal = (millis: number) => Effect.promise(() => sleep(millis))

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

/**
 * The client process of `test/fixtures/probes/connections.mjs`, for the scope: `open` makes its
 * 200 connections, `close` drops them, and `state.open` is how many the server still holds. The
 * clients run in a process of their own, so that only the server's share of the work is here.
 */
export const connectionLoad = (port: number) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const script = fileURLToPath(
        new URL("../fixtures/probes/connections.mjs", import.meta.url),
      )
      const deno = "Deno" in globalThis
      const child = spawn(
        process.execPath,
        deno ? ["run", "-A", script, String(port)] : [script, String(port)],
        { stdio: ["pipe", "pipe", "inherit"] },
      )
      const state = { open: -1 }
      child.stdout.on("data", (chunk: Uint8Array) => {
        const last = new TextDecoder().decode(chunk).trim().split("\n").at(-1)
        const n = Number(last?.split(" ")[1])
        if (Number.isFinite(n)) state.open = n
      })
      const command = (line: "open" | "close") => Effect.sync(() => child.stdin.write(`${line}\n`))
      return { child, state, open: command("open"), close: command("close") }
    }),
    ({ child }) => Effect.sync(() => void child.kill("SIGKILL")),
  )

type ConnectionLoad = Effect.Success<ReturnType<typeof connectionLoad>>

/** Drops the load's connections, and waits until they are gone. */
export const dropAll = (load: ConnectionLoad) =>
  Effect.andThen(
    load.close,
    waitForReal(() => load.state.open === 0, 5000, "the connections are dropped"),
  )

/**
 * Drops the load's connections, then makes fresh ones (the server gives each at most 5 s), and
 * waits until the server holds exactly 32 of them: the bound.
 */
export const pressFresh = (load: ConnectionLoad) =>
  Effect.gen(function* () {
    yield* dropAll(load)
    yield* load.open
    yield* waitForReal(() => load.state.open === 32, 5000, "the server holds 32 connections")
  })

/** The worker whose tasks the load presses on: a no-op, so that the server's share shows. */
export const loadWorker = Worker.make({
  name: "probe-load",
  input: Schema.Struct({}),
  output: Schema.Struct({}),
  timeout: "5 seconds",
  handler: () => Effect.succeed({}),
})
