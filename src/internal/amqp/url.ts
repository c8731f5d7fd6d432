/**
 * A broker URL checked before any connection: amqplib connects to whatever parses (a missing
 * host is localhost, port 0 is 5672) and throws for the rest at each attempt, so a URL that can
 * never work would be retried forever. `BROKER_URL` may list the nodes of one cluster, separated
 * by commas, each checked so; no problem quotes a URL, whose user-info holds the password (and,
 * unencoded, can spill into the host or path).
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

/** The addresses `BROKER_URL` lists: one URL, or the nodes of one cluster separated by commas. */
export const brokerUrls = (value: string): ReadonlyArray<string> =>
  value.split(",").map((url) => url.trim())

/**
 * What is wrong with the list `value` (see {@link urlProblem}), the address named by its place
 * when there are several, or `undefined`. A comma in a user or password must be encoded: it
 * would split the URL in two.
 */
export const urlsProblem = (value: string): string | undefined => {
  const urls = brokerUrls(value)
  if (urls.length === 1) return urlProblem(urls[0]!)
  for (const [index, url] of urls.entries()) {
    const place = `(address ${index + 1} of ${urls.length}, separated by commas)`
    if (url === "") return `${place} is empty`
    const problem = urlProblem(url)
    if (problem !== undefined) {
      return `${place} ${problem}; a comma in a user or password is written %2C`
    }
  }
  return undefined
}
