/**
 * amqplib's failures translated at the boundary into `TransportError`s a person can act on: a
 * refused login or vhost, a broker URL that cannot work and a conflicting queue are
 * configuration errors, and no message shows the broker URL's password.
 */
import { TransportError } from "../../WorkerError.ts"
import { errorMessage } from "../describe.ts"
import { closeReasonOf } from "./connect.ts"
import { brokerUrls, urlsProblem } from "./url.ts"

const redactOne = (url: string): string => {
  try {
    const parsed = new URL(url)
    if (parsed.password !== "") parsed.password = "***"
    return parsed.toString()
  } catch {
    return "(an unparsable URL)"
  }
}

/** The URL (or each of a list's, see `brokerUrls`) without its password, for messages and logs. */
export const redactUrl = (url: string): string => brokerUrls(url).map(redactOne).join(", ")

/** The text of anything amqplib throws or rejects with. */
export const messageOf = errorMessage

/**
 * A broker URL (or list, see `urlsProblem`) amqplib cannot use, as a configuration error, before
 * connecting.
 */
export const invalidUrl = (url: string): TransportError | undefined => {
  const problem = urlsProblem(url)
  return problem === undefined
    ? undefined
    : new TransportError({ reason: "invalid_url", message: `The broker URL ${problem}` })
}

/**
 * A failed connection (or channel). Refused credentials (403) are a configuration error, and so
 * is a refused vhost (530 NOT_ALLOWED at Connection.Open: unknown, or not the user's), but not a
 * vhost that is down or a connection limit reached, which time can mend. Either quotes the
 * broker's reason, known where amqplib's handshake is patched (`keepCloseReasons`) or quoted in
 * amqplib's text; else amqplib's text.
 */
export const connectError = (error: unknown, url: string): TransportError => {
  const shown = redactUrl(url)
  const text = messageOf(error).replaceAll(url, shown)
  const close = closeReasonOf(error)
  // 530 also says "vhost … is down" or a connection limit reached, which time can mend.
  if (
    close?.replyCode === 530 && /not found|refused for user/i.test(close.replyText) &&
    !/connection limit/i.test(close.replyText)
  ) {
    return new TransportError({
      reason: "not_allowed",
      message: `The broker refused the vhost of ${shown}: ${close.replyText}`,
    })
  }
  if (close?.replyCode === 403 || /ACCESS[-_]REFUSED|\b403\b/.test(text)) {
    // amqplib quotes the broker's reason in its text when the handshake patch has not kept it.
    const refusal = close?.replyText ?? /ACCESS_REFUSED - [^"]*/.exec(text)?.[0] ?? text
    return new TransportError({
      reason: "access_refused",
      message: `The broker refused the credentials of ${shown}: ${refusal}`,
    })
  }
  const reason = close === undefined || text.includes(close.replyText)
    ? ""
    : ` (${close.replyCode} ${close.replyText})`
  return new TransportError({
    reason: "connect",
    message: `Cannot connect to ${shown}: ${text}${reason}`,
  })
}

/** A refused declaration: a queue that exists with other arguments (406) is a configuration error. */
export const declareError = (error: unknown, queue: string): TransportError =>
  (error as { code?: unknown })?.code === 406
    ? new TransportError({
      reason: "precondition_failed",
      message:
        `The queue "${queue}" exists with other arguments than a durable queue declared without arguments: ${
          messageOf(error)
        }`,
    })
    : new TransportError({
      reason: "declare",
      message: `Declaring the queue "${queue}" failed: ${messageOf(error)}`,
    })
