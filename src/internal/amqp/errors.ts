/**
 * amqplib's failures translated at the boundary into `TransportError`s a person can act on: a
 * refused login or a conflicting queue is a configuration error, and no message shows the
 * broker URL's password.
 */
import { TransportError } from "../../WorkerError.ts"
import { errorMessage } from "../describe.ts"

/** The URL without its password, for messages and logs. */
export const redactUrl = (url: string): string => {
  try {
    const parsed = new URL(url)
    if (parsed.password !== "") parsed.password = "***"
    return parsed.toString()
  } catch {
    return "(an unparsable URL)"
  }
}

/** The text of anything amqplib throws or rejects with. */
export const messageOf = errorMessage

/** A failed connection (or channel): refused credentials are a configuration error. */
export const connectError = (error: unknown, url: string): TransportError => {
  const text = messageOf(error).replaceAll(url, redactUrl(url))
  return /ACCESS[-_]REFUSED|\b403\b/.test(text)
    ? new TransportError({
      reason: "access_refused",
      message: `The broker refused the credentials of ${redactUrl(url)}`,
    })
    : new TransportError({
      reason: "connect",
      message: `Cannot connect to ${redactUrl(url)}: ${text}`,
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
