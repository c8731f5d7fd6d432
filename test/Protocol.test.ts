import { describe, expect, it } from "@effect/vitest"
import { Result } from "effect"
import fc from "fast-check"
import { readFileSync } from "node:fs"
import {
  type Decoded,
  decodeEnvelope,
  DEFAULT_MAX_MESSAGE_BYTES,
  encodeMessage,
  encodeMessageText,
  encodeSubmission,
  encodeSubmissionText,
  FAILURE_CODE_PATTERN,
  MAX_FAILURE_MESSAGE_BYTES,
  MessageEncodeError,
  type OutboundMessage,
  type PoisonReason,
  truncateUtf8,
} from "../src/Protocol.ts"
import { textOf, utf8 } from "./support/builders.ts"

// The spec's vectors, read from the shared file at run time (never copied here).
interface EncodeVector {
  readonly name: string
  readonly message: OutboundMessage
  readonly bytes: string
}

interface DecodeVector {
  readonly name: string
  readonly bytes_utf8?: string
  readonly bytes_hex?: string
  readonly expect: {
    readonly kind: "task" | "invalid_envelope" | "poison"
    readonly reason?: PoisonReason
    readonly task_id?: string
    readonly body?: Record<string, unknown>
    readonly client_id?: string
    readonly input_refs?: ReadonlyArray<string>
    readonly body_own_keys?: ReadonlyArray<string>
  }
}

const vectors: {
  readonly encode: ReadonlyArray<EncodeVector>
  readonly decode: ReadonlyArray<DecodeVector>
} = JSON.parse(
  readFileSync(new URL("../../shared/protocol/vectors.json", import.meta.url), "utf8"),
)

const POISON_REASONS: ReadonlyArray<PoisonReason> = [
  "too_large",
  "not_utf8",
  "not_json",
  "not_object",
  "no_task_id",
]

const text = (bytes: Uint8Array): string => new TextDecoder("utf-8", { fatal: true }).decode(bytes)
const utf8Length = (s: string): number => utf8(s).byteLength

const hexBytes = (hex: string): Uint8Array => {
  const bytes = new Uint8Array(hex.length / 2)
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16)
  return bytes
}

const decodeText = (json: string): Decoded => decodeEnvelope(utf8(json))

const expectTask = (decoded: Decoded) => {
  if (decoded._tag !== "Task") throw new Error(`expected a Task, got ${JSON.stringify(decoded)}`)
  return decoded.envelope
}

const expectNoPollution = () => {
  expect(Object.hasOwn(Object.prototype, "polluted")).toBe(false)
  expect(({} as Record<string, unknown>).polluted).toBeUndefined()
  expect(([] as unknown as Record<string, unknown>).polluted).toBeUndefined()
}

const isValidTaskId = (id: unknown): boolean =>
  typeof id === "string" && id.length > 0 && [...id].length <= 256

const envelopeText = (body: string, taskId = "a") =>
  `{"task_id":${JSON.stringify(taskId)},"data":{"message_type":"submission","body":${body}}}`

const depthOf = (value: unknown): number =>
  typeof value === "object" && value !== null
    ? 1 + Math.max(0, ...Object.values(value).map(depthOf))
    : 0

const failureMessageOf = (bytes: Uint8Array): string =>
  JSON.parse(text(bytes)).data.error_message.message

describe("Protocol", () => {
  it("loads the shared vectors", () => {
    expect(vectors.encode.length).toBeGreaterThan(0)
    expect(vectors.decode.length).toBeGreaterThan(0)
  })

  describe("encode vectors", () => {
    it.each(vectors.encode)("$name", (vector) => {
      const bytes = encodeMessage(vector.message)
      expect(text(bytes)).toBe(vector.bytes)
      expect(bytes).toEqual(utf8(vector.bytes))
    })
  })

  describe("decode vectors", () => {
    it.each(vectors.decode)("$name", (vector) => {
      const bytes = vector.bytes_hex !== undefined
        ? hexBytes(vector.bytes_hex)
        : utf8(vector.bytes_utf8 ?? "")
      expect(vector.bytes_hex !== undefined || vector.bytes_utf8 !== undefined).toBe(true)
      const decoded = decodeEnvelope(bytes)
      const expected = vector.expect
      switch (expected.kind) {
        case "task": {
          const envelope = expectTask(decoded)
          expect(envelope.taskId).toBe(expected.task_id)
          if (expected.body !== undefined) expect(envelope.body).toEqual(expected.body)
          expect(envelope.clientId).toBe(expected.client_id)
          expect(envelope.inputRefs).toEqual(expected.input_refs)
          if (expected.body_own_keys !== undefined) {
            expect(Object.keys(envelope.body)).toEqual(expected.body_own_keys)
            expect(Object.getPrototypeOf(envelope.body)).toBe(Object.prototype)
          }
          break
        }
        case "invalid_envelope":
          expect(decoded._tag).toBe("InvalidEnvelope")
          if (decoded._tag === "InvalidEnvelope") {
            expect(decoded.taskId).toBe(expected.task_id)
            expect(decoded.problem.length).toBeGreaterThan(0)
          }
          break
        case "poison":
          expect(decoded).toEqual({ _tag: "Poison", reason: expected.reason })
          break
        default:
          throw new Error(`unknown kind in the vectors: ${JSON.stringify(expected)}`)
      }
      expectNoPollution()
    })
  })

  describe("decodeEnvelope", () => {
    it("refuses a message over maxBytes before parsing it", () => {
      const message = utf8(envelopeText("{}"))
      expect(decodeEnvelope(message, { maxBytes: message.byteLength - 1 })).toEqual({
        _tag: "Poison",
        reason: "too_large",
      })
      expect(expectTask(decodeEnvelope(message, { maxBytes: message.byteLength })).taskId).toBe(
        "a",
      )
      // Not even looked at: invalid UTF-8 over the limit is too_large, not not_utf8.
      expect(decodeEnvelope(new Uint8Array([0xff, 0xff, 0xff]), { maxBytes: 2 })).toEqual({
        _tag: "Poison",
        reason: "too_large",
      })
    })

    it("allows exactly 16 MiB by default, not one byte more", () => {
      expect(DEFAULT_MAX_MESSAGE_BYTES).toBe(16 * 1024 * 1024)
      const envelope = envelopeText('{"k":1}')
      const exact = utf8(envelope + " ".repeat(DEFAULT_MAX_MESSAGE_BYTES - envelope.length))
      expect(exact.byteLength).toBe(DEFAULT_MAX_MESSAGE_BYTES)
      expect(expectTask(decodeEnvelope(exact)).body).toEqual({ k: 1 })
      const over = new Uint8Array(DEFAULT_MAX_MESSAGE_BYTES + 1).fill(0x20)
      expect(decodeEnvelope(over)).toEqual({ _tag: "Poison", reason: "too_large" })
    })

    it("accepts deep but allowed nesting (500 levels in the body)", () => {
      const json = envelopeText(`{"x":${"[".repeat(500)}${"]".repeat(500)}}`)
      const envelope = expectTask(decodeText(json))
      expect(depthOf(envelope.body.x)).toBe(500)
    })

    it("counts 512 levels as allowed and 513 as not_json (the root is level 1)", () => {
      // The envelope, data and body objects are three levels.
      const nested = (n: number) => envelopeText(`{"x":${"[".repeat(n)}${"]".repeat(n)}}`)
      expect(decodeText(nested(509))._tag).toBe("Task")
      expect(decodeText(nested(510))).toEqual({ _tag: "Poison", reason: "not_json" })
    })

    it("does not count brackets inside strings, escaped quotes included", () => {
      const inString = envelopeText(`{"s":${JSON.stringify(`"${"[".repeat(1000)}\\`)}}`)
      expect(expectTask(decodeText(inString)).body).toEqual({ s: `"${"[".repeat(1000)}\\` })
      // A string ending in an escaped backslash closes, so the real nesting after it counts.
      const hidden = envelopeText(`{"s":"\\\\","x":${"[".repeat(600)}${"]".repeat(600)}}`)
      expect(decodeText(hidden)).toEqual({ _tag: "Poison", reason: "not_json" })
    })

    it("accepts an envelope without message_type", () => {
      const envelope = expectTask(decodeText('{"task_id":"t-9","data":{"body":{"n":1}}}'))
      expect(envelope).toEqual({
        taskId: "t-9",
        body: { n: 1 },
        clientId: undefined,
        inputRefs: undefined,
      })
    })

    it.each([
      ["a number", "7"],
      ["null", "null"],
      ["an object", '{"id":"c"}'],
      ["an array", '["c"]'],
      ["a boolean", "true"],
    ])("makes client_id as %s an invalid envelope", (_, clientId) => {
      const decoded = decodeText(
        `{"task_id":"a","client_id":${clientId},"data":{"body":{}}}`,
      )
      expect(decoded._tag).toBe("InvalidEnvelope")
      if (decoded._tag === "InvalidEnvelope") {
        expect(decoded.taskId).toBe("a")
        expect(decoded.problem).toContain("client_id")
      }
    })

    it.each([
      ["a string", '"s3://b/k"'],
      ["null", "null"],
      ["an object", '{"0":"x"}'],
      ["mixed", '["ok",null]'],
    ])("makes input_refs as %s an invalid envelope", (_, refs) => {
      const decoded = decodeText(`{"task_id":"a","data":{"body":{},"input_refs":${refs}}}`)
      expect(decoded._tag).toBe("InvalidEnvelope")
      if (decoded._tag === "InvalidEnvelope") expect(decoded.problem).toContain("input_refs")
    })

    it("accepts empty input_refs", () => {
      const envelope = expectTask(decodeText('{"task_id":"a","data":{"body":{},"input_refs":[]}}'))
      expect(envelope.inputRefs).toEqual([])
    })

    it("makes a null message_type an invalid envelope", () => {
      expect(decodeText('{"task_id":"a","data":{"message_type":null,"body":{}}}')._tag).toBe(
        "InvalidEnvelope",
      )
    })

    it("ignores unknown keys at the top level and in data", () => {
      const envelope = expectTask(
        decodeText(
          '{"version":2,"task_id":"a","headers":{"x":[1]},"message_type":"other",' +
            '"body":"not this one","data":{"priority":9,"body":{"k":1},"extra":[{}]}}',
        ),
      )
      expect(envelope).toEqual({
        taskId: "a",
        body: { k: 1 },
        clientId: undefined,
        inputRefs: undefined,
      })
    })

    it("counts a task id's length in characters, not UTF-16 units", () => {
      const ok = (id: string) => decodeText(envelopeText("{}", id))
      expect(expectTask(ok("x".repeat(256))).taskId).toBe("x".repeat(256))
      expect(ok("x".repeat(257))).toEqual({ _tag: "Poison", reason: "no_task_id" })
      // 256 astral characters are 512 UTF-16 units.
      expect(expectTask(ok("😀".repeat(256))).taskId).toBe("😀".repeat(256))
      expect(ok("😀".repeat(257))).toEqual({ _tag: "Poison", reason: "no_task_id" })
    })

    it("keeps __proto__ keys as own data at every level", () => {
      const decoded = decodeText(
        '{"__proto__":{"polluted":1},"task_id":"a","data":{"__proto__":{"body":{"evil":1}},' +
          '"body":{"__proto__":{"polluted":true},"inner":{"__proto__":{"polluted":2}}}}}',
      )
      const envelope = expectTask(decoded)
      expect(Object.keys(envelope.body)).toEqual(["__proto__", "inner"])
      expect(Object.getPrototypeOf(envelope.body)).toBe(Object.prototype)
      expect(Object.getOwnPropertyDescriptor(envelope.body, "__proto__")?.value).toEqual({
        polluted: true,
      })
      expect((envelope.body as Record<string, unknown>).polluted).toBeUndefined()
      expectNoPollution()
    })
  })

  describe("encodeMessage", () => {
    it("writes a progress just under 1 as JSON.stringify writes it", () => {
      expect(text(encodeMessage({ type: "progress", task_id: "t", progress: 0.999 }))).toBe(
        '{"task_id":"t","data":{"message_type":"progress","progress":0.999}}',
      )
    })

    it("truncates a failure message to 8 KiB on a character boundary", () => {
      const encodeFailure = (message: string) =>
        failureMessageOf(encodeMessage({ type: "failure", task_id: "t", code: "E", message }))
      expect(MAX_FAILURE_MESSAGE_BYTES).toBe(8192)
      // Two-byte characters fill 8 KiB exactly.
      expect(encodeFailure("é".repeat(5000))).toBe("é".repeat(4096))
      // Three-byte characters: 2730 fit (8190 bytes), the 2731st would cross the limit.
      expect(encodeFailure("€".repeat(3000))).toBe("€".repeat(2730))
      // Four-byte characters shifted by one ASCII byte: the cut falls inside one.
      const cut = encodeFailure("a" + "😀".repeat(3000))
      expect(cut).toBe("a" + "😀".repeat(2047))
      expect(utf8Length(cut)).toBe(8189)
      expect(cut).not.toContain("\uFFFD")
      // At the limit, nothing is cut.
      expect(encodeFailure("é".repeat(4096))).toBe("é".repeat(4096))
      expect(encodeFailure("x".repeat(8192))).toBe("x".repeat(8192))
      expect(encodeFailure("x".repeat(8193))).toBe("x".repeat(8192))
    })

    it.each([
      "",
      "lower_case",
      "1STARTS_WITH_DIGIT",
      "_UNDERSCORE",
      "HAS-DASH",
      "HAS SPACE",
      "TRAILING_NEWLINE\n",
      "A".repeat(65),
    ])("refuses the failure code %j", (code) => {
      const message: OutboundMessage = { type: "failure", task_id: "t", code, message: "m" }
      expect(() => encodeMessage(message)).toThrow(MessageEncodeError)
      expect(Result.isFailure(encodeMessageText(message))).toBe(true)
    })

    it("accepts a failure code of 64 characters", () => {
      const code = "A" + "_9".repeat(31) + "Z"
      expect(code.length).toBe(64)
      expect(JSON.parse(text(encodeMessage({ type: "failure", task_id: "t", code, message: "" }))))
        .toEqual({
          task_id: "t",
          data: { message_type: "failure", error_message: { code, message: "" } },
        })
    })

    it.each([-0.1, 1, 1.5, -1, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY])(
      "refuses the progress %s",
      (progress) => {
        expect(() => encodeMessage({ type: "progress", task_id: "t", progress })).toThrow(
          MessageEncodeError,
        )
      },
    )

    it.each([
      ["NaN", { x: Number.NaN }, "$.x"],
      ["Infinity deep in an array", { x: { y: [1, Number.POSITIVE_INFINITY] } }, "$.x.y[1]"],
      ["-Infinity", { n: Number.NEGATIVE_INFINITY }, "$.n"],
    ])("refuses a non-finite number in a response (%s)", (_, response, path) => {
      const success: OutboundMessage = { type: "success", task_id: "t", response }
      expect(() => encodeMessage(success)).toThrow(MessageEncodeError)
      const left = Result.flip(encodeMessageText(success))
      expect(Result.isSuccess(left) && left.success.message).toContain(
        `${path} is a non-finite number`,
      )
      expect(() =>
        encodeMessage({ type: "progress", task_id: "t", progress: 0.5, payload: response })
      )
        .toThrow(MessageEncodeError)
    })

    it.each([
      ["an array", [1]],
      ["null", null],
      ["a string", "ok"],
      ["a Date", new Date(0)],
      ["an object holding a function", { f: () => 1 }],
      ["an object holding a bigint", { n: 1n }],
    ])("refuses a response that is %s", (_, response) => {
      expect(() =>
        encodeMessage({
          type: "success",
          task_id: "t",
          response: response as Record<string, unknown>,
        })
      ).toThrow(MessageEncodeError)
    })

    it("refuses a cyclic response with MessageEncodeError, not a stack overflow", () => {
      const cyclic: Record<string, unknown> = { a: 1 }
      cyclic.self = { back: cyclic }
      // Only the error's name reaches expect: a stack overflow is slow to report.
      let thrown = "nothing"
      try {
        encodeMessage({ type: "success", task_id: "t", response: cyclic })
      } catch (error) {
        thrown = error instanceof MessageEncodeError ? error.message : String(error).slice(0, 80)
      }
      expect(thrown).toBe("response: $.self.back is a circular reference")
      // The same object reached twice is not a cycle.
      const shared = { x: 1 }
      expect(
        text(encodeMessage({ type: "success", task_id: "t", response: { a: shared, b: shared } })),
      )
        .toBe(
          '{"task_id":"t","data":{"message_type":"success","response":{"a":{"x":1},"b":{"x":1}}}}',
        )
    })

    it("omits undefined keys of a response, as JSON.stringify does", () => {
      expect(
        text(encodeMessage({ type: "success", task_id: "t", response: { a: undefined, b: 1 } })),
      )
        .toBe('{"task_id":"t","data":{"message_type":"success","response":{"b":1}}}')
    })
  })

  describe("encodeSubmission", () => {
    it("writes the envelope as the platform does, and the worker reads it back as the task", () => {
      const bytes = encodeSubmission({
        taskId: "t-1",
        clientId: "c-9",
        body: { text: "a b", n: 2 },
        inputRefs: ["s3://b/k"],
      })
      expect(textOf(bytes)).toBe(
        '{"task_id":"t-1","client_id":"c-9","data":{"message_type":"submission",' +
          '"body":{"text":"a b","n":2},"input_refs":["s3://b/k"]}}',
      )
      const decoded = decodeEnvelope(bytes)
      expect(decoded._tag).toBe("Task")
      if (decoded._tag === "Task") {
        expect(decoded.envelope.taskId).toBe("t-1")
        expect(decoded.envelope.clientId).toBe("c-9")
        expect(decoded.envelope.body).toEqual({ text: "a b", n: 2 })
        expect(decoded.envelope.inputRefs).toEqual(["s3://b/k"])
      }
    })

    it("leaves out what is not given", () => {
      expect(textOf(encodeSubmission({ taskId: "t", body: {} }))).toBe(
        '{"task_id":"t","data":{"message_type":"submission","body":{}}}',
      )
    })

    it("refuses what a worker would not take as a task, saying why", () => {
      const problems = [
        { taskId: "", body: {} },
        { taskId: "x".repeat(257), body: {} },
        { taskId: "t", body: [] as unknown as Record<string, unknown> },
        { taskId: "t", body: { n: Number.NaN } },
        { taskId: "t", body: {}, clientId: 7 as unknown as string },
        { taskId: "t", body: {}, inputRefs: [1] as unknown as ReadonlyArray<string> },
      ].map((submission) => {
        const result = encodeSubmissionText(submission)
        return Result.isFailure(result) ? result.failure.message : "encoded"
      })
      expect(problems).toEqual([
        "the task id is not a string of 1 to 256 characters",
        "the task id is not a string of 1 to 256 characters",
        "body is not a JSON object",
        expect.stringMatching(/^body: /),
        "the client id is not a string",
        "the input references are not a list of strings",
      ])
      // 256 characters, counted as code points, is a task id.
      expect(Result.isSuccess(encodeSubmissionText({ taskId: "é".repeat(256), body: {} }))).toBe(
        true,
      )
      expect(() => encodeSubmission({ taskId: "", body: {} })).toThrow(MessageEncodeError)
    })
  })

  describe("properties", () => {
    it("classifies arbitrary bytes without throwing", () => {
      const anyBytes = fc.oneof(
        fc.uint8Array({ maxLength: 300 }),
        fc.string({ unit: "binary", maxLength: 100 }).map(utf8),
        fc.json({ maxDepth: 3 }).map(utf8),
        fc.record({ task_id: fc.jsonValue({ maxDepth: 1 }), data: fc.jsonValue({ maxDepth: 3 }) })
          .map((o) => utf8(JSON.stringify(o))),
      )
      fc.assert(
        fc.property(anyBytes, fc.option(fc.nat(400), { nil: undefined }), (bytes, maxBytes) => {
          const decoded = decodeEnvelope(bytes, { maxBytes })
          switch (decoded._tag) {
            case "Poison":
              expect(POISON_REASONS).toContain(decoded.reason)
              expect(decoded.reason === "too_large").toBe(
                maxBytes !== undefined && bytes.byteLength > maxBytes,
              )
              break
            case "InvalidEnvelope":
              expect(isValidTaskId(decoded.taskId)).toBe(true)
              expect(decoded.problem.length).toBeGreaterThan(0)
              break
            case "Task":
              expect(isValidTaskId(decoded.envelope.taskId)).toBe(true)
              expect(typeof decoded.envelope.body).toBe("object")
              expect(Array.isArray(decoded.envelope.body)).toBe(false)
              break
            default:
              throw new Error(`unexpected classification ${JSON.stringify(decoded)}`)
          }
        }),
        { numRuns: 500 },
      )
      expectNoPollution()
    })

    it("classifies well-formed JSON as neither not_utf8 nor not_json", () => {
      fc.assert(
        fc.property(fc.json({ maxDepth: 4, stringUnit: "binary" }), (json) => {
          const decoded = decodeEnvelope(utf8(json))
          if (decoded._tag === "Poison") {
            expect(["not_object", "no_task_id"]).toContain(decoded.reason)
          }
        }),
        { numRuns: 300 },
      )
    })

    it("decodes any JSON object body wrapped in an envelope to a Task with an equal body", () => {
      fc.assert(
        fc.property(
          fc.string({ unit: "binary", minLength: 1, maxLength: 256 }),
          fc.dictionary(fc.string({ unit: "binary" }), fc.jsonValue({ stringUnit: "binary" }), {
            maxKeys: 6,
          }),
          fc.option(fc.string({ unit: "binary" }), { nil: undefined }),
          fc.option(fc.array(fc.string(), { maxLength: 3 }), { nil: undefined }),
          fc.boolean(),
          fc.constantFrom(undefined, 1, 2, "\t"),
          (taskId, body, clientId, inputRefs, withType, indent) => {
            const envelope = {
              task_id: taskId,
              client_id: clientId,
              data: {
                message_type: withType ? "submission" : undefined,
                body,
                input_refs: inputRefs,
              },
            }
            const decoded = expectTask(decodeEnvelope(utf8(JSON.stringify(envelope, null, indent))))
            expect(decoded.taskId).toBe(taskId)
            // What a JSON round trip of the body gives (-0 is written as 0).
            expect(decoded.body).toEqual(JSON.parse(JSON.stringify(body)))
            expect(decoded.clientId).toBe(clientId)
            expect(decoded.inputRefs).toEqual(inputRefs)
          },
        ),
        { numRuns: 300 },
      )
    })

    it("never lets __proto__ keys reach Object.prototype", () => {
      const key = fc.constantFrom("__proto__", "constructor", "prototype", "polluted", "k")
      const { value } = fc.letrec<{ value: string; object: string; array: string }>((tie) => ({
        value: fc.oneof(
          { depthSize: "small", withCrossShrink: true },
          fc.constantFrom("true", "1", '"x"', "null"),
          tie("object"),
          tie("array"),
        ),
        object: fc.array(fc.tuple(key, tie("value")), { maxLength: 4 }).map((entries) =>
          `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`
        ),
        array: fc.array(tie("value"), { maxLength: 3 }).map((items) => `[${items.join(",")}]`),
      }))
      fc.assert(
        fc.property(value, value, value, (top, data, body) => {
          const json = `{"__proto__":${top},"task_id":"a","data":{"__proto__":${data},` +
            `"body":{"__proto__":${body},"polluted":false}}}`
          const envelope = expectTask(decodeEnvelope(utf8(json)))
          expect(Object.keys(envelope.body)).toEqual(["__proto__", "polluted"])
          expect(Object.getPrototypeOf(envelope.body)).toBe(Object.prototype)
          expectNoPollution()
        }),
        { numRuns: 300 },
      )
    })

    it("encodes success messages that JSON.parse reads back unchanged", () => {
      fc.assert(
        fc.property(
          fc.string({ unit: "binary", minLength: 1, maxLength: 64 }),
          fc.dictionary(fc.string({ unit: "binary" }), fc.jsonValue({ stringUnit: "binary" }), {
            maxKeys: 6,
          }),
          (taskId, response) => {
            const wire = text(encodeMessage({ type: "success", task_id: taskId, response }))
            const expected = { task_id: taskId, data: { message_type: "success", response } }
            // Compact, keys in the spec's order: exactly JSON.stringify of that shape.
            expect(wire).toBe(JSON.stringify(expected))
            expect(JSON.parse(wire)).toEqual(JSON.parse(JSON.stringify(expected)))
          },
        ),
        { numRuns: 300 },
      )
    })

    it("encodes any valid failure with a message cut to at most 8 KiB", () => {
      fc.assert(
        fc.property(
          fc.stringMatching(FAILURE_CODE_PATTERN),
          fc.string({ unit: "binary", maxLength: 3000 }),
          (code, message) => {
            const wire = JSON.parse(
              text(encodeMessage({ type: "failure", task_id: "t", code, message })),
            )
            expect(wire.data.error_message.code).toBe(code)
            const sent: string = wire.data.error_message.message
            expect(utf8Length(sent)).toBeLessThanOrEqual(MAX_FAILURE_MESSAGE_BYTES)
            expect(message.startsWith(sent)).toBe(true)
          },
        ),
        { numRuns: 200 },
      )
    })

    it("truncateUtf8 keeps the longest whole-character prefix that fits", () => {
      fc.assert(
        fc.property(fc.string({ unit: "binary", maxLength: 40 }), fc.nat(80), (s, maxBytes) => {
          const cut = truncateUtf8(s, maxBytes)
          expect(s.startsWith(cut)).toBe(true)
          expect(utf8Length(cut)).toBeLessThanOrEqual(maxBytes)
          if (cut !== s) {
            const next = String.fromCodePoint(s.slice(cut.length).codePointAt(0)!)
            expect(utf8Length(cut) + utf8Length(next)).toBeGreaterThan(maxBytes)
          }
        }),
        { numRuns: 500 },
      )
    })
  })
})
