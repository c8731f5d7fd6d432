import { ConfigProvider, Duration, Effect, Either } from "effect"
import * as Settings from "../src/Settings.ts"
const run = (env: Array<[string, string]>) =>
  Effect.runSync(Settings.make({ name: "w", timeout: Duration.seconds(60) }).pipe(
    Effect.withConfigProvider(ConfigProvider.fromMap(new Map(env))), Effect.either))
const show = (r: any) => console.log(Either.isLeft(r) ? r.left.problems : "ok")
show(run([["WORKER_CONCURRENCY", "abc"], ["WORKER_DELIVERY_LIMIT", "0"], ["WORKER_SHUTDOWN_GRACE_S", "-1"]]))
show(run([["WORKER_CONCURRENCY", "abc"], ["WORKER_MAX_MESSAGE_BYTES", "x"]]))
show(run([["WORKER_DELIVERY_LIMIT", "0"], ["WORKER_SHUTDOWN_GRACE_S", "-1"]]))
show(run([["WORKER_RETRY_BACKOFF_MAX_S", "-60"]]))
