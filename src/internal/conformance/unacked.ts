/**
 * Where the conformance kit reads the input queue's unacked count, which AMQP does not tell: the
 * broker's management API, or `rabbitmqctl` on the broker's own machine; and how it finds the
 * one that speaks for the broker it was given, so that no flag is needed in the common case.
 */
import { execFile } from "node:child_process"

/** An unacked count's source, and what the kit says of it. */
export interface UnackedSource {
  readonly unacked: () => Promise<number>
  readonly description: string
}

/** Whether a listener list (the management API's or `rabbitmqctl status`'s) has AMQP on `port`. */
const listensOn = (listeners: unknown, port: number): boolean =>
  Array.isArray(listeners) &&
  listeners.some((l: { protocol?: unknown; port?: unknown }) =>
    typeof l === "object" && l !== null && (l.protocol === "amqp" || l.protocol === "amqp/ssl") &&
    l.port === port
  )

const run = (command: string, args: ReadonlyArray<string>, timeout: number): Promise<string> =>
  new Promise((resolve, reject) =>
    execFile(
      command,
      [...args],
      { timeout, encoding: "utf8" },
      (error, stdout) => error === null ? resolve(stdout) : reject(error),
    )
  )

/** The vhost an AMQP URL names (`/` when it names none). */
export const vhostOf = (url: string): string =>
  decodeURIComponent(new URL(url).pathname.slice(1)) || "/"

/** GETs `path` of the HTTP API at `api`, with the URL's credentials as basic auth. */
const get = (api: URL, path: string, timeoutMs: number): Promise<Response> => {
  const auth = btoa(`${decodeURIComponent(api.username)}:${decodeURIComponent(api.password)}`)
  return fetch(`${api.protocol}//${api.host}${path}`, {
    headers: { authorization: `Basic ${auth}` },
    signal: AbortSignal.timeout(timeoutMs),
  })
}

/** The unacked count of the management API at `api` (`http://user:pass@host:15672`). */
export const management =
  (api: string, vhost: string, queue: string) => async (): Promise<number> => {
    const path = `/api/queues/${encodeURIComponent(vhost)}/${encodeURIComponent(queue)}`
    const response = await get(new URL(api), path, 10_000)
    if (!response.ok) throw new Error(`${path}: ${response.status}`)
    const body = await response.json() as { messages_unacknowledged?: unknown }
    if (typeof body.messages_unacknowledged !== "number") {
      throw new Error("no messages_unacknowledged")
    }
    return body.messages_unacknowledged
  }

/** The unacked count as `command` (a `rabbitmqctl`) tells it. */
export const rabbitmqctl =
  (vhost: string, queue: string, command = "rabbitmqctl") => async (): Promise<number> => {
    const stdout = await run(
      command,
      ["-q", "list_queues", "-p", vhost, "name", "messages_unacknowledged"],
      10_000,
    )
    const row = stdout.split("\n").map((l) => l.split("\t")).find(([name]) => name === queue)
    if (row === undefined) throw new Error(`${queue} is not listed`)
    return Number(row[1])
  }

const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]", "::1"])

/** The management API at the broker's host that serves its AMQP port, if one answers. */
const findManagement = async (broker: URL, port: number): Promise<URL | undefined> => {
  // The management port beside the default AMQP one, and the same step from another AMQP port
  // (5672 → 15672, 5681 → 15681), the usual way to run several nodes on one host.
  for (const candidate of new Set([15672, port + 10_000])) {
    const api = new URL(`http://${broker.hostname}:${candidate}`)
    api.username = broker.username
    api.password = broker.password
    try {
      const response = await get(api, "/api/overview", 3_000)
      if (!response.ok) continue
      const overview = await response.json() as { listeners?: unknown }
      if (listensOn(overview.listeners, port)) return api
    } catch {
      // Nothing there, or not a management API: the next candidate.
    }
  }
  return undefined
}

/** Whether `command` reaches the node that listens on `port` (a broker on this machine). */
const ctlReaches = async (command: string, port: number): Promise<boolean> => {
  try {
    const status = JSON.parse(await run(command, ["-q", "status", "--formatter", "json"], 15_000))
    return listensOn(status.listeners, port)
  } catch {
    return false
  }
}

/**
 * The unacked count of `queue` on the broker at `brokerUrl` (its vhost): its management API where
 * enabled, found at its host and checked to serve its AMQP port; else `rabbitmqctl` when the
 * broker is on this machine and that command addresses its node (its status lists the port).
 * Undefined when neither does, or the URL does not parse (the session says so).
 */
export const discover = async (
  brokerUrl: string,
  queue: string,
  command = "rabbitmqctl",
): Promise<UnackedSource | undefined> => {
  let broker: URL
  try {
    broker = new URL(brokerUrl)
  } catch {
    return undefined
  }
  const vhost = vhostOf(brokerUrl)
  const port = broker.port === ""
    ? (broker.protocol === "amqps:" ? 5671 : 5672)
    : Number(broker.port)
  const api = await findManagement(broker, port)
  if (api !== undefined) {
    return {
      unacked: management(api.href, vhost, queue),
      description: `the management API at ${api.host}`,
    }
  }
  if (LOOPBACK.has(broker.hostname) && await ctlReaches(command, port)) {
    return {
      unacked: rabbitmqctl(vhost, queue, command),
      description: `${command} on this machine`,
    }
  }
  return undefined
}
