/**
 * The probe routes and their answers, as `effect/http` routes: what the probe server serves, and
 * what an app can add to its own `HttpRouter`.
 */
import { readFile } from "node:fs/promises"
import type * as Duration from "effect/Duration"
import type * as Scope from "effect/Scope"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerError from "effect/http/HttpServerError"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { isPlainObject } from "../codec/json.ts"
import { evaluateReadiness, type Readiness, type ReadinessComponent, shared } from "./readiness.ts"

/**
 * What the probe routes read: the inputs of `routes` and `httpEffect`.
 *
 * @since 0.1.0
 * @category models
 */
export interface ProbeRoutesOptions {
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
  readonly probeTimeout: Duration.Input
  /** The Prometheus text exposition, served on `/metrics` and `/internal/metrics`. */
  readonly metrics: Effect.Effect<string>
  /** The build's version document, served on `/__version__` (default `/app/version.json`). */
  readonly versionFile?: string | undefined
  /** The SDK's version, in the `dev` document served when there is no version file. */
  readonly sdkVersion: string
}

/** See `Probes.DEFAULT_VERSION_FILE`. */
export const DEFAULT_VERSION_FILE = "/app/version.json"

/** See `Probes.METRICS_CONTENT_TYPE`. */
export const METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

const ALLOW = "GET, HEAD"

type Headers = Readonly<Record<string, string>>

/** Every answer: a probe must never be answered from a cache. */
const answer = (status: number, body: string, contentType: string, headers?: Headers) =>
  HttpServerResponse.text(body, {
    status,
    contentType,
    headers: { ...headers, "cache-control": "no-store" },
  })

const json = (status: number, body: unknown, headers?: Headers) =>
  answer(status, JSON.stringify(body), "application/json", headers)

const errorBody = (code: string, message: string, extra?: object) => ({
  status: "error",
  error: { code, message, ...extra },
})

const error = (status: number, code: string, message: string, extra?: object) =>
  json(status, errorBody(code, message, extra))

/** The answer to a path that is no probe's, whatever the method. */
const notFound: HttpServerResponse.HttpServerResponse = error(
  404,
  "NOT_FOUND",
  "No probe here: try /health, /ready, /metrics or /__version__.",
)

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

const readyAnswer = ({ components, ready }: Readiness) => {
  if (ready) return json(200, { status: "ok", components })
  const failing = Object.keys(components).filter((name) => components[name]?.status !== "ok")
  return error(503, "DEPENDENCIES_NOT_READY", `Not ready: ${failing.join(", ")}`, { components })
}

/**
 * One probe: GET and HEAD are answered (the server that writes the answer leaves out a HEAD's
 * body), any other method 405. An unexpected failure is logged and answered 500 without its
 * text; an interruption (the client went away) is left to end the request.
 */
const probe = (
  path: HttpRouter.PathInput,
  answer: Effect.Effect<HttpServerResponse.HttpServerResponse>,
): HttpRouter.Route => {
  const methodNotAllowed = json(
    405,
    errorBody("METHOD_NOT_ALLOWED", `${path} answers only GET and HEAD.`),
    { allow: ALLOW },
  )
  const guarded = Effect.catchCause(
    answer,
    (cause) =>
      Cause.hasInterruptsOnly(cause) ? Effect.failCause(cause) : Effect.as(
        Effect.logWarning(`The probe ${path} failed unexpectedly`, cause),
        error(500, "PROBE_FAILED", `The probe ${path} failed unexpectedly.`),
      ),
  )
  return HttpRouter.route(
    "*",
    path,
    (request) =>
      request.method === "GET" || request.method === "HEAD"
        ? guarded
        : Effect.succeed(methodNotAllowed),
  )
}

/** See `Probes.routes`. */
export const routes = (
  options: ProbeRoutesOptions,
): Effect.Effect<ReadonlyArray<HttpRouter.Route>, never, Scope.Scope> =>
  Effect.map(shared(evaluateReadiness(options.readiness, options.probeTimeout)), (readiness) => {
    const metrics = Effect.map(options.metrics, (body) => answer(200, body, METRICS_CONTENT_TYPE))
    const version = readVersion(options.versionFile ?? DEFAULT_VERSION_FILE, options.sdkVersion)
    return [
      probe(
        "/health",
        Effect.map(options.health, (problem) =>
          Option.match(problem, {
            onNone: () => json(200, { status: "ok" }),
            onSome: ({ code, message }) => error(503, code, message),
          })),
      ),
      probe("/ready", Effect.map(readiness, readyAnswer)),
      probe("/metrics", metrics),
      probe("/internal/metrics", metrics),
      probe("/__version__", Effect.map(version, (doc) => json(200, doc))),
    ]
  })

/**
 * The probe paths exactly as written: the router's defaults would also route `/HEALTH`,
 * `/health/` and `//health`, which the probe server has always answered 404.
 */
const EXACT_PATHS = {
  caseSensitive: true,
  ignoreTrailingSlash: false,
  ignoreDuplicateSlashes: false,
}

const isRouteNotFound = (error: unknown): boolean =>
  HttpServerError.isHttpServerError(error) && error.reason._tag === "RouteNotFound"

/**
 * The probe routes as the whole app the probe server serves: `routes` matched exactly as written
 * (case and trailing slash included), and 404 `NOT_FOUND` to any other path, whatever the method.
 * An app can serve it from its own server, e.g. on a port of its own (`HttpServer.serve`), or
 * through `HttpEffect.toWebHandler`.
 *
 * Scoped, as `routes` is: the app is built once, then answers each request.
 *
 * Public as `Probes.httpEffect`.
 *
 * @since 0.2.0
 * @category routes
 */
export const httpEffect = (
  options: ProbeRoutesOptions,
): Effect.Effect<
  Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    never,
    HttpServerRequest.HttpServerRequest | Scope.Scope
  >,
  never,
  Scope.Scope
> =>
  Effect.gen(function* () {
    const probes = yield* routes(options)
    const router = yield* Effect.provideService(
      HttpRouter.make,
      HttpRouter.RouterConfig,
      EXACT_PATHS,
    )
    yield* router.addAll(probes)
    // A probe never fails (its failures are answered 500): the router's only failure is a path
    // that is no probe's.
    return Effect.catch(
      router.asHttpEffect(),
      (e) => isRouteNotFound(e) ? Effect.succeed(notFound) : Effect.die(e),
    )
  })
