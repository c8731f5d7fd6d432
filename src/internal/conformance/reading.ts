/**
 * The kit's own reading of an output message: its bytes, its properties, and the one compact
 * form the protocol allows it (keys in the protocol's order), written here rather than taken from
 * the engine's encoder, so that the kit would catch the SDK's own mistakes too.
 */

/** An output message as the kit received it. */
export interface Received {
  readonly bytes: Uint8Array
  readonly properties: {
    readonly deliveryMode?: number | undefined
    readonly contentType?: string | undefined
    readonly type?: string | undefined
  }
  /** When the kit read it, in ms of its clock. */
  readonly at: number
}

/** An output message as the kit reads it. */
export interface Reading {
  readonly received: Received
  /** The text, if the bytes are UTF-8. */
  readonly text: string | undefined
  /** The task it names, if it names one. */
  readonly taskId: string | undefined
  readonly type: string | undefined
  readonly data: Record<string, unknown> | undefined
  /** What keeps its bytes from the protocol's compact form, if anything. */
  readonly malformed: string | undefined
}

const isObject = (u: unknown): u is Record<string, unknown> =>
  typeof u === "object" && u !== null && !Array.isArray(u)

/** The keys of `data`, in the protocol's order, for each message type. */
const DATA_KEYS: Record<string, ReadonlyArray<string>> = {
  started: ["message_type", "hostname"],
  progress: ["message_type", "progress", "response"],
  success: ["message_type", "response"],
  failure: ["message_type", "error_message"],
}

/**
 * The compact form of a message with these fields, keys in the protocol's order; nested objects
 * (a response) in the order `JSON.parse` gives, which puts integer-like keys first, as
 * `JSON.stringify` writes them.
 */
const compact = (taskId: string, type: string, data: Record<string, unknown>): string => {
  const ordered: Record<string, unknown> = {}
  for (const key of DATA_KEYS[type]!) if (key in data) ordered[key] = data[key]
  if (type === "failure" && isObject(data.error_message)) {
    ordered.error_message = { code: data.error_message.code, message: data.error_message.message }
  }
  return JSON.stringify({ task_id: taskId, data: ordered })
}

// `ignoreBOM`: a leading byte order mark is kept, to be seen, not silently dropped.
const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true })

export const read = (received: Received): Reading => {
  const none = { taskId: undefined, type: undefined, data: undefined }
  let text: string
  try {
    text = decoder.decode(received.bytes)
  } catch {
    return { received, text: undefined, ...none, malformed: "its bytes are not UTF-8" }
  }
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    return { received, text, ...none, malformed: "it is not JSON" }
  }
  if (!isObject(json) || typeof json.task_id !== "string" || !isObject(json.data)) {
    return { received, text, ...none, malformed: "it is not {task_id, data}" }
  }
  const { task_id: taskId, data } = json
  const type = typeof data.message_type === "string" ? data.message_type : undefined
  const base = { received, text, taskId, type, data }
  if (type === undefined || !(type in DATA_KEYS)) {
    return { ...base, malformed: `its message_type is ${JSON.stringify(data.message_type)}` }
  }
  const extra = Object.keys(json).filter((k) => k !== "task_id" && k !== "data")
    .concat(Object.keys(data).filter((k) => !DATA_KEYS[type]!.includes(k)))
  const error = data.error_message
  if (
    type === "failure" &&
    (!isObject(error) || typeof error.code !== "string" || typeof error.message !== "string")
  ) {
    return { ...base, malformed: "its error_message is not {code, message}, both strings" }
  }
  if (extra.length > 0) {
    return { ...base, malformed: `it has keys the protocol does not: ${extra.join(", ")}` }
  }
  const expected = compact(taskId, type, data)
  return { ...base, malformed: text === expected ? undefined : `its bytes are not ${expected}` }
}

/** A message, shortened for a report line. */
export const show = (reading: Reading): string => {
  // One line: a pretty-printed message's line breaks shown as `\n`.
  const text = reading.text?.replaceAll("\n", "\\n") ??
    `${reading.received.bytes.length} bytes, not UTF-8`
  return text.length > 300 ? `${text.slice(0, 300)}…` : text
}
