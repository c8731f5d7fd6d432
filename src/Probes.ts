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
 * way. Such a connection is dropped after `headerTimeout`, and a request that arrives while N
 * are being answered is closed unanswered. When N sockets are held, a new connection closes the
 * oldest of them past its grace to take its place. One in its grace may hold a request that the
 * runtime has not read yet (Deno accepts every connection waiting before it reads the new ones),
 * so it gives way only when 2N sockets are held, the oldest first: a probe keeps its socket until
 * its request is read or 2N - 1 newer connections have come. At 2N a new connection still takes
 * a socket's place rather than being refused, or clients that reconnect as soon as they are
 * closed would hold every socket; this way they evict one another in turn, at most one eviction
 * per connection accepted (no more work than refusing it). The trials behind these bounds are in
 * `bench/README.md` (Probe server); `test/timed/ProbesSlowloris.test.ts` keeps their result.
 *
 * The routes themselves are `effect/http` routes (`routes`, `layerRoutes`), so that an app can
 * add them to its own `HttpRouter`, and `httpEffect` is the whole app the probe server serves
 * (`src/internal/probes/server.ts`), its bounds on sockets apart
 * (`src/internal/probes/sockets.ts`).
 *
 * @since 0.1.0
 */
import type * as Cause from "effect/Cause"
import type * as Scope from "effect/Scope"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as HttpRouter from "effect/http/HttpRouter"
import * as readinessInternal from "./internal/probes/readiness.ts"
import type { Readiness, ReadinessComponent } from "./internal/probes/readiness.ts"
import * as routesInternal from "./internal/probes/routes.ts"
import type { ProbeRoutesOptions } from "./internal/probes/routes.ts"
import * as server from "./internal/probes/server.ts"
import type { ProbeServerError } from "./WorkerError.ts"

export type { ProbeRoutesOptions } from "./internal/probes/routes.ts"

/**
 * The probe server's inputs: where to listen, what each probe reads, and its bounds.
 *
 * @since 0.1.0
 * @category models
 */
export interface ProbeServerOptions extends ProbeRoutesOptions {
  /** `HEALTH_CHECK_HOST`. */
  readonly host: string
  /** `HEALTH_CHECK_PORT`; 0 listens on an ephemeral port (see the returned `port`). */
  readonly port: number
  /**
   * The most requests answered at once, and the most sockets held past their `connectionGrace`
   * (default 32): at most twice as many sockets are held at once. When as many sockets are held,
   * a new connection closes the oldest one past its grace whose request head has not arrived yet;
   * at twice as many, the oldest such one still in its grace. A request that arrives while as
   * many are being answered is closed unanswered.
   */
  readonly maxConnections?: number | undefined
  /** The most one socket may live, request and answer included (default 5 seconds). */
  readonly connectionTimeout?: Duration.Input | undefined
  /** The most a socket may take to send its request head (default 2 seconds). */
  readonly headerTimeout?: Duration.Input | undefined
  /**
   * How long a new socket is spared (default 50 ms): in its grace, it gives way to a new
   * connection only when twice `maxConnections` sockets are held. As each grace ends, the oldest
   * sockets past their grace whose request head has not arrived are closed, down to
   * `maxConnections` sockets.
   */
  readonly connectionGrace?: Duration.Input | undefined
}

export type { ReadinessComponent } from "./internal/probes/readiness.ts"

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

export type { ComponentStatus } from "./internal/probes/readiness.ts"
export type { Readiness } from "./internal/probes/readiness.ts"

/**
 * The default version file (a Dockerflow `version.json` baked into the image).
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_VERSION_FILE = routesInternal.DEFAULT_VERSION_FILE

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
export const METRICS_CONTENT_TYPE = routesInternal.METRICS_CONTENT_TYPE

/**
 * How a failed component is shown: a `ProbeError`'s message, anything else by its class name
 * only (a tagged error by its tag), so that no error text leaks by accident.
 *
 * @since 0.1.0
 * @category codecs
 */
export const describeFailure: (cause: Cause.Cause<unknown>) => string =
  readinessInternal.describeFailure

/**
 * Evaluates readiness components in parallel, each within `timeout`. A component that does
 * not end in time is shown as timed out, and left to end in the background (its interruption
 * is not awaited).
 *
 * @since 0.1.0
 * @category combinators
 */
export const evaluateReadiness: (
  components: ReadonlyArray<ReadinessComponent>,
  timeout: Duration.Input,
) => Effect.Effect<Readiness> = readinessInternal.evaluateReadiness

/**
 * The probe routes, for an app to add to its own `effect/http` router, e.g.
 * `HttpRouter.addAll(Probes.routes(options), { prefix: "/probes" })`: `/health`, `/ready`,
 * `/metrics`, `/internal/metrics` and `/__version__`, each answering GET and HEAD, and 405
 * `METHOD_NOT_ALLOWED` (with `Allow`) to any other method. Every answer is JSON (but the
 * exposition) with `cache-control: no-store`; an unexpected failure is logged at WARNING and
 * answered 500 `PROBE_FAILED`. A path that is no probe's is left to the app (`RouteNotFound`),
 * and matched as the app's router config says.
 *
 * Scoped: concurrent `/ready` requests share one evaluation, which runs in a fiber of the scope
 * (the layer's, under `HttpRouter.addAll`) so that a client that goes away does not cancel it for
 * the others.
 *
 * @since 0.2.0
 * @category routes
 */
export const routes: (
  options: ProbeRoutesOptions,
) => Effect.Effect<ReadonlyArray<HttpRouter.Route>, never, Scope.Scope> = routesInternal.routes

export { httpEffect } from "./internal/probes/routes.ts"

/**
 * Starts the probe server, serving `httpEffect` over `node:http` within the bounds above; it stops
 * with the scope (idle and busy sockets closed, bounded). Fails with a `ProbeServerError` when
 * it cannot listen (e.g. the port is in use).
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  options: ProbeServerOptions,
): Effect.Effect<ProbeServer, ProbeServerError, Scope.Scope> =>
  Effect.gen(function* () {
    const app = yield* routesInternal.httpEffect(options)
    const millis = (duration: Duration.Input) =>
      Duration.toMillis(Duration.fromInputUnsafe(duration))
    const port = yield* server.serve(app, {
      host: options.host,
      port: options.port,
      maxConnections: options.maxConnections ?? DEFAULT_MAX_CONNECTIONS,
      connectionTimeoutMillis: millis(options.connectionTimeout ?? DEFAULT_CONNECTION_TIMEOUT),
      headerTimeoutMillis: millis(options.headerTimeout ?? DEFAULT_HEADER_TIMEOUT),
      graceMillis: millis(options.connectionGrace ?? DEFAULT_CONNECTION_GRACE),
    })
    return { port }
  })

const WorkerProbesService: Context.ServiceClass<
  WorkerProbes,
  "@async-task/worker/Probes/WorkerProbes",
  ProbeServerOptions
> = Context.Service<WorkerProbes, ProbeServerOptions>()("@async-task/worker/Probes/WorkerProbes")

/**
 * A running worker's probes, as its lifecycle provides them (`Worker.layer`, `Worker.run`):
 * where the standalone server listens (`HEALTH_CHECK_HOST`, `HEALTH_CHECK_PORT`) and what
 * `/health`, `/ready` (the SDK's `broker` and `draining`, then the worker's own probes) and
 * `/metrics` read.
 *
 * @since 0.1.0
 * @category services
 */
export class WorkerProbes extends WorkerProbesService {}

/**
 * The probe routes of the worker in context (see `routes`), e.g. for
 * `HttpRouter.addAll(Probes.workerRoutes, { prefix: "/worker" })`.
 *
 * @since 0.2.0
 * @category routes
 */
export const workerRoutes: Effect.Effect<
  ReadonlyArray<HttpRouter.Route>,
  never,
  WorkerProbes | Scope.Scope
> = Effect.flatMap(WorkerProbes, routes)

/**
 * Adds the probe routes of the worker in context (see `routes`) to the app's `HttpRouter`, under
 * `prefix` if given: `Layer.mergeAll(AppRoutes, Probes.layerRoutes({ prefix: "/worker" }))`,
 * served with `HttpRouter.serve` and provided `Worker.layer(worker)`. The routes live, and their
 * shared `/ready` evaluation with them, for as long as the layer.
 *
 * @since 0.2.0
 * @category layers
 */
export const layerRoutes = (
  options?: { readonly prefix?: string | undefined },
): Layer.Layer<never, never, HttpRouter.HttpRouter | WorkerProbes> =>
  HttpRouter.addAll(workerRoutes, options)

/**
 * The standalone probe server of the worker in context, on its own port, for as long as the
 * layer lives.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<never, ProbeServerError, WorkerProbes> = Layer.effectDiscard(
  Effect.gen(function* () {
    const options = yield* WorkerProbes
    const server = yield* make(options)
    yield* Effect.logInfo(
      `Probes on http://${options.host}:${server.port} (/health, /ready, /metrics)`,
    )
  }),
)
