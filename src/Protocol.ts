/**
 * The AsyncTaskAPI wire contract: the inbound task envelope and the worker's outbound messages,
 * byte for byte as `PROTOCOL.md` defines them. Pure functions, no Effect runtime needed:
 * `import { decodeEnvelope, encodeMessage } from "@async-task/worker/protocol"`.
 *
 * @since 0.1.0
 */
import * as Data from "effect/Data"
import * as Result from "effect/Result"
import { findNonJson, isPlainObject, nestsDeeperThan } from "./internal/codec/json.ts"
import { decodeUtf8, encodeUtf8 } from "./internal/codec/utf8.ts"
import { MessageEncodeError } from "./WorkerError.ts"

/**
 * An outbound message that the spec does not allow; see {@link WorkerError.MessageEncodeError}.
 *
 * @since 0.1.0
 * @category errors
 */
export { MessageEncodeError }

/**
 * Why a message cannot be correlated with a task.
 *
 * @since 0.1.0
 * @category models
 */
export type PoisonReason = "too_large" | "not_utf8" | "not_json" | "not_object" | "no_task_id"

/**
 * A valid task envelope.
 *
 * @since 0.1.0
 * @category models
 */
export interface Envelope {
  readonly taskId: string
  readonly body: Readonly<Record<string, unknown>>
  readonly clientId: string | undefined
  readonly inputRefs: ReadonlyArray<string> | undefined
}

/**
 * What `decodeEnvelope` makes of a message: a task, an invalid envelope that still names its
 * task (answered with `INVALID_MESSAGE`), or poison that names nothing.
 *
 * @since 0.1.0
 * @category models
 */
export type Decoded = Data.TaggedEnum<{
  Task: { readonly envelope: Envelope }
  InvalidEnvelope: { readonly taskId: string; readonly problem: string }
  Poison: { readonly reason: PoisonReason }
}>

/**
 * Constructors and matchers for {@link Decoded}.
 *
 * @since 0.1.0
 * @category models
 */
export const Decoded: Data.TaggedEnum.Constructor<Decoded> = Data.taggedEnum<Decoded>()

// Each property read of a tagged enum makes a new constructor: these run for every message.
const { InvalidEnvelope, Poison, Task } = Decoded

/**
 * The default size limit of an inbound message (`WORKER_MAX_MESSAGE_BYTES`): 16 MiB.
 *
 * @since 0.1.0
 * @category constants
 */
export const DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

/**
 * The deepest JSON nesting accepted in an envelope.
 *
 * @since 0.1.0
 * @category constants
 */
export const MAX_JSON_DEPTH = 512

/**
 * The longest task id accepted, in characters.
 *
 * @since 0.1.0
 * @category constants
 */
export const MAX_TASK_ID_LENGTH = 256

const characterCount = (s: string): number => {
  let count = 0
  for (const _ of s) count++
  return count
}

const isTaskId = (value: unknown): value is string =>
  typeof value === "string" && value.length > 0 &&
  (value.length <= MAX_TASK_ID_LENGTH || characterCount(value) <= MAX_TASK_ID_LENGTH)

const envelopeProblem = (root: Record<string, unknown>): string | Envelope["inputRefs"] | null => {
  const clientId = root.client_id
  if (clientId !== undefined && typeof clientId !== "string") return "client_id is not a string"
  const data = root.data
  if (data === undefined) return "data is missing"
  if (!isPlainObject(data)) return "data is not an object"
  const messageType = data.message_type
  if (messageType !== undefined && messageType !== "submission") {
    return 'data.message_type is not "submission"'
  }
  if (data.body === undefined) return "data.body is missing"
  if (!isPlainObject(data.body)) return "data.body is not an object"
  const refs = data.input_refs
  if (refs === undefined) return null
  if (!Array.isArray(refs) || !refs.every((r) => typeof r === "string")) {
    return "data.input_refs is not an array of strings"
  }
  return refs as ReadonlyArray<string>
}

/**
 * Classifies one inbound message by the spec's poison rules. Never throws, whatever the bytes.
 * `JSON.parse` defines `__proto__` keys as own data properties, so they never reach a
 * prototype.
 *
 * @since 0.1.0
 * @category codecs
 */
export const decodeEnvelope = (
  bytes: Uint8Array,
  options?: { readonly maxBytes?: number | undefined },
): Decoded => {
  if (bytes.byteLength > (options?.maxBytes ?? DEFAULT_MAX_MESSAGE_BYTES)) {
    return Poison({ reason: "too_large" })
  }
  const text = decodeUtf8(bytes)
  if (text === undefined) return Poison({ reason: "not_utf8" })
  if (nestsDeeperThan(text, MAX_JSON_DEPTH)) return Poison({ reason: "not_json" })
  let root: unknown
  try {
    root = JSON.parse(text)
  } catch {
    return Poison({ reason: "not_json" })
  }
  if (!isPlainObject(root)) return Poison({ reason: "not_object" })
  const taskId = root.task_id
  if (!isTaskId(taskId)) return Poison({ reason: "no_task_id" })
  const problem = envelopeProblem(root)
  if (typeof problem === "string") return InvalidEnvelope({ taskId, problem })
  const data = root.data as Record<string, unknown>
  return Task({
    envelope: {
      taskId,
      body: data.body as Record<string, unknown>,
      clientId: root.client_id as string | undefined,
      inputRefs: problem ?? undefined,
    },
  })
}

/**
 * The message types a worker publishes (the AMQP `type` property).
 *
 * @since 0.1.0
 * @category models
 */
export type MessageType = "started" | "progress" | "success" | "failure"

/**
 * One outbound message, in the shape of the spec's test vectors.
 *
 * @since 0.1.0
 * @category models
 */
export type OutboundMessage =
  | { readonly type: "started"; readonly task_id: string; readonly hostname: string }
  | {
    readonly type: "progress"
    readonly task_id: string
    readonly progress: number
    readonly payload?: Readonly<Record<string, unknown>> | undefined
  }
  | {
    readonly type: "success"
    readonly task_id: string
    readonly response: Readonly<Record<string, unknown>>
  }
  | {
    readonly type: "failure"
    readonly task_id: string
    readonly code: string
    readonly message: string
  }

/**
 * The shape of a failure code.
 *
 * @since 0.1.0
 * @category constants
 */
export const FAILURE_CODE_PATTERN = /^[A-Z][A-Z0-9_]{0,63}$/

/**
 * The most UTF-8 bytes a failure message may have.
 *
 * @since 0.1.0
 * @category constants
 */
export const MAX_FAILURE_MESSAGE_BYTES = 8 * 1024

/**
 * Cuts `text` to at most `maxBytes` of UTF-8 without splitting a character.
 *
 * @since 0.1.0
 * @category codecs
 */
export const truncateUtf8 = (text: string, maxBytes: number): string => {
  if (text.length * 3 <= maxBytes) return text
  const bytes = encodeUtf8(text)
  if (bytes.byteLength <= maxBytes) return text
  let end = maxBytes
  // Step back over continuation bytes (10xxxxxx) to the start of the cut character.
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--
  return new TextDecoder().decode(bytes.subarray(0, end))
}

const jsonObject = (value: unknown, what: string): Result.Result<string, MessageEncodeError> => {
  if (!isPlainObject(value)) {
    return Result.fail(new MessageEncodeError({ message: `${what} is not a JSON object` }))
  }
  const problem = findNonJson(value)
  if (problem !== undefined) {
    return Result.fail(new MessageEncodeError({ message: `${what}: ${problem}` }))
  }
  return Result.succeed(JSON.stringify(value))
}

/**
 * The exact text of a message, or why the spec does not allow it.
 *
 * @since 0.1.0
 * @category codecs
 */
export const encodeMessageText = (
  message: OutboundMessage,
): Result.Result<string, MessageEncodeError> => {
  const head = `{"task_id":${
    JSON.stringify(message.task_id)
  },"data":{"message_type":"${message.type}"`
  switch (message.type) {
    case "started":
      return Result.succeed(`${head},"hostname":${JSON.stringify(message.hostname)}}}`)
    case "progress": {
      const p = message.progress
      if (typeof p !== "number" || !Number.isFinite(p) || p < 0 || p >= 1) {
        return Result.fail(
          new MessageEncodeError({ message: "progress is not a number in [0, 1)" }),
        )
      }
      if (message.payload === undefined) return Result.succeed(`${head},"progress":${p}}}`)
      return Result.map(
        jsonObject(message.payload, "progress payload"),
        (payload) => `${head},"progress":${p},"response":${payload}}}`,
      )
    }
    case "success":
      return Result.map(
        jsonObject(message.response, "response"),
        (response) => `${head},"response":${response}}}`,
      )
    case "failure": {
      if (!FAILURE_CODE_PATTERN.test(message.code)) {
        return Result.fail(
          new MessageEncodeError({
            message: `failure code does not match ${FAILURE_CODE_PATTERN}`,
          }),
        )
      }
      const text = JSON.stringify(truncateUtf8(message.message, MAX_FAILURE_MESSAGE_BYTES))
      return Result.succeed(
        `${head},"error_message":{"code":"${message.code}","message":${text}}}}`,
      )
    }
  }
}

/**
 * The exact UTF-8 bytes of a message: compact, keys in the spec's order, no trailing newline.
 * Throws {@link MessageEncodeError} for a message the spec does not allow.
 *
 * @since 0.1.0
 * @category codecs
 */
export const encodeMessage = (message: OutboundMessage): Uint8Array =>
  bytesOrThrow(encodeMessageText(message))

/** The UTF-8 bytes of an encoded text, or its error thrown. */
const bytesOrThrow = (text: Result.Result<string, MessageEncodeError>): Uint8Array =>
  Result.match(text, {
    onFailure: (error) => {
      throw error
    },
    onSuccess: encodeUtf8,
  })

/**
 * A task as a publisher submits it: the envelope's fields.
 *
 * @since 0.2.0
 * @category models
 */
export interface Submission {
  /** 1 to 256 characters: what the output messages name the task by. */
  readonly taskId: string
  /** The task's input: a JSON object, which the worker's input schema decodes. */
  readonly body: Readonly<Record<string, unknown>>
  readonly clientId?: string | undefined
  readonly inputRefs?: ReadonlyArray<string> | undefined
}

/**
 * The text of a task's envelope, keys in the order the platform writes them (`task_id`,
 * `client_id`, `data` with `message_type`, `body`, `input_refs`), or why a worker would not take
 * it as a task: a task id that is not 1 to 256 characters, a body that is not a JSON object, an
 * input reference that is not a string.
 *
 * @since 0.2.0
 * @category codecs
 */
export const encodeSubmissionText = (
  submission: Submission,
): Result.Result<string, MessageEncodeError> => {
  const { taskId, clientId, inputRefs } = submission
  // The worker's own reading of a task id, so that what this makes is what it takes.
  if (!isTaskId(taskId)) {
    return Result.fail(
      new MessageEncodeError({
        message: `the task id is not a string of 1 to ${MAX_TASK_ID_LENGTH} characters`,
      }),
    )
  }
  if (clientId !== undefined && typeof clientId !== "string") {
    return Result.fail(new MessageEncodeError({ message: "the client id is not a string" }))
  }
  if (
    inputRefs !== undefined &&
    (!Array.isArray(inputRefs) || !inputRefs.every((ref) => typeof ref === "string"))
  ) {
    return Result.fail(
      new MessageEncodeError({ message: "the input references are not a list of strings" }),
    )
  }
  return Result.map(jsonObject(submission.body, "body"), (body) => {
    const client = clientId === undefined ? "" : `,"client_id":${JSON.stringify(clientId)}`
    const refs = inputRefs === undefined ? "" : `,"input_refs":${JSON.stringify(inputRefs)}`
    return `{"task_id":${
      JSON.stringify(taskId)
    }${client},"data":{"message_type":"submission","body":${body}${refs}}}`
  })
}

/**
 * The UTF-8 bytes of a task's envelope (see {@link encodeSubmissionText}), for tests and tools
 * that publish tasks. Throws {@link MessageEncodeError} for a submission a worker would not take.
 *
 * @since 0.2.0
 * @category codecs
 */
export const encodeSubmission = (submission: Submission): Uint8Array =>
  bytesOrThrow(encodeSubmissionText(submission))

/**
 * A message as the platform's listener reads it back (what the harness returns).
 *
 * @since 0.1.0
 * @category models
 */
export interface WireMessage {
  readonly task_id: string
  readonly data: {
    readonly message_type: MessageType
    readonly hostname?: string
    readonly progress?: number
    readonly response?: Record<string, unknown>
    readonly error_message?: { readonly code: string; readonly message: string }
  }
}
