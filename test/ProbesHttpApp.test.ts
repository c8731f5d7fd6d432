/**
 * The probe routes served by an app's own `effect/http` server rather than the probe server:
 * through `HttpEffect.toWebHandlerWith`, Effect's server for web-standard runtimes
 * (`Deno.serve`, Bun, workers), driven here by web `Request`s on Node and Deno alike. The
 * answers are the probe server's own, as `test/Probes.test.ts` specifies them.
 */
import { describe, expect, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Deferred, Effect, Fiber, Layer, Ref } from "effect"
import * as HttpEffect from "effect/http/HttpEffect"
import * as HttpRouter from "effect/http/HttpRouter"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import * as Probes from "../src/Probes.ts"
import { ProbeError } from "../src/WorkerError.ts"
import { captureLogs, nextTurn, waitUntil } from "./support/logs.ts"
import { HOST, type Reply, reply, routeOptions, start } from "./support/probes.ts"

/** `app` served by Effect's web handler, in this fiber's context (its logger too). */
const serve = (
  app: Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    unknown,
    HttpServerRequest.HttpServerRequest | Scope.Scope
  >,
) =>
  Effect.map(Effect.context<never>(), (context) => {
    const handler = HttpEffect.toWebHandlerWith<
      never,
      HttpServerRequest.HttpServerRequest | Scope.Scope
    >(context)(app)
    return (path: string, init?: RequestInit) =>
      Effect.promise(() => handler(new Request(`http://app.test${path}`, init)).then(reply))
  })

/** An app's router, filled by `routes` (layers adding routes to it), served as `serve` does. */
const serveRouter = <E>(routes: Layer.Layer<never, E, HttpRouter.HttpRouter>) =>
  Effect.flatMap(HttpRouter.toHttpEffect(routes), serve)

describe("Probes.httpEffect", () => {
  it.effect("answers as the probe server does, served by Effect's web handler", () =>
    Effect.gen(function* () {
      const ask = yield* serve(yield* Probes.httpEffect(routeOptions()))

      const health = yield* ask("/health?verbose=1")
      expect(health.status).toBe(200)
      expect(health.body).toEqual({ status: "ok" })
      expect(health.headers.get("content-type")).toBe("application/json")
      expect(health.headers.get("cache-control")).toBe("no-store")

      const head = yield* ask("/health", { method: "HEAD" })
      expect(head.status).toBe(200)
      expect(head.headers.get("content-length")).toBe(String('{"status":"ok"}'.length))
      expect(head.text).toBe("")

      const metrics = yield* ask("/internal/metrics")
      expect(metrics.headers.get("content-type")).toBe(Probes.METRICS_CONTENT_TYPE)
      expect(metrics.text).toBe("# TYPE up gauge\nup 1\n")

      expect((yield* ask("/__version__")).body).toEqual({
        source: "dev",
        version: "9.9.9",
        commit: "unknown",
        build: "dev",
      })

      const notAllowed = yield* ask("/ready", { method: "DELETE" })
      expect(notAllowed.status).toBe(405)
      expect(notAllowed.headers.get("allow")).toBe("GET, HEAD")
      expect(notAllowed.body.error.code).toBe("METHOD_NOT_ALLOWED")

      for (const path of ["/", "/nope", "/HEALTH", "/health/", "//health"]) {
        const notFound = yield* ask(path, { method: "POST" })
        expect(notFound.status).toBe(404)
        expect(notFound.body.error.code).toBe("NOT_FOUND")
        expect(notFound.headers.get("cache-control")).toBe("no-store")
      }
    }))

  it.effect("answers /ready 503 with its components, and shares one evaluation among requests", () =>
    Effect.gen(function* () {
      const runs = yield* Ref.make(0)
      const release = yield* Deferred.make<void>()
      const ask = yield* serve(
        yield* Probes.httpEffect(routeOptions({
          readiness: [
            {
              name: "broker",
              check: Effect.fail(new ProbeError({ message: "the broker is disconnected" })),
            },
            {
              name: "db",
              check: Effect.andThen(Ref.update(runs, (n) => n + 1), Deferred.await(release)),
            },
          ],
        })),
      )
      const replies = yield* Effect.forkChild(
        Effect.all([ask("/ready"), ask("/ready"), ask("/ready")], { concurrency: "unbounded" }),
      )
      yield* waitUntil(() => Ref.get(runs).pipe(Effect.map((n) => n > 0)), "/ready evaluates")
      // Let the other requests reach the evaluation in flight (a later one would start another).
      for (let i = 0; i < 10; i++) yield* nextTurn
      yield* Deferred.succeed(release, void 0)
      const all = yield* Fiber.join(replies)
      expect(yield* Ref.get(runs)).toBe(1)
      for (const { body, status } of all) {
        expect(status).toBe(503)
        expect(body.error).toEqual({
          code: "DEPENDENCIES_NOT_READY",
          message: "Not ready: broker",
          components: {
            broker: { status: "error", message: "the broker is disconnected" },
            db: { status: "ok" },
          },
        })
      }
    }))

  it.effect("answers 500 PROBE_FAILED to a probe that dies, logged at WARNING", () => {
    const logs = captureLogs()
    return Effect.gen(function* () {
      const ask = yield* serve(
        yield* Probes.httpEffect(routeOptions({ metrics: Effect.die(new Error("secret")) })),
      )
      const failed = yield* ask("/metrics")
      expect(failed.status).toBe(500)
      expect(failed.body).toEqual({
        status: "error",
        error: { code: "PROBE_FAILED", message: "The probe /metrics failed unexpectedly." },
      })
      expect(logs.lines.filter((l) => l.level === "Warn").map((l) => l.message)).toEqual([
        expect.stringMatching(/^The probe \/metrics failed unexpectedly/),
      ])
    }).pipe(Effect.provide(logs.layer))
  })

  it.effect("gives the probe server's answers, byte for byte", () =>
    Effect.gen(function* () {
      const options = routeOptions({
        readiness: [{ name: "db", check: Effect.fail(new TypeError("secret")) }],
      })
      const ask = yield* serve(yield* Probes.httpEffect(options))
      const { port } = yield* start(options)
      const requests: ReadonlyArray<readonly [string, string]> = [
        ["GET", "/health"],
        ["HEAD", "/ready"],
        ["GET", "/ready"],
        ["GET", "/metrics"],
        ["GET", "/__version__"],
        ["PUT", "/metrics"],
        ["GET", "/healthz"],
      ]
      for (const [method, path] of requests) {
        const served = yield* Effect.promise(() =>
          fetch(`http://${HOST}:${port}${path}`, { method }).then(reply)
        )
        const app = yield* ask(path, { method })
        const headers = (r: Reply) =>
          ["content-type", "content-length", "cache-control", "allow"].map((h) => r.headers.get(h))
        expect([app.status, headers(app), app.text]).toEqual([
          served.status,
          headers(served),
          served.text,
        ])
      }
    }))
})

describe("Probes.routes", () => {
  it.effect("serves the probes beside an app's own routes, or under a prefix", () =>
    Effect.gen(function* () {
      const own = HttpRouter.add("GET", "/hello", HttpServerResponse.text("hello"))
      const beside = yield* serveRouter(
        Layer.mergeAll(own, HttpRouter.addAll(Probes.routes(routeOptions()))),
      )
      expect((yield* beside("/hello")).text).toBe("hello")
      expect((yield* beside("/health")).body).toEqual({ status: "ok" })
      expect((yield* beside("/metrics", { method: "POST" })).status).toBe(405)
      // A path that is no probe's is the app's to answer: here, effect/http's bare 404.
      const other = yield* beside("/nope")
      expect([other.status, other.text]).toEqual([404, ""])

      const under = yield* serveRouter(
        Layer.mergeAll(
          own,
          HttpRouter.addAll(Probes.routes(routeOptions()), { prefix: "/probes" }),
        ),
      )
      expect((yield* under("/probes/health")).body).toEqual({ status: "ok" })
      expect((yield* under("/probes/ready")).body).toEqual({ status: "ok", components: {} })
    }))
})

describe("Probes.layerRoutes", () => {
  it.effect("adds the probes of the worker in context to the app's router, under a prefix", () =>
    Effect.gen(function* () {
      const probes = Layer.succeed(Probes.WorkerProbes)({
        ...routeOptions({
          readiness: [{
            name: "broker",
            check: Effect.fail(new ProbeError({ message: "the broker is disconnected" })),
          }],
        }),
        host: HOST,
        port: 0,
      })
      const ask = yield* serveRouter(
        Layer.mergeAll(
          HttpRouter.add("GET", "/hello", HttpServerResponse.text("hello")),
          Probes.layerRoutes({ prefix: "/worker" }),
        ).pipe(Layer.provide(probes)),
      )
      expect((yield* ask("/hello")).text).toBe("hello")
      expect((yield* ask("/worker/health")).body).toEqual({ status: "ok" })
      const ready = yield* ask("/worker/ready")
      expect(ready.status).toBe(503)
      expect(ready.body.error.components).toEqual({
        broker: { status: "error", message: "the broker is disconnected" },
      })
      expect((yield* ask("/worker/metrics")).text).toBe("# TYPE up gauge\nup 1\n")
      expect((yield* ask("/health")).status).toBe(404)
    }))
})
