/**
 * The probe server's `node:http` side (Node and Deno alike): it serves an `effect/http` app (an
 * `Effect` of the answer to the `HttpServerRequest` in context) as Effect's own servers do
 * (`HttpEffect.toHandled`, the answer written to node's response), without
 * `@effect/platform-node`, within the bounds of `ProbeSockets`.
 */
import * as Http from "node:http"
import type { Socket } from "node:net"
import type * as Scope from "effect/Scope"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as HttpEffect from "effect/http/HttpEffect"
import * as HttpServerError from "effect/http/HttpServerError"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import type * as HttpServerResponse from "effect/http/HttpServerResponse"
import { missingNetPermission } from "../../Process.ts"
import { ProbeServerError } from "../../WorkerError.ts"
import { ProbeSockets, type SocketBounds } from "./sockets.ts"

/** The most a closing server waits for its sockets (it destroys them first). */
const CLOSE_BOUND = Duration.seconds(2)

/**
 * A request node:http has read, as the web `Request` that `HttpServerRequest.fromWeb` takes: its
 * method and target as sent. The Fetch standard forbids constructing a `Request` with TRACE or
 * TRACK, which a probe path still answers 405, and a target need not be a URL's path (`*`), so
 * the `Request` is built on a fixed URL and shows node's method and target instead. Its body is
 * left unread: no probe reads one, and the connection closes after the answer.
 *
 * The class is made at the first request, not as this module loads: on Node, the global
 * `Request` loads Node's fetch (undici) when first read, 20 – 50 ms of every start of a process
 * (bench/lifecycle.ts), which a job-mode pod's first task would wait for.
 */
const incomingRequestClass = () =>
  class IncomingRequest extends Request {
    private readonly incoming: Http.IncomingMessage

    constructor(incoming: Http.IncomingMessage) {
      const raw = incoming.rawHeaders
      const headers: Array<[string, string]> = []
      for (let i = 0; i + 1 < raw.length; i += 2) headers.push([raw[i]!, raw[i + 1]!])
      super("http://probe/", { headers })
      this.incoming = incoming
    }
    override get method(): string {
      return this.incoming.method ?? "GET"
    }
    override get url(): string {
      return this.incoming.url ?? "/"
    }
  }

let IncomingRequest: ReturnType<typeof incomingRequestClass> | undefined

const incomingRequest = (incoming: Http.IncomingMessage): Request =>
  new (IncomingRequest ??= incomingRequestClass())(incoming)

/**
 * Writes the app's answer: its status, its headers (`content-length` among them) and its bytes
 * (no body for HEAD, nor for the bodiless answers `HttpEffect.toHandled` gives when the request
 * ends otherwise), unless the client has gone.
 */
const write = (
  req: Http.IncomingMessage,
  res: Http.ServerResponse,
  response: HttpServerResponse.HttpServerResponse,
) => {
  if (res.headersSent || res.destroyed) return
  res.writeHead(response.status, {
    ...response.headers,
    // One request per connection: a socket is freed as soon as it is answered.
    connection: "close",
  })
  const body = response.body
  res.end(req.method !== "HEAD" && body._tag === "Uint8Array" ? body.body : undefined)
}

const bindError = (address: string, e: Error & { code?: string }) =>
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
  })

/** Listens until the scope ends; then closes the server and its sockets, bounded. */
const listen = (server: Http.Server, sockets: ProbeSockets, host: string, port: number) =>
  Effect.acquireRelease(
    Effect.callback<void, ProbeServerError>((resume) => {
      const missing = missingNetPermission(host, port)
      if (missing !== undefined) {
        return resume(Effect.fail(new ProbeServerError({ reason: "bind", message: missing })))
      }
      const onError = (e: Error) => {
        server.off("listening", onListening)
        resume(Effect.fail(bindError(`${host}:${port}`, e)))
      }
      const onListening = () => {
        server.off("error", onError)
        resume(Effect.void)
      }
      server.once("error", onError)
      server.once("listening", onListening)
      server.listen({ port, host })
      return Effect.sync(() => server.close())
    }),
    () =>
      Effect.callback<void>((resume) => {
        server.close(() => resume(Effect.void))
        sockets.dropAll()
      }).pipe(Effect.interruptible, Effect.timeoutOption(CLOSE_BOUND)),
  )

/**
 * Serves `app` on `host:port` until the scope ends; returns the port listened on (the ephemeral
 * one when `port` is 0).
 */
export const serve = (
  app: Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    never,
    HttpServerRequest.HttpServerRequest | Scope.Scope
  >,
  options: SocketBounds & { readonly host: string; readonly port: number },
): Effect.Effect<number, ProbeServerError, Scope.Scope> =>
  Effect.gen(function* () {
    // Fibers of requests: interrupted when the scope ends, after the server (finalizers run in
    // reverse order).
    const run = yield* FiberSet.makeRuntime<never>()
    const sockets = new ProbeSockets(options)
    const server = Http.createServer((req, res) => {
      if (!sockets.admit(req.socket)) return
      const request = HttpServerRequest.fromWeb(incomingRequest(req))
      const fiber = run(Effect.provideService(
        HttpEffect.toHandled(app, (_, response) => Effect.sync(() => write(req, res, response))),
        HttpServerRequest.HttpServerRequest,
        request,
      ))
      // A client gone (or a socket past its time) no longer needs the answer.
      res.on(
        "close",
        () => fiber.interruptUnsafe(undefined, HttpServerError.ClientAbort.annotation),
      )
    })
    server.on("connection", (socket: Socket) => sockets.accept(socket))
    // A malformed request: no answer is owed, and the socket's slot is freed at once.
    server.on("clientError", (_error: Error, socket: Socket) => sockets.drop(socket))

    yield* listen(server, sockets, options.host, options.port)
    const address = `${options.host}:${options.port}`
    // An error after listening (e.g. too many open files on accept) must not crash the process.
    server.on(
      "error",
      (e: Error) =>
        run(Effect.logWarning(`The probe server on ${address} failed to accept a connection`, e)),
    )

    const bound = server.address()
    const port = typeof bound === "object" && bound !== null ? bound.port : options.port
    yield* Effect.logDebug(`The probe server is listening on ${options.host}:${port}`)
    return port
  })
