/**
 * Test support: the bytes a test sends and reads — a submission as the platform writes it, text
 * to and from UTF-8, a published message decoded. Plain functions with no Effect, so that the
 * chaos scripts use them too.
 */
import type { WireMessage } from "../../src/Protocol.ts"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** A submission of `body` for `taskId`, as the platform publishes it (the keys in its order). */
export const envelope = (taskId: string, body: unknown): string =>
  JSON.stringify({ task_id: taskId, data: { message_type: "submission", body } })

/** `text` in UTF-8. */
export const utf8 = (text: string): Uint8Array => encoder.encode(text)

/** The text of UTF-8 `bytes` (a malformed sequence read as U+FFFD, not refused). */
export const textOf = (bytes: Uint8Array): string => decoder.decode(bytes)

/** A message the worker published, decoded from its bytes. */
export const wireOf = (bytes: Uint8Array): WireMessage => JSON.parse(textOf(bytes)) as WireMessage
