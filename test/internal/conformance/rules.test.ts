/**
 * The kit's judgement, with no broker: a worker's output as a correct worker writes it passes
 * every rule, and each change that breaks one rule fails that rule alone; the kit's reading of a
 * message's bytes.
 */
import { describe, expect, it } from "vitest"
import { battery, type Case } from "../../../src/internal/conformance/battery.ts"
import { read, type Reading } from "../../../src/internal/conformance/reading.ts"
import { judge, type Observed } from "../../../src/internal/conformance/rules.ts"
import { utf8 } from "../../support/builders.ts"

const cases = battery("t", { deliveryLimit: 3, maxMessageBytes: 100, progressIntervalMs: 1000 })
const named = (name: string) => cases.find((c) => c.name === name)!

const message = (
  taskId: string,
  data: Record<string, unknown>,
  at: number,
  options: { readonly text?: string; readonly deliveryMode?: number } = {},
): Reading =>
  read({
    bytes: utf8(options.text ?? JSON.stringify({ task_id: taskId, data })),
    properties: {
      deliveryMode: options.deliveryMode ?? 2,
      contentType: "application/json",
      type: String(data.message_type),
    },
    at,
  })

const started = (c: Case, at = 0) =>
  message(c.taskId, { message_type: "started", hostname: "h" }, at)
const progress = (c: Case, p: number, at: number, response?: unknown) =>
  message(c.taskId, {
    message_type: "progress",
    progress: p,
    ...(response === undefined ? {} : { response }),
  }, at)

/** What a correct worker publishes for `c`. */
const correct = (c: Case): Array<Reading> => {
  const e = c.expect
  if (e.kind === "poison") return []
  if (e.kind === "failure") {
    const error = { code: e.code, message: e.message ?? "as the worker says" }
    return [
      ...Array.from({ length: e.attempts }, (_, i) => started(c, i * 10)),
      message(c.taskId, { message_type: "failure", error_message: error }, 100),
    ]
  }
  const steps = c.rule === "progress"
    ? [progress(c, 0.1, 0), progress(c, 0.5, 1000, { stage: "late" }), progress(c, 0.7, 2000)]
    : []
  return [
    started(c),
    ...steps,
    message(c.taskId, { message_type: "success", response: { ok: true, echo: e.echo } }, 4200),
  ]
}

/** The verdicts other than pass, on every case's output as `change` leaves it. */
const failing = (
  change: (c: Case, messages: Array<Reading>) => Array<Reading> = (_, m) => m,
  input: Partial<Observed> = {},
) => {
  const readings = cases.flatMap((c) => change(c, correct(c)))
  return judge(cases, { readings, ready: 0, unacked: 0, ...input }, { progressIntervalS: 1 })
    .filter((r) => r.verdict !== "pass").map((r) => r.id)
}

/** Changes the messages of the case named `name` only. */
const onCase = (name: string, change: (c: Case, messages: Array<Reading>) => Array<Reading>) =>
(
  c: Case,
  messages: Array<Reading>,
) => (c.name === name ? change(c, messages) : messages)

const replaceLast = (data: Record<string, unknown>) => (c: Case, m: Array<Reading>) => [
  ...m.slice(0, -1),
  message(c.taskId, data, 100),
]

describe("the conformance kit's rules", () => {
  it("a correct worker's output passes every rule", () => {
    expect(failing()).toEqual([])
  })

  it.each(
    [
      [
        "envelope-variants",
        onCase(
          "keys in another order",
          replaceLast({ message_type: "success", response: { ok: true, echo: 1 } }),
        ),
      ],
      [
        "poison-silent",
        (c: Case, m: Array<Reading>) =>
          c.name === "not JSON"
            ? [
              message(c.taskId, {
                message_type: "failure",
                error_message: { code: "X", message: "x" },
              }, 0),
            ]
            : m,
      ],
      [
        "invalid-message",
        onCase(
          "no data",
          replaceLast({
            message_type: "failure",
            error_message: { code: "INVALID_INPUT", message: "x" },
          }),
        ),
      ],
      ["invalid-input", onCase("a body the input schema refuses", (c, m) => [started(c), ...m])],
      [
        "invalid-output",
        onCase(
          "an output the output schema refuses",
          replaceLast({
            message_type: "failure",
            error_message: { code: "INTERNAL_ERROR", message: "x" },
          }),
        ),
      ],
      [
        "task-timeout",
        onCase(
          "a handler that never returns",
          replaceLast({
            message_type: "failure",
            error_message: { code: "INTERNAL_ERROR", message: "x" },
          }),
        ),
      ],
      [
        "handler-failure",
        onCase(
          "a handler's failure",
          replaceLast({
            message_type: "failure",
            error_message: { code: "CONFORMANCE_FAILED", message: "another text" },
          }),
        ),
      ],
      [
        "started-first",
        onCase("no message_type", (c, m) => [
          message(c.taskId, { message_type: "started", hostname: "" }, 0),
          ...m.slice(1),
        ]),
      ],
      [
        "progress-range",
        onCase("no message_type", (c, m) => [m[0]!, progress(c, -0.1, 5), ...m.slice(1)]),
      ],
      [
        "progress-monotonic",
        onCase("progress", (c, m) => [...m.slice(0, -1), progress(c, 0.6, 3500), m.at(-1)!]),
      ],
      [
        "progress-throttled",
        onCase("progress", (c, m) => [
          m[0]!,
          progress(c, 0.1, 0),
          progress(c, 0.5, 100, { stage: "late" }),
          progress(c, 0.7, 200),
          m.at(-1)!,
        ]),
      ],
      ["progress-latest", onCase("progress", (_, m) => m.filter((r) => r.data?.progress !== 0.5))],
      ["one-terminal", onCase("no message_type", (_, m) => [...m, m.at(-1)!])],
      ["retries-counted", onCase("a retry with a code", (_, m) => m.slice(1))],
      [
        "bytes-exact",
        onCase("no message_type", (c, m) => [
          message(c.taskId, { message_type: "started", hostname: "h" }, 0, {
            text: JSON.stringify(
              { task_id: c.taskId, data: { message_type: "started", hostname: "h" } },
              null,
              2,
            ),
          }),
          ...m.slice(1),
        ]),
      ],
      [
        "properties",
        onCase("no message_type", (c, m) => [
          message(c.taskId, { message_type: "started", hostname: "h" }, 0, { deliveryMode: 1 }),
          ...m.slice(1),
        ]),
      ],
    ] as const,
  )("%s fails, alone, when its rule is broken", (rule, change) => {
    expect(failing(change)).toEqual([rule])
  })

  it("queue-drained: fails with messages ready or unacked, and is not observable without a count", () => {
    expect(failing(undefined, { ready: 1 })).toEqual(["queue-drained"])
    expect(failing(undefined, { unacked: 2 })).toEqual(["queue-drained"])
    const unobserved = judge(cases, {
      readings: cases.flatMap(correct),
      ready: 0,
      unacked: { unobserved: "no count" },
    }, { progressIntervalS: 1 }).find((r) => r.id === "queue-drained")
    expect(unobserved).toMatchObject({ verdict: "not observable", detail: "0 ready; no count" })
  })

  it("sends the size case only when the worker's limit is known, one byte over it", () => {
    expect(named("over the size limit").bytes.length).toBe(101)
    const unsized = battery("t", {
      deliveryLimit: 3,
      maxMessageBytes: undefined,
      progressIntervalMs: 1000,
    })
    expect(unsized.some((c) => c.name === "over the size limit")).toBe(false)
  })
})

describe("the conformance kit's reading of a message", () => {
  const received = (text: string | Uint8Array) => ({
    bytes: typeof text === "string" ? utf8(text) : text,
    properties: {},
    at: 0,
  })

  it("takes the protocol's compact form, and says what keeps another from it", () => {
    const ok = read(
      received(
        '{"task_id":"t","data":{"message_type":"progress","progress":0.5,"response":{"b":1,"a":"é"}}}',
      ),
    )
    expect(ok.malformed).toBeUndefined()
    expect(
      read(received('{"data":{"message_type":"started","hostname":"h"},"task_id":"t"}')).malformed,
    )
      .toBe('its bytes are not {"task_id":"t","data":{"message_type":"started","hostname":"h"}}')
    expect(
      read(received('{"task_id":"t","data":{"message_type":"started","hostname":"h"}}\n'))
        .malformed,
    )
      .toContain("its bytes are not")
    expect(
      read(received('\ufeff{"task_id":"t","data":{"message_type":"started","hostname":"h"}}'))
        .malformed,
    )
      .toBe("it is not JSON")
    expect(read(received(new Uint8Array([0x7b, 0xff]))).malformed).toBe("its bytes are not UTF-8")
    expect(
      read(
        received('{"task_id":"t","data":{"message_type":"failure","error_message":{"code":"X"}}}'),
      ).malformed,
    )
      .toBe("its error_message is not {code, message}, both strings")
    expect(
      read(received('{"task_id":"t","data":{"message_type":"started","hostname":"h","pid":1}}'))
        .malformed,
    )
      .toBe("it has keys the protocol does not: pid")
  })
})
