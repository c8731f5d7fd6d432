/**
 * What the Effect app of the npm-package fixture and of EffectApp.test.ts serves: one set of
 * assertions for both.
 */
import { expect } from "vitest"
import { QUORUM_VHOST, urlFor } from "./broker.ts"

/**
 * The Effect app of the npm-package fixture and of EffectApp.test.ts, as `get` reaches its routes:
 * its own route, and the worker's probes under `/worker`, ready with its Database on the quorum
 * vhost, and its metrics.
 */
export const expectAppServes = async (
  get: (path: string) => Promise<{ readonly status: number; readonly text: string }>,
): Promise<void> => {
  expect(await get("/hello")).toEqual({ status: 200, text: "hello" })
  const ready = await get("/worker/ready")
  expect(ready.status).toBe(200)
  expect(JSON.parse(ready.text).components).toEqual({
    broker: { status: "ok", detail: urlFor(QUORUM_VHOST, "***") },
    draining: { status: "ok" },
    database: { status: "ok" },
  })
  const metrics = await get("/worker/metrics")
  expect(metrics.status).toBe(200)
  expect(metrics.text).toContain("worker_tasks_in_flight")
}
