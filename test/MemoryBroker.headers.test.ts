import { describe, expect, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import * as MemoryBroker from "../src/MemoryBroker.ts"

const TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

describe("MemoryBroker headers", () => {
  it.effect("a message's headers are stored with it and delivered with it; a transport publishes its own", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const headers = { traceparent: TRACEPARENT }
      const stored = yield* broker.publish("in", "m1", { headers })
      yield* broker.publish("in", "m2")
      expect(stored.headers).toEqual(headers)
      expect(stored.headers).not.toBe(headers) // a copy: the caller's object may change
      const first = Option.getOrThrow(yield* broker.get("in"))
      expect(first.headers).toEqual(headers)
      expect(Option.getOrThrow(yield* broker.get("in")).headers).toBeUndefined()

      const transport = yield* broker.transport({ inQueue: "in", outQueue: "out", capacity: 1 })
      yield* transport.publish(new TextEncoder().encode("o1"), "started", { headers })
      yield* transport.publish(new TextEncoder().encode("o2"), "success")
      expect((yield* broker.published("out")).map((m) => m.headers)).toEqual([headers, undefined])
    }))

  it.effect("a requeued message keeps its headers", () =>
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      yield* broker.publish("in", "m1", { headers: { traceparent: TRACEPARENT } })
      const delivery = Option.getOrThrow(yield* broker.get("in"))
      yield* delivery.requeue
      const again = Option.getOrThrow(yield* broker.get("in"))
      expect(again.headers).toEqual({ traceparent: TRACEPARENT })
      expect(again.redeliveries).toMatchObject({ count: 1 })
    }))
})
