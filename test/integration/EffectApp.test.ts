/**
 * The worker inside an Effect app, as a user composes it: an app with its own `Database`
 * service, the worker as `Worker.layer`, and the app's own `effect/http` routes with the
 * worker's probes added under a prefix, on the real RabbitMQ. The whole lifecycle runs in the
 * layer: startup hooks before the first task, the drain on the app's shutdown, shutdown hooks
 * after it, the transport closed, and only then the app's own finalizers.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Cause, Context, Effect, Exit, Layer, References, Schema, Scope } from "effect"
import * as HttpEffect from "effect/http/HttpEffect"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import * as Probes from "../../src/Probes.ts"
import * as Worker from "../../src/Worker.ts"
import { TransportError } from "../../src/WorkerError.ts"
import { ensureVhosts, platform, QUORUM_VHOST, uniqueName, urlFor } from "./broker.ts"
import { expectAppServes } from "./effectApp.ts"
import { sleep } from "../support/waits.ts"

class Database extends Context.Service<Database, {
  readonly record: (event: string) => Effect.Effect<void>
}>()("app/Database") {}

/**
 * The app's database: what happens to it, in order, is the test's record. As it closes, it
 * records what `beforeClose` says (the worker's transport, as its `broker` probe sees it).
 */
const databaseLayer = (
  events: Array<string>,
  beforeClose: { check?: Effect.Effect<string> } = {},
) =>
  Layer.effect(
    Database,
    Effect.acquireRelease(
      Effect.sync(() => {
        events.push("database opened")
        return { record: (event: string) => Effect.sync(() => void events.push(event)) }
      }),
      () =>
        Effect.gen(function* () {
          if (beforeClose.check !== undefined) events.push(yield* beforeClose.check)
          events.push("database closed")
        }),
    ),
  )

/** The worker's `broker` readiness component, as a line of the record. */
const brokerProbe = (probes: Probes.ProbeServerOptions): Effect.Effect<string> => {
  const broker = probes.readiness.find((component) => component.name === "broker")!
  return Effect.match(broker.check, {
    onFailure: (error) => `broker: ${(error as { message?: string }).message}`,
    onSuccess: () => "broker: connected",
  })
}

const worker = (name: string) =>
  Worker.make({
    name,
    input: Schema.Struct({ id: Schema.String, millis: Schema.Number }),
    output: Schema.Struct({ id: Schema.String }),
    timeout: "60 seconds",
    onStartup: Effect.flatMap(Database, (db) => db.record("startup hook")),
    onShutdown: Effect.flatMap(Database, (db) => db.record("shutdown hook")),
    readiness: { database: Effect.flatMap(Database, (db) => db.record("readiness probe")) },
    handler: ({ id, millis }) =>
      Effect.gen(function* () {
        const db = yield* Database
        yield* db.record(`task ${id} started`)
        yield* Effect.sleep(millis)
        yield* db.record(`task ${id} done`)
        return { id }
      }),
  })

const TIMEOUT = 60_000

beforeAll(() => ensureVhosts())

describe("the worker inside an Effect app", () => {
  let broker: Awaited<ReturnType<typeof platform>>
  beforeAll(async () => {
    broker = await platform(QUORUM_VHOST)
  })
  afterAll(() => broker.close())

  it(
    "startup hooks first; on the app's shutdown the drain, then the shutdown hooks, the transport, the Database; /ready and /metrics from the app's routes",
    async () => {
      const name = uniqueName("app")
      const events: Array<string> = []
      const beforeClose: { check?: Effect.Effect<string> } = {}
      const app = Worker.layer(worker(name), {
        settings: { brokerUrl: urlFor(QUORUM_VHOST), concurrency: 2, shutdownGrace: "2 seconds" },
      }).pipe(Layer.provideMerge(databaseLayer(events, beforeClose)))
      const scope = Effect.runSync(Scope.make())
      try {
        const context = await Effect.runPromise(
          Layer.buildWithScope(app, scope).pipe(
            Effect.provideService(References.MinimumLogLevel, "Warn"),
          ),
        )
        // Built once started and connected: the startup hook ran, before any task.
        expect(events).toEqual(["database opened", "startup hook"])
        beforeClose.check = brokerProbe(Context.get(context, Probes.WorkerProbes))

        // The app's own routes and the worker's probes under /worker, in the app's router,
        // served by Effect's web handler.
        const routes = await Effect.runPromise(
          HttpRouter.toHttpEffect(
            Layer.mergeAll(
              HttpRouter.add("GET", "/hello", HttpServerResponse.text("hello")),
              Probes.layerRoutes({ prefix: "/worker" }),
            ),
          ).pipe(Effect.provide(context), Scope.provide(scope)),
        )
        const handler = HttpEffect.toWebHandler(routes)
        const get = async (path: string) => {
          const response = await handler(new Request(`http://app.test${path}`))
          return { status: response.status, text: await response.text() }
        }
        await expectAppServes(get)

        await broker.waitForQueues(name)
        broker.publish(`${name}_queue_in`, broker.envelope("t-first", { id: "first", millis: 1 }))
        await broker.readUntil(
          `${name}_queue_out`,
          (all) => all.some((m) => m.type === "success"),
        )
        // Two in flight when the app shuts down: one ends within the grace, one does not.
        broker.publish(`${name}_queue_in`, broker.envelope("t-short", { id: "short", millis: 500 }))
        broker.publish(
          `${name}_queue_in`,
          broker.envelope("t-long", { id: "long", millis: 30_000 }),
        )
        await broker.confirmed()
        const deadline = Date.now() + 10_000
        while (!events.includes("task long started") || !events.includes("task short started")) {
          if (Date.now() > deadline) throw new Error(`not both started: ${events.join(", ")}`)
          await sleep(20)
        }
        await Effect.runPromise(Scope.close(scope, Exit.void))

        const after = events.slice(events.indexOf("task long started"))
        expect(after).toEqual(expect.arrayContaining(["task short done", "shutdown hook"]))
        expect(events).not.toContain("task long done")
        // The drain, then the shutdown hooks, then the transport closed; the Database last.
        expect(events.indexOf("task short done")).toBeLessThan(events.indexOf("shutdown hook"))
        expect(events.slice(-2)).toEqual([
          `broker: the broker connection to ${urlFor(QUORUM_VHOST, "***")} is closed`,
          "database closed",
        ])
        // The long task was requeued, not concluded: it waits in the queue for a worker.
        const out = await broker.drain(`${name}_queue_out`)
        expect(out.filter((m) => m.type === "success").map((m) => JSON.parse(m.text).task_id))
          .toEqual(["t-short"])
        expect(await broker.count(`${name}_queue_in`)).toBe(1)
      } finally {
        await Effect.runPromise(Scope.close(scope, Exit.void))
        await broker.remove(`${name}_queue_in`, `${name}_queue_out`)
      }
    },
    TIMEOUT,
  )

  it("refused credentials fail the layer, without starting the worker", async () => {
    const name = uniqueName("app-refused")
    const events: Array<string> = []
    const app = Worker.layer(worker(name), {
      settings: { brokerUrl: urlFor(QUORUM_VHOST, "not-the-password") },
    }).pipe(Layer.provideMerge(databaseLayer(events)))
    const exit = await Effect.runPromiseExit(
      Effect.scoped(Layer.build(app)).pipe(
        Effect.provideService(References.MinimumLogLevel, "None"),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    if (Exit.isSuccess(exit)) return
    // One failure, and nothing else, in the cause.
    const [reason, ...others] = exit.cause.reasons
    const error = others.length === 0 && reason !== undefined && Cause.isFailReason(reason)
      ? reason.error
      : undefined
    expect(error).toBeInstanceOf(TransportError)
    expect((error as TransportError).reason).toBe("access_refused")
    expect((error as TransportError).message).not.toContain("not-the-password")
    // The startup hook ran (before the connection), so did its shutdown hook, and the Database
    // was released after both.
    expect(events).toEqual(["database opened", "startup hook", "shutdown hook", "database closed"])
  }, TIMEOUT)
})
