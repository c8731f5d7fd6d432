/**
 * The kit's battery: the envelopes it publishes, each with what the protocol says must come of
 * it. Written as bytes, with the kit's own hands: a judge does not use the accused's codec.
 */

/** What must come of a case on the output queue. */
export type Expectation =
  | { readonly kind: "success"; readonly echo: unknown }
  | {
    readonly kind: "failure"
    readonly code: string
    readonly message?: string
    /** Whether a handler runs (`started` first), and on how many attempts. */
    readonly attempts: number
  }
  /** Nothing published for it, the delivery acked. */
  | { readonly kind: "poison" }

/** The rule a case stands for, by its id (see rules.ts). */
export type CaseRule =
  | "envelope-variants"
  | "poison-silent"
  | "invalid-message"
  | "invalid-input"
  | "invalid-output"
  | "task-timeout"
  | "handler-failure"
  | "retries-counted"
  | "progress"

export interface Case {
  /** The task id it carries, if any: output naming it is what the kit reads. */
  readonly taskId: string
  readonly name: string
  readonly rule: CaseRule
  readonly bytes: Uint8Array
  readonly expect: Expectation
}

/** What the kit knows of the service under test: the settings its cases depend on. */
export interface ServiceTerms {
  readonly deliveryLimit: number
  /**
   * The worker's `WORKER_MAX_MESSAGE_BYTES`, if the kit is told it: one byte more is poison. Only
   * then is the case sent: a broker's own limit may be lower (RabbitMQ 4's is 16 MiB).
   */
  readonly maxMessageBytes: number | undefined
  /** The worker's progress interval, in ms: the progress case's waits are counted in it. */
  readonly progressIntervalMs: number
}

const utf8 = (text: string) => new TextEncoder().encode(text)

const envelope = (taskId: string, body: unknown, extra: Record<string, unknown> = {}) =>
  utf8(JSON.stringify({ task_id: taskId, data: { message_type: "submission", body }, ...extra }))

const succeed = (echo: unknown) => ({ steps: [], end: { succeed: echo } })

/**
 * The progress case's steps, for an interval of `interval` ms: what a throttled worker publishes
 * of them is the rules' business. A burst (0.2 back, 1 out of range), a state held through an
 * interval, a later state, then one back after an interval has passed: a worker that lets progress
 * go back sends it at once. It lasts 4.2 intervals.
 */
export const progressSteps = (interval: number) => [
  { progress: 0.1 },
  { progress: 0.3 },
  { progress: 0.2 },
  { progress: 1 },
  { progress: 0.5, payload: { stage: "late" } },
  { wait_ms: 1.5 * interval },
  { progress: 0.7 },
  { wait_ms: 1.5 * interval },
  { progress: 0.6 },
  { wait_ms: 1.2 * interval },
]

const variants = (id: (name: string) => string): ReadonlyArray<Case> => {
  const ok = (name: string, bytes: Uint8Array, echo: unknown): Case => ({
    taskId: id(name),
    name,
    rule: "envelope-variants",
    bytes,
    expect: { kind: "success", echo },
  })
  const body = (echo: unknown) => JSON.stringify(succeed(echo))
  return [
    ok(
      "keys in another order",
      utf8(
        `{"data":{"body":${body({ v: "order" })},"message_type":"submission"},"task_id":"${
          id("keys in another order")
        }"}`,
      ),
      { v: "order" },
    ),
    ok(
      "unknown keys at both levels",
      utf8(
        `{"task_id":"${id("unknown keys at both levels")}","body":{"x":1},"message_type":"x",` +
          `"data":{"message_type":"submission","body":${
            body({ v: "extra" })
          },"extra":[1]},"z":null}`,
      ),
      { v: "extra" },
    ),
    ok(
      "unicode in the id and the body: ünï ✓",
      envelope(id("unicode in the id and the body: ünï ✓"), succeed({ v: 'héllo 🌍 \u2028 "q"' })),
      { v: 'héllo 🌍 \u2028 "q"' },
    ),
    ok(
      "client_id, input_refs, Python's spacing",
      utf8(
        `{"task_id": "${id("client_id, input_refs, Python's spacing")}", "client_id": "c-9", ` +
          `"data": {"message_type": "submission", "body": ${
            body({ v: "refs" })
          }, "input_refs": ["s3://b/k"]}}`,
      ),
      { v: "refs" },
    ),
    ok(
      "no message_type",
      utf8(JSON.stringify({ task_id: id("no message_type"), data: { body: succeed({ v: 0 }) } })),
      { v: 0 },
    ),
  ]
}

/** A valid envelope of exactly `size` bytes, padded in its body. */
const ofSize = (taskId: string, size: number): Uint8Array => {
  const head = `{"task_id":"${taskId}","data":{"body":{"steps":[],"end":{"succeed":{"pad":"`
  const tail = `"}}}}}`
  return utf8(head + "x".repeat(Math.max(0, size - head.length - tail.length)) + tail)
}

const poison = (
  id: (name: string) => string,
  maxMessageBytes: number | undefined,
): ReadonlyArray<Case> => {
  const silent = (name: string, bytes: Uint8Array): Case => ({
    taskId: id(name),
    name,
    rule: "poison-silent",
    bytes,
    expect: { kind: "poison" },
  })
  const good = JSON.stringify(succeed({ v: "poison" }))
  // Over the protocol's 256 characters: no output may name it.
  const long = id("a task_id of 257 characters").padEnd(257, "x")
  const tooLarge = maxMessageBytes === undefined
    ? []
    : [silent("over the size limit", ofSize(id("over the size limit"), maxMessageBytes + 1))]
  return [
    ...tooLarge,
    silent("not JSON", utf8(`{"task_id":"${id("not JSON")}","data":{"body":`)),
    silent(
      "not UTF-8",
      new Uint8Array([
        ...utf8(`{"task_id":"${id("not UTF-8")}","data":{"body":{"t":"`),
        0xff,
        0xfe,
        ...utf8(`"}}}`),
      ]),
    ),
    silent("an array, not an object", utf8(`[{"task_id":"${id("an array, not an object")}"}]`)),
    silent("no task_id", utf8(`{"data":{"message_type":"submission","body":${good}}}`)),
    silent("a task_id that is a number", utf8(`{"task_id":42,"data":{"body":${good}}}`)),
    silent("an empty task_id", utf8(`{"task_id":"","data":{"body":${good}}}`)),
    {
      ...silent(
        "a task_id of 257 characters",
        utf8(`{"task_id":"${long}","data":{"body":${good}}}`),
      ),
      taskId: long,
    },
  ]
}

const malformed = (id: (name: string) => string): ReadonlyArray<Case> => {
  const invalid = (name: string, envelopeText: string): Case => ({
    taskId: id(name),
    name,
    rule: "invalid-message",
    bytes: utf8(envelopeText),
    expect: { kind: "failure", code: "INVALID_MESSAGE", attempts: 0 },
  })
  const good = JSON.stringify(succeed({ v: "malformed" }))
  return [
    invalid("no data", `{"task_id":"${id("no data")}"}`),
    invalid(
      "no data.body",
      `{"task_id":"${id("no data.body")}","data":{"message_type":"submission"}}`,
    ),
    invalid(
      "another message_type",
      `{"task_id":"${id("another message_type")}","data":{"message_type":"result","body":${good}}}`,
    ),
    invalid(
      "client_id a number",
      `{"task_id":"${id("client_id a number")}","client_id":5,"data":{"body":${good}}}`,
    ),
    invalid(
      "client_id null",
      `{"task_id":"${id("client_id null")}","client_id":null,"data":{"body":${good}}}`,
    ),
    invalid(
      "input_refs a string",
      `{"task_id":"${id("input_refs a string")}","data":{"body":${good},"input_refs":"s3://b/k"}}`,
    ),
  ]
}

/** Every case of one run: `prefix` makes its task ids its own. */
export const battery = (prefix: string, terms: ServiceTerms): ReadonlyArray<Case> => {
  const id = (name: string) => `${prefix}-${name.replace(/[^\p{L}\p{N}✓]+/gu, "-")}`
  const handled = (
    name: string,
    rule: CaseRule,
    body: unknown,
    expect: Expectation,
  ): Case => ({ taskId: id(name), name, rule, bytes: envelope(id(name), body), expect })
  return [
    ...variants(id),
    ...poison(id, terms.maxMessageBytes),
    ...malformed(id),
    handled("a body the input schema refuses", "invalid-input", { steps: 5, end: {} }, {
      kind: "failure",
      code: "INVALID_INPUT",
      attempts: 0,
    }),
    handled("an output the output schema refuses", "invalid-output", {
      steps: [],
      end: { break_output: true },
    }, { kind: "failure", code: "INVALID_OUTPUT", attempts: 1 }),
    handled("a handler that never returns", "task-timeout", { steps: [], end: { hang: true } }, {
      kind: "failure",
      code: "TASK_TIMEOUT",
      attempts: 1,
    }),
    handled("a handler's failure", "handler-failure", {
      steps: [],
      end: { fail: { code: "CONFORMANCE_FAILED", message: "Failed, as asked: ünï ✓" } },
    }, {
      kind: "failure",
      code: "CONFORMANCE_FAILED",
      message: "Failed, as asked: ünï ✓",
      attempts: 1,
    }),
    handled("a retry with a code", "retries-counted", {
      steps: [],
      end: { retry: { code: "CONFORMANCE_RETRIED", delay_ms: 0 } },
    }, { kind: "failure", code: "CONFORMANCE_RETRIED", attempts: terms.deliveryLimit }),
    handled("a retry without a code", "retries-counted", {
      steps: [],
      end: { retry: { delay_ms: 0 } },
    }, { kind: "failure", code: "RETRY_EXHAUSTED", attempts: terms.deliveryLimit }),
    handled(
      "progress",
      "progress",
      { steps: progressSteps(terms.progressIntervalMs), end: { succeed: { v: "progress" } } },
      {
        kind: "success",
        echo: { v: "progress" },
      },
    ),
  ]
}
