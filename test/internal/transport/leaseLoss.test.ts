import { describe, expect, it } from "@effect/vitest"
import { LeaseLoss } from "../../../src/internal/transport/leaseLoss.ts"
import type { LeaseLost } from "../../../src/WorkerError.ts"

const recorder = (log: Array<string>, name: string) => (lost: LeaseLost) =>
  void log.push(`${name}:${lost.reason}`)

describe("LeaseLoss", () => {
  it("tells every listener once, in the order they came, with why", () => {
    const loss = new LeaseLoss()
    const log: Array<string> = []
    loss.onLost(recorder(log, "a"))
    loss.onLost(recorder(log, "b"))
    loss.onLost(recorder(log, "c"))
    loss.lose("expired")
    loss.lose("channel_closed")
    expect(log).toEqual(["a:expired", "b:expired", "c:expired"])
    expect(loss.lost?.reason).toBe("expired")
  })

  it("a listener that stopped listening is not told, whether it was alone or one of many", () => {
    const alone = new LeaseLoss()
    const many = new LeaseLoss()
    const log: Array<string> = []
    alone.onLost(recorder(log, "alone"))()
    const stopFirst = many.onLost(recorder(log, "first"))
    many.onLost(recorder(log, "second"))
    const stopThird = many.onLost(recorder(log, "third"))
    stopFirst()
    stopThird()
    alone.lose("stale")
    many.lose("stale")
    expect(log).toEqual(["second:stale"])
  })

  it("a listener that comes after the loss is told at once", () => {
    const loss = new LeaseLoss()
    const log: Array<string> = []
    loss.lose("channel_closed")
    loss.onLost(recorder(log, "late"))
    expect(log).toEqual(["late:channel_closed"])
  })

  it("a listener that throws does not keep the others from being told", () => {
    const loss = new LeaseLoss()
    const log: Array<string> = []
    loss.onLost(() => {
      throw new Error("a broken listener")
    })
    loss.onLost(recorder(log, "after"))
    loss.lose("expired")
    expect(log).toEqual(["after:expired"])
  })
})
