/**
 * A broker URL checked before any connection: amqplib connects to whatever parses (a missing
 * host is localhost, port 0 is 5672) and throws for the rest at each attempt, so a URL that can
 * never work would be retried forever. One URL at a time; no problem quotes the URL, whose
 * user-info holds the password (and, unencoded, can spill into the host or path).
 */

const EXPECTED = "expected amqp://user:password@host:5672/vhost"

/**
 * What is wrong with `url` as amqplib reads it, said after the URL's name (`BROKER_URL ...`), or
 * `undefined`: `amqp:` or `amqps:`, a host, a port from 1 to 65535 if given, and the vhost as
 * the path, percent-encoded.
 */
export const urlProblem = (url: string): string | undefined => {
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    return `does not parse: ${EXPECTED}, with the user, password and vhost percent-encoded and a port from 1 to 65535`
  }
  if (parsed.protocol !== "amqp:" && parsed.protocol !== "amqps:") {
    // Not quoted: in `user:password@host` (no scheme) it is the user's name.
    return `must be an amqp: or amqps: URL (${EXPECTED})`
  }
  if (parsed.hostname === "") return `has no host (${EXPECTED})`
  if (parsed.port === "0") return "has port 0: a port is from 1 to 65535"
  // An @ after the host is a password's /, ? or # that cut the user-info short (the rest of the
  // password would be read, and shown, as the vhost or the query); a vhost's own is written %40.
  if (`${parsed.pathname}${parsed.search}${parsed.hash}`.includes("@")) {
    return "has an @ after its host: percent-encode the user and password (/ is %2F, ? is %3F, # is %23, @ is %40)"
  }
  try {
    decodeURIComponent(parsed.pathname.slice(1))
  } catch {
    return "has a vhost that is not percent-encoded (a % in it is written %25)"
  }
  return undefined
}
