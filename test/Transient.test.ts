/**
 * The ready-made `retryOn` rules, on errors made by hand and on the errors this runtime's own
 * sockets and `fetch` throw (a local server that resets the connection; no network needed).
 * What the engine does with their answers is in `DeliveryEngine.test.ts`.
 */
import { createServer, request, type Server } from "node:http"
import { createServer as createTcpServer } from "node:net"
import { describe, expect, it } from "@effect/vitest"
import { Duration } from "effect"
import * as Transient from "../src/Transient.ts"

/** An Error with a Node-style `code`. */
const coded = (code: string, message = `read ${code}`) =>
  Object.assign(new Error(message), { code })

/** What `fetch` on Node throws for a connection reset: the code is its cause's. */
const fetchFailed = (code: string) => new TypeError("fetch failed", { cause: coded(code) })

const millis = (answer: boolean | Duration.Input) =>
  Duration.toMillis(Duration.fromInputUnsafe(answer as Duration.Input))

describe("Transient.network", () => {
  it("a network code on the error or in its causes is transient; a bug's TypeError is not", () => {
    expect(Transient.network(coded("ECONNRESET"))).toBe(true)
    expect(Transient.network(fetchFailed("ECONNRESET"))).toBe(true)
    expect(Transient.network(fetchFailed("UND_ERR_SOCKET"))).toBe(true)
    expect(Transient.network(new Error("wrapped", { cause: fetchFailed("EAI_AGAIN") }))).toBe(true)
    expect(Transient.network(new TypeError("Cannot read properties of undefined"))).toBe(false)
    expect(Transient.network(new TypeError("fetch failed", { cause: new Error("bad port") })))
      .toBe(false)
  })

  it("a name that does not resolve, or a code of another family, is not transient", () => {
    expect(Transient.network(fetchFailed("ENOTFOUND"))).toBe(false)
    expect(Transient.network(coded("ENOENT"))).toBe(false)
    expect(Transient.network({ code: 104 })).toBe(false)
    expect(Transient.network("ECONNRESET")).toBe(false)
  })

  it("reads each address's error of an AggregateError (Node's connection to several addresses)", () => {
    const aggregate = new AggregateError([coded("EADDRNOTAVAIL"), coded("ECONNREFUSED")], "")
    expect(Transient.network(new TypeError("fetch failed", { cause: aggregate }))).toBe(true)
    expect(Transient.network(new AggregateError([coded("ENOENT")], ""))).toBe(false)
  })

  it("never throws nor loops, whatever it is given", () => {
    const cyclic: { cause?: unknown } = new Error("cyclic")
    cyclic.cause = cyclic
    expect(Transient.network(cyclic)).toBe(false)
    const { proxy, revoke } = Proxy.revocable({}, {})
    revoke()
    expect(Transient.network(proxy)).toBe(false)
    expect(Transient.network(new Error("x", { cause: proxy }))).toBe(false)
    for (const u of [undefined, null, 0, "", Symbol("s")]) expect(Transient.network(u)).toBe(false)
  })
})

describe("Transient.network on this runtime's own errors", () => {
  /** A server that resets each connection as its request arrives. */
  const resetting = () =>
    new Promise<{ readonly port: number; readonly close: () => void }>((resolve) => {
      const server = createTcpServer((socket) => socket.on("data", () => socket.resetAndDestroy()))
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as { port: number }).port
        resolve({ port, close: () => server.close() })
      })
    })

  const caught = (promise: Promise<unknown>) => promise.then(() => undefined, (e: unknown) => e)

  it("node:http's reset connection (ECONNRESET)", async () => {
    const server = await resetting()
    try {
      const error = await new Promise((resolve) => {
        request({ host: "127.0.0.1", port: server.port }, () => resolve(undefined))
          .on("error", resolve)
          .end()
      })
      expect(error).toMatchObject({ code: "ECONNRESET" })
      expect(Transient.network(error)).toBe(true)
    } finally {
      server.close()
    }
  })

  it("fetch's reset connection: transient on Node; Deno's fetch gives no code", async () => {
    const server = await resetting()
    try {
      const error = await caught(fetch(`http://127.0.0.1:${server.port}/`))
      expect(error).toBeInstanceOf(TypeError)
      // As Transient.network's documentation says: Deno's fetch errors carry a message only.
      expect(Transient.network(error)).toBe(!("Deno" in globalThis))
    } finally {
      server.close()
    }
  })

  it("a connection refused (ECONNREFUSED), through node:http", async () => {
    // A port just freed: nothing listens on it.
    const server: Server = createServer()
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    const port = (server.address() as { port: number }).port
    await new Promise((resolve) => server.close(resolve))
    const error = await new Promise((resolve) => {
      request({ host: "127.0.0.1", port }, () => resolve(undefined)).on("error", resolve).end()
    })
    expect(error).toMatchObject({ code: "ECONNREFUSED" })
    expect(Transient.network(error)).toBe(true)
  })
})

describe("Transient.httpStatus", () => {
  const rule = Transient.httpStatus()

  it("429, 502, 503 and 504 by default, from status, statusCode or the response's", () => {
    expect(rule({ status: 503 })).toBe(true)
    expect(rule({ statusCode: 429 })).toBe(true)
    expect(rule({ response: { status: 502 } })).toBe(true)
    expect(rule({ response: { statusCode: 504 } })).toBe(true)
    for (const status of [400, 404, 500, 501]) expect(rule({ status })).toBe(false)
    expect(rule(new Error("no status"))).toBe(false)
  })

  it("the statuses given, and only those", () => {
    const only500 = Transient.httpStatus([500])
    expect(only500({ status: 500 })).toBe(true)
    expect(only500({ status: 503 })).toBe(false)
  })

  it("the first status of the error and its causes decides", () => {
    expect(rule(new Error("wrapped", { cause: { status: 503 } }))).toBe(true)
    expect(rule(Object.assign(new Error("not found"), { status: 404, cause: { status: 503 } })))
      .toBe(false)
  })

  it("Retry-After in seconds, from a Headers, a plain object in any case, or the response's", () => {
    expect(millis(rule({ status: 503, headers: new Headers({ "Retry-After": "7" }) }))).toBe(7000)
    expect(millis(rule({ status: 503, headers: { "Retry-After": "7" } }))).toBe(7000)
    expect(millis(rule({ statusCode: 429, headers: { "retry-after": 3 } }))).toBe(3000)
    expect(millis(rule({ response: { status: 503, headers: { "retry-after": ["0"] } } }))).toBe(0)
    const response = new Response(null, { status: 503, headers: { "Retry-After": "120" } })
    expect(millis(rule(Object.assign(new Error("Service Unavailable"), { response })))).toBe(
      120_000,
    )
  })

  it("Retry-After as an HTTP date: the time until it, none for a date past", () => {
    const inAMinute = new Date(Date.now() + 60_000).toUTCString()
    const wait = millis(rule({ status: 503, headers: { "retry-after": inAMinute } }))
    // An HTTP date has whole seconds: up to a second less, and a little for the test's own time.
    expect(wait).toBeGreaterThan(58_000)
    expect(wait).toBeLessThanOrEqual(60_000)
    const past = new Date(Date.now() - 60_000).toUTCString()
    expect(millis(rule({ status: 503, headers: { "retry-after": past } }))).toBe(0)
  })

  it("a Retry-After it cannot read, or none, is the usual backoff", () => {
    expect(rule({ status: 503, headers: { "retry-after": "soon" } })).toBe(true)
    expect(rule({ status: 503, headers: { "retry-after": "-5" } })).toBe(true)
    expect(rule({ status: 503, headers: new Headers() })).toBe(true)
    expect(rule({ status: 503, headers: "retry-after: 7" })).toBe(true)
  })

  it("never throws, whatever it is given", () => {
    const { proxy, revoke } = Proxy.revocable({}, {})
    revoke()
    expect(rule(proxy)).toBe(false)
    expect(rule({ status: 503, headers: proxy })).toBe(true)
    const throwing = {
      status: 503,
      headers: {
        get: () => {
          throw new Error("no")
        },
      },
    }
    expect(rule(throwing)).toBe(true)
  })
})
