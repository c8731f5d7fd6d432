/**
 * The probe server: `/health`, `/ready`, `/metrics` (and `/internal/metrics`) and `/__version__`
 * over `node:http` (Node and Deno alike), up for as long as its scope.
 *
 * It is bounded so that it can never delay task processing. With N = `maxConnections` (32): at
 * most N requests are answered at once, and at most N sockets are held past their first
 * `connectionGrace` (50 ms), so at most 2N sockets at once, and more than N only while some
 * are in their grace, hence only while new connections keep coming. Each socket lives at most
 * `connectionTimeout` (reading the request, writing the answer and closing, whatever the client
 * does), every answer closes its connection, and nothing it does is synchronous heavy work.
 *
 * And it is bounded so that slow clients cannot blind it: a liveness probe sends its whole
 * request at once, so a connection whose request head has not arrived yet is the one that gives
 * way. Such a connection is dropped after `headerTimeout`. When N sockets are held, a new
 * connection closes the oldest of them past its grace to take its place; one in its grace may
 * hold a request that the runtime has not read yet, so it gives way only when 2N sockets are
 * held, the oldest first. A request that arrives while N are being answered is closed
 * unanswered. Clients that reconnect as soon as they are closed thus evict one another in turn,
 * at most one eviction per connection accepted (no more work than refusing it), while a probe,
 * which sends its request as it connects, keeps its socket until its request is read or 2N - 1
 * newer connections have come. Node reads a new socket before it accepts more than one other
 * (measured). Deno accepts all the connections waiting before it reads the new ones: against 64
 * reconnecting slowloris clients and N = 32, a probe that gave way after N - 1 newer connections
 * was closed unread 3 to 7 times in 100, and after 2N - 1, never in 100 (against 128 such
 * clients, 7 times in 80; on Node, never). Refusing new connections at 2N rather than closing
 * one in its grace let 64 such clients, which then held every socket, refuse half the probes,
 * on Node and on Deno alike.
 *
 * @since 0.1.0
 */
import { Buffer } from "node:buffer"
import { readFile } from "node:fs/promises"
import * as Http from "node:http"
import type { Socket } from "node:net"
import type { Scope } from "effect"
import { Cause, Duration, Effect, Exit, Fiber, FiberId, FiberSet, Option, Predicate } from "effect"
import { isPlainObject } from "./internal/json.ts"
import { ProbeServerError } from "./WorkerError.ts"

/**
 * The probe server's inputs: where to listen, and what each probe reads.
 *
 * @since 0.1.0
 * @category models
 */
export interface ProbeServerOptions {
  /** `HEALTH_CHECK_HOST`. */
  readonly host: string
  /** `HEALTH_CHECK_PORT`; 0 listens on an ephemeral port (see the returned `port`). */
  readonly port: number
  /**
   * `/health`: `None` is healthy; `Some` answers 503 with this code and message (e.g.
   * `TASK_OVERRUN`). Consults no dependency.
   */
  readonly health: Effect.Effect<Option.Option<{ readonly code: string; readonly message: string }>>
  /**
   * `/ready`: the components, evaluated in parallel, each within `probeTimeout`. The lifecycle
   * passes `broker` and `draining` (reserved names) and then the worker's own probes. A
   * component failing with a `ProbeError` shows its message; any other failure shows only its
   * class name.
   */
  readonly readiness: ReadonlyArray<ReadinessComponent>
  /** `WORKER_PROBE_TIMEOUT_S`: the most one readiness component may take. */
  readonly probeTimeout: Duration.DurationInput
  /** The Prometheus text exposition, served on `/metrics` and `/internal/metrics`. */
  readonly metrics: Effect.Effect<string>
  /** The build's version document, served on `/__version__` (default `/app/version.json`). */
  readonly versionFile?: string | undefined
  /** The SDK's version, in the `dev` document served when there is no version file. */
  readonly sdkVersion: string
  /**
   * The most requests answered at once, and the most sockets held past their `connectionGrace`
   * (default 32): at most twice as many sockets are held at once. When as many sockets are held,
   * a new connection closes the oldest one past its grace whose request head has not arrived yet;
   * at twice as many, the oldest such one still in its grace. A request that arrives while as
   * many are being answered is closed unanswered.
   */
  readonly maxConnections?: number | undefined
  /** The most one socket may live, request and answer included (default 5 seconds). */
  readonly connectionTimeout?: Duration.DurationInput | undefined
  /** The most a socket may take to send its request head (default 2 seconds). */
  readonly headerTimeout?: Duration.DurationInput | undefined
  /**
   * How long a new socket is spared (default 50 ms): in its grace, it gives way to a new
   * connection only when twice `maxConnections` sockets are held. As each grace ends, the oldest
   * sockets past their grace whose request head has not arrived are closed, down to
   * `maxConnections` sockets.
   */
  readonly connectionGrace?: Duration.DurationInput | undefined
}

/**
 * One readiness component: `check` succeeds when the component is ready.
 *
 * @since 0.1.0
 * @category models
 */
export interface ReadinessComponent {
  readonly name: string
  readonly check: Effect.Effect<void, unknown>
}

/**
 * A running probe server.
 *
 * @since 0.1.0
 * @category models
 */
export interface ProbeServer {
  /** The port listened on (the ephemeral one when `port` was 0). */
  readonly port: number
}

/**
 * One component's state in a `/ready` answer.
 *
 * @since 0.1.0
 * @category models
 */
export type ComponentStatus =
  | { readonly status: "ok" }
  | { readonly status: "error"; readonly message: string }

/**
 * The answer of one readiness evaluation.
 *
 * @since 0.1.0
 * @category models
 */
export interface Readiness {
  readonly ready: boolean
  /** Every component, in the order given. */
  readonly components: Readonly<Record<string, ComponentStatus>>
}

/**
 * The default version file (a Dockerflow `version.json` baked into the image).
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_VERSION_FILE = "/app/version.json"

/**
 * The default bound on the requests answered at once and on the sockets held past their grace
 * (at most twice as many sockets at once).
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_MAX_CONNECTIONS = 32

/**
 * The default bound on one socket's life.
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_CONNECTION_TIMEOUT: Duration.Duration = Duration.seconds(5)

/**
 * The default bound on the time a socket may take to send its request head: a probe sends it
 * at once, and a slow client must not hold a slot for long.
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_HEADER_TIMEOUT: Duration.Duration = Duration.seconds(2)

/**
 * The default time a new socket is spared: long enough for a runtime to read a request sent as
 * the connection opens (Node and Deno read one within a few milliseconds under load, measured).
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_CONNECTION_GRACE: Duration.Duration = Duration.millis(50)

/**
 * The content type of the Prometheus text exposition format.
 *
 * @since 0.1.0
 * @category constants
 */
export const METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

/** The most a closing server waits for its sockets (it destroys them first). */
const CLOSE_BOUND = Duration.seconds(2)
/** The longest `ProbeError` message shown. */
const MAX_MESSAGE_LENGTH = 512
const ALLOW = "GET, HEAD"
const PATHS = ["/health", "/ready", "/metrics", "/internal/metrics", "/__version__"] as const
type ProbePath = typeof PATHS[number]

/** A socket held by the server. */
interface Slot {
  /** Its request head has not arrived yet: it gives way to a new connection. */
  incomplete: boolean
  /** Closes it at the end of its life (`connectionTimeout`). */
  readonly deadline: ReturnType<typeof setTimeout>
  /** Closes it if its request head has not arrived by then (`headerTimeout`). */
  readonly headerDeadline: ReturnType<typeof setTimeout>
  /** In its grace (`connectionGrace`): it gives way to no new connection below the hard limit. */
  young: boolean
  /** Ends its grace. */
  readonly grace: ReturnType<typeof setTimeout>
}

interface Answer {
  readonly status: number
  readonly contentType: string
  readonly body: string
  readonly headers?: Readonly<Record<string, string>>
}

const json = (status: number, body: unknown, headers?: Record<string, string>): Answer => ({
  status,
  contentType: "application/json",
  body: JSON.stringify(body),
  ...(headers === undefined ? {} : { headers }),
})

const error = (status: number, code: string, message: string, extra?: object): Answer =>
  json(status, { status: "error", error: { code, message, ...extra } })

/**
 * How a failed component is shown: a `ProbeError`'s message, anything else by its class name
 * only (a tagged error by its tag), so that no error text leaks by accident.
 *
 * @since 0.1.0
 * @category readiness
 */
export const describeFailure = (cause: Cause.Cause<unknown>): string => {
  const failure = Cause.failureOption(cause)
  if (Option.isSome(failure)) return describeError(failure.value)
  const defect = Cause.dieOption(cause)
  if (Option.isSome(defect)) return describeError(defect.value)
  return "interrupted"
}

const describeError = (error: unknown): string => {
  if (Predicate.isTagged(error, "ProbeError") && Predicate.hasProperty(error, "message")) {
    const message = String(error.message)
    return message.length > MAX_MESSAGE_LENGTH
      ? `${message.slice(0, MAX_MESSAGE_LENGTH)}…`
      : message
  }
  if (typeof error !== "object" || error === null) return typeof error
  if (Predicate.hasProperty(error, "_tag") && typeof error._tag === "string") return error._tag
  const name = (error as { constructor?: { name?: unknown } }).constructor?.name
  return typeof name === "string" && name !== "" ? name : "Object"
}

/**
 * Evaluates readiness components in parallel, each within `timeout`. A component that does
 * not end in time is shown as timed out, and left to end in the background (its interruption
 * is not awaited).
 *
 * @since 0.1.0
 * @category readiness
 */
export const evaluateReadiness = (
  components: ReadonlyArray<ReadinessComponent>,
  timeout: Duration.DurationInput,
): Effect.Effect<Readiness> => {
  const limit = Duration.decode(timeout)
  const timedOut: ComponentStatus = {
    status: "error",
    message: `timed out after ${Duration.format(limit)}`,
  }
  return Effect.forEach(
    components,
    (component) =>
      Effect.disconnect(component.check).pipe(
        Effect.matchCause({
          onSuccess: (): ComponentStatus => ({ status: "ok" }),
          onFailure: (cause): ComponentStatus => ({
            status: "error",
            message: describeFailure(cause),
          }),
        }),
        Effect.timeoutTo({ duration: limit, onSuccess: (s) => s, onTimeout: () => timedOut }),
        Effect.map((status) => [component.name, status] as const),
      ),
    { concurrency: "unbounded" },
  ).pipe(
    Effect.map((entries) => ({
      ready: entries.every(([, s]) => s.status === "ok"),
      components: Object.fromEntries(entries),
    })),
  )
}

const readVersion = (file: string, sdkVersion: string): Effect.Effect<unknown> =>
  Effect.tryPromise(() => readFile(file, "utf8")).pipe(
    Effect.flatMap((text) => Effect.try(() => JSON.parse(text) as unknown)),
    Effect.filterOrFail(isPlainObject),
    Effect.orElseSucceed(() => ({
      source: "dev",
      version: sdkVersion,
      commit: "unknown",
      build: "dev",
    })),
  )

const isProbePath = (path: string): path is ProbePath =>
  (PATHS as ReadonlyArray<string>).includes(path)

/**
 * Starts the probe server; it stops with the scope (idle and busy sockets closed, bounded).
 * Fails with a `ProbeServerError` when it cannot listen (e.g. the port is in use).
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  options: ProbeServerOptions,
): Effect.Effect<ProbeServer, ProbeServerError, Scope.Scope> =>
  Effect.gen(function* () {
    const maxConnections = options.maxConnections ?? DEFAULT_MAX_CONNECTIONS
    const connectionTimeoutMillis = Duration.toMillis(
      Duration.decode(options.connectionTimeout ?? DEFAULT_CONNECTION_TIMEOUT),
    )
    const headerTimeoutMillis = Duration.toMillis(
      Duration.decode(options.headerTimeout ?? DEFAULT_HEADER_TIMEOUT),
    )
    const graceMillis = Duration.toMillis(
      Duration.decode(options.connectionGrace ?? DEFAULT_CONNECTION_GRACE),
    )
    const hardLimit = 2 * maxConnections
    const versionFile = options.versionFile ?? DEFAULT_VERSION_FILE
    // Fibers of requests and of readiness evaluations: interrupted when the scope closes,
    // after the server (finalizers run in reverse order).
    const run = yield* FiberSet.makeRuntime<never>()

    // Concurrent `/ready` requests share one evaluation: the first starts it in its own fiber
    // (a client that goes away does not cancel it for the others), the rest join it.
    let evaluation: Fiber.RuntimeFiber<Readiness> | undefined
    const readiness = Effect.suspend(() => {
      if (evaluation !== undefined) return Fiber.join(evaluation)
      const fiber = run(evaluateReadiness(options.readiness, options.probeTimeout))
      evaluation = fiber
      // Called at once when the evaluation has already ended.
      fiber.addObserver(() => {
        if (evaluation === fiber) evaluation = undefined
      })
      return Fiber.join(fiber)
    })

    const answer = (path: ProbePath): Effect.Effect<Answer> => {
      switch (path) {
        case "/health":
          return Effect.map(options.health, (problem) =>
            Option.match(problem, {
              onNone: () => json(200, { status: "ok" }),
              onSome: ({ code, message }) => error(503, code, message),
            }))
        case "/ready":
          return Effect.map(readiness, ({ components, ready }) => {
            if (ready) return json(200, { status: "ok", components })
            const failing = Object.keys(components).filter((name) =>
              components[name]?.status !== "ok"
            )
            return error(503, "DEPENDENCIES_NOT_READY", `Not ready: ${failing.join(", ")}`, {
              components,
            })
          })
        case "/metrics":
        case "/internal/metrics":
          return Effect.map(options.metrics, (body) => ({
            status: 200,
            contentType: METRICS_CONTENT_TYPE,
            body,
          }))
        case "/__version__":
          return Effect.map(readVersion(versionFile, options.sdkVersion), (doc) => json(200, doc))
      }
    }

    const route = (method: string, url: string): Effect.Effect<Answer> => {
      const path = url.split("?", 1)[0] ?? ""
      if (!isProbePath(path)) {
        return Effect.succeed(
          error(404, "NOT_FOUND", "No probe here: try /health, /ready, /metrics or /__version__."),
        )
      }
      if (method !== "GET" && method !== "HEAD") {
        return Effect.succeed({
          ...error(405, "METHOD_NOT_ALLOWED", `${path} answers only GET and HEAD.`),
          headers: { allow: ALLOW },
        })
      }
      return answer(path).pipe(
        Effect.catchAllCause((cause) =>
          Cause.isInterruptedOnly(cause) ? Effect.failCause(cause) : Effect.as(
            Effect.logWarning(`The probe ${path} failed unexpectedly`, cause),
            error(500, "PROBE_FAILED", `The probe ${path} failed unexpectedly.`),
          )
        ),
      )
    }

    const write = (req: Http.IncomingMessage, res: Http.ServerResponse, answer: Answer) => {
      if (res.headersSent || res.destroyed) return
      res.writeHead(answer.status, {
        ...answer.headers,
        "content-type": answer.contentType,
        "content-length": String(Buffer.byteLength(answer.body)),
        "cache-control": "no-store",
        // One request per connection: a socket is freed as soon as it is answered.
        connection: "close",
      })
      res.end(req.method === "HEAD" ? undefined : answer.body)
    }

    // The sockets held, in the order they were accepted: the first incomplete one is the oldest.
    const held = new Map<Socket, Slot>()
    // How many of them are being answered (their request head has arrived): at most
    // `maxConnections`.
    let answering = 0
    // A socket's slot is freed as it is destroyed (which closes it at once, on Node and on Deno),
    // not on its `close` event a turn later: each connection accepted in the same turn then
    // counts the sockets truly held, and evicts another one (never the same one twice).
    const release = (socket: Socket) => {
      const slot = held.get(socket)
      if (slot === undefined) return
      clearTimeout(slot.deadline)
      clearTimeout(slot.headerDeadline)
      clearTimeout(slot.grace)
      if (!slot.incomplete) answering--
      held.delete(socket)
    }
    const drop = (socket: Socket) => {
      release(socket)
      socket.destroy()
    }
    /** The oldest socket whose request head has not arrived, past its grace or not. */
    const oldestIncomplete = (pastGrace: boolean): Socket | undefined => {
      for (const [socket, slot] of held) {
        if (slot.incomplete && !(pastGrace && slot.young)) return socket
      }
      return undefined
    }
    // Over `maxConnections`, the oldest incomplete sockets past their grace give way: run as each
    // grace ends, it leaves at most `maxConnections` sockets held past their grace (those being
    // answered are at most as many).
    const trim = () => {
      while (held.size > maxConnections) {
        const victim = oldestIncomplete(true)
        if (victim === undefined) return
        drop(victim)
      }
    }
    const onConnection = (socket: Socket) => {
      if (held.size >= maxConnections) {
        // A socket in its grace may hold a request that the runtime has not read yet: the oldest
        // incomplete one past its grace gives way, and only at the hard limit one in its grace.
        const victim = oldestIncomplete(true) ??
          (held.size >= hardLimit ? oldestIncomplete(false) : undefined)
        if (victim !== undefined) drop(victim)
        // Below the hard limit, the new socket is held over the bound for its grace. At the limit,
        // at least half the sockets held are incomplete (at most `maxConnections` are answered):
        // none gives way only when `maxConnections` is 0.
        else if (held.size >= hardLimit) {
          socket.destroy()
          return
        }
      }
      const slot: Slot = {
        incomplete: true,
        young: true,
        deadline: setTimeout(() => drop(socket), connectionTimeoutMillis),
        // Cleared when its head arrives.
        headerDeadline: setTimeout(() => drop(socket), headerTimeoutMillis),
        grace: setTimeout(() => {
          slot.young = false
          trim()
        }, graceMillis),
      }
      held.set(socket, slot)
      socket.once("close", () => release(socket))
    }

    const onRequest = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
      // Its head has arrived: it is being answered, and no longer gives way (`req.socket` is the
      // socket of the `connection` event, on Node and on Deno alike).
      const slot = held.get(req.socket)
      if (slot !== undefined) {
        // As many requests are being answered as may be: this one is closed unanswered.
        if (answering >= maxConnections) {
          drop(req.socket)
          return
        }
        slot.incomplete = false
        answering++
        clearTimeout(slot.headerDeadline)
      }
      const fiber = run(route(req.method ?? "GET", req.url ?? "/"))
      fiber.addObserver((exit) => {
        if (Exit.isSuccess(exit)) write(req, res, exit.value)
        else if (!Exit.isInterrupted(exit)) {
          write(req, res, error(500, "PROBE_FAILED", "The probe failed unexpectedly."))
        }
      })
      // A client gone (or a socket past its time) no longer needs the answer.
      res.on("close", () => fiber.unsafeInterruptAsFork(FiberId.none))
    }

    const server = Http.createServer(onRequest)
    server.on("connection", onConnection)
    // A malformed request: no answer is owed, and the socket's slot is freed at once.
    server.on("clientError", (_error: Error, socket: Socket) => drop(socket))

    const address = `${options.host}:${options.port}`
    yield* Effect.acquireRelease(
      Effect.async<void, ProbeServerError>((resume) => {
        const onError = (e: Error & { code?: string }) => {
          server.off("listening", onListening)
          resume(Effect.fail(
            new ProbeServerError({
              reason: "bind",
              message: `The probe server cannot listen on ${address}: ${
                e.code === "EADDRINUSE"
                  ? "the address is already in use"
                  : e.code === "EACCES"
                  ? "permission denied"
                  : e.code === "EADDRNOTAVAIL"
                  ? "the address is not available on this host"
                  : e.message
              } (HEALTH_CHECK_HOST, HEALTH_CHECK_PORT).`,
            }),
          ))
        }
        const onListening = () => {
          server.off("error", onError)
          resume(Effect.void)
        }
        server.once("error", onError)
        server.once("listening", onListening)
        server.listen({ port: options.port, host: options.host })
        return Effect.sync(() => server.close())
      }),
      () =>
        Effect.async<void>((resume) => {
          server.close(() => resume(Effect.void))
          for (const socket of [...held.keys()]) drop(socket)
        }).pipe(Effect.interruptible, Effect.timeoutOption(CLOSE_BOUND)),
    )
    // An error after listening (e.g. too many open files on accept) must not crash the process.
    const logServerError = (e: Error) =>
      run(Effect.logWarning(`The probe server on ${address} failed to accept a connection`, e))
    server.on("error", logServerError)

    const bound = server.address()
    const port = typeof bound === "object" && bound !== null ? bound.port : options.port
    yield* Effect.logDebug(`The probe server is listening on ${options.host}:${port}`)
    return { port }
  })
