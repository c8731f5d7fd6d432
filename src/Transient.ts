/**
 * Which of a handler's ordinary errors are transient: the rules a definition's `retryOn` takes.
 * By default only a `RetryableError` is retried and any other error concludes `INTERNAL_ERROR` at
 * once (as the Python SDK does); a rule lets a `fetch` that failed, a reset connection or a 503
 * retry as a `RetryableError` would, without wrapping each call by hand:
 *
 * ```ts
 * Worker.make({ …, retryOn: [Transient.network, Transient.httpStatus()] })
 * ```
 *
 * @since 0.3.0
 */
import * as Duration from "effect/Duration"

/**
 * Says whether an ordinary error (neither `FatalError` nor `RetryableError`, whether the handler
 * threw, rejected, failed or died with it) is transient: `true` retries it with the usual
 * backoff, a duration (a number is seconds, as a `RetryableError`'s `delay`) after that long,
 * `false` not at all (the next rule of a list is asked; after the last, the task concludes
 * `INTERNAL_ERROR` as without a rule). A threaded handler's error reaches it
 * rebuilt on the worker's side: its name, message and stack, its own fields with plain values
 * (`code`, `errno`, `status`, …), its `headers` and its `response`'s, its `cause` and `errors`.
 *
 * @since 0.3.0
 * @category models
 */
export type Rule = (error: unknown) => boolean | Duration.Input

/** `u[key]`, or undefined where reading it throws (a revoked Proxy): a rule never throws. */
const field = (u: unknown, key: string): unknown => {
  if ((typeof u !== "object" && typeof u !== "function") || u === null) return undefined
  try {
    return (u as Record<string, unknown>)[key]
  } catch {
    return undefined
  }
}

// An error's causes, as far as a wrapper may hide the one that says what happened: `fetch`'s
// `TypeError("fetch failed")` keeps the socket's error in `cause`, and Node's connection to a
// name with several addresses gives an `AggregateError` of one error per address.
const MAX_CHAIN = 16

/** The error, its `cause` and `errors`, breadth first, each once, at most {@link MAX_CHAIN}. */
const chainOf = (error: unknown): ReadonlyArray<unknown> => {
  const chain: Array<unknown> = [error]
  for (let i = 0; i < chain.length && chain.length < MAX_CHAIN; i++) {
    const errors = field(chain[i], "errors")
    const next = [field(chain[i], "cause"), ...(Array.isArray(errors) ? errors : [])]
    for (const u of next) {
      if (typeof u === "object" && u !== null && !chain.includes(u)) chain.push(u)
    }
  }
  return chain.slice(0, MAX_CHAIN)
}

// The codes of a connection that failed or broke on the way, where trying again later can help.
// Not ENOTFOUND: a name the resolver says does not exist is a configuration's mistake, which
// retrying would only delay; its "try again" is EAI_AGAIN.
const NETWORK_CODES: ReadonlySet<string> = new Set([
  // Node's sockets and resolver
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "ETIMEDOUT",
  "EPIPE",
  "ENETUNREACH",
  "ENETDOWN",
  "EHOSTUNREACH",
  "EHOSTDOWN",
  "EAI_AGAIN",
  "ERR_SOCKET_CONNECTION_TIMEOUT",
  // undici (Node's `fetch`)
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
])

/**
 * A connection that failed or broke: an error whose `code`, or the `code` of one of its causes,
 * is one of Node's or undici's network codes (`ECONNRESET`, `ECONNREFUSED`, `ETIMEDOUT`, `EPIPE`,
 * `EAI_AGAIN`, `ENETUNREACH`, `EHOSTUNREACH`, `UND_ERR_SOCKET`, `UND_ERR_CONNECT_TIMEOUT`, …): so
 * Node's `fetch` failing with `TypeError("fetch failed")` is transient when its `cause` says so,
 * and a `TypeError` of a bug is not. Deno's `node:` modules and `Deno.connect` give these codes;
 * Deno's `fetch` gives none (only a message), which this rule does not read.
 *
 * @since 0.3.0
 * @category constructors
 */
export const network: Rule = (error) =>
  chainOf(error).some((u) => {
    const code = field(u, "code")
    return typeof code === "string" && NETWORK_CODES.has(code)
  })

/** The HTTP status an error carries (`status`, `statusCode`, or its `response`'s), if any. */
const statusOf = (u: unknown): number | undefined => {
  const response = field(u, "response")
  for (
    const status of [
      field(u, "status"),
      field(u, "statusCode"),
      field(response, "status"),
      field(response, "statusCode"),
    ]
  ) {
    if (typeof status === "number" && Number.isInteger(status)) return status
  }
  return undefined
}

/**
 * A header of a `Headers` (anything with `get`), or of a plain object, whatever its case; none
 * where reading them throws.
 */
const headerOf = (headers: unknown, name: string): unknown => {
  if (typeof headers !== "object" || headers === null) return undefined
  try {
    const get = (headers as { get?: unknown }).get
    if (typeof get === "function") return get.call(headers, name)
    const key = Object.keys(headers).find((k) => k.toLowerCase() === name)
    return key === undefined ? undefined : (headers as Record<string, unknown>)[key]
  } catch {
    return undefined
  }
}

/**
 * The wait `Retry-After` asks for (RFC 9110: seconds, or an HTTP date), if it can be read; a date
 * already past asks for none.
 */
const retryAfterOf = (u: unknown): Duration.Duration | undefined => {
  const headers = field(u, "headers") ?? field(field(u, "response"), "headers")
  const raw = headerOf(headers, "retry-after")
  const value = String(Array.isArray(raw) ? raw[0] : raw ?? "").trim()
  if (/^\d+$/.test(value)) return Duration.seconds(Number(value))
  // Each of HTTP's three date formats begins with the day's name; `Date.parse` alone would take
  // "-5" for a year.
  const date = /^[A-Za-z]{3}/.test(value) ? Date.parse(value) : Number.NaN
  return Number.isNaN(date) ? undefined : Duration.millis(Math.max(0, date - Date.now()))
}

/**
 * An HTTP response with one of `statuses` (by default 429, 502, 503 and 504), read from the
 * error's `status` or `statusCode`, or its `response`'s (fetch wrappers, axios, got, Effect's
 * `HttpClientError`), the first of the error and its causes that has one: retried after its
 * `Retry-After` (seconds or an HTTP date, from `headers` or `response.headers`, a `Headers` or a
 * plain object), else with the usual backoff. The wait is capped at `WORKER_RETRY_BACKOFF_MAX_S`.
 *
 * @since 0.3.0
 * @category constructors
 */
export const httpStatus = (statuses: Iterable<number> = [429, 502, 503, 504]): Rule => {
  const transient = new Set(statuses)
  return (error) => {
    for (const u of chainOf(error)) {
      const status = statusOf(u)
      if (status !== undefined) return transient.has(status) && (retryAfterOf(u) ?? true)
    }
    return false
  }
}
