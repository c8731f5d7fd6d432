/**
 * The rules the kit checks, each judged from what reached the output queue (and what is left on
 * the input queue), each linked to the section of the protocol page that states it.
 */
import type { Case, CaseRule } from "./battery.ts"
import { type Reading, show } from "./reading.ts"

/**
 * What the kit says of a rule: `not observable` when what it could see cannot tell (the input
 * queue's unacked deliveries, when the broker's management API or `rabbitmqctl` does not say).
 *
 * @since 0.3.0
 * @category models
 */
export type Verdict = "pass" | "fail" | "not observable"

/**
 * One rule's verdict (`pass`, `fail`, `not observable`), with the section of the protocol page
 * that states the rule, and a failure's offending message.
 *
 * @since 0.2.0
 * @category models
 */
export interface RuleResult {
  readonly id: string
  readonly title: string
  readonly section: string
  readonly verdict: Verdict
  /** A failure's offending message, or why a rule is not observable. */
  readonly detail?: string | undefined
}

/** What the kit saw: every output message read, and the input queue once the battery was done. */
export interface Observed {
  readonly readings: ReadonlyArray<Reading>
  readonly ready: number
  /**
   * The input queue's unacked deliveries, where the broker tells the kit (not over AMQP), or why
   * it could not tell.
   */
  readonly unacked: number | { readonly unobserved: string }
}

export interface Terms {
  readonly progressIntervalS: number
}

const TERMINAL = new Set(["success", "failure"])

const sameJson = (a: unknown, b: unknown): boolean => {
  const sorted = (u: unknown): unknown =>
    Array.isArray(u)
      ? u.map(sorted)
      : typeof u === "object" && u !== null
      ? Object.fromEntries(Object.keys(u).sort().map((k) => [k, sorted((u as never)[k])]))
      : u
  return JSON.stringify(sorted(a)) === JSON.stringify(sorted(b))
}

/** The first problem of each case, or undefined: a rule fails on the first it finds. */
type Check = (messages: ReadonlyArray<Reading>, c: Case) => string | undefined

const terminalOf = (messages: ReadonlyArray<Reading>) =>
  messages.find((m) => TERMINAL.has(m.type ?? ""))

const errorOf = (m: Reading | undefined) =>
  m?.data?.error_message as { code?: unknown; message?: unknown } | undefined

/** The failure a case must conclude with, and whether a handler ran first. */
const concludes: Check = (messages, c) => {
  if (c.expect.kind !== "failure") return undefined
  const terminal = terminalOf(messages)
  if (terminal === undefined) return `${c.name}: no terminal message`
  const error = errorOf(terminal)
  if (terminal.type !== "failure" || error?.code !== c.expect.code) {
    return `${c.name}: expected a failure ${c.expect.code}, got ${show(terminal)}`
  }
  if (c.expect.message !== undefined && error.message !== c.expect.message) {
    return `${c.name}: expected the message ${JSON.stringify(c.expect.message)}, got ${
      show(terminal)
    }`
  }
  const started = messages.filter((m) => m.type === "started")
  if (c.expect.attempts === 0 && started.length > 0) {
    return `${c.name}: no handler may run, but ${show(started[0]!)}`
  }
  return undefined
}

const succeeds: Check = (messages, c) => {
  if (c.expect.kind !== "success") return undefined
  const terminal = terminalOf(messages)
  if (terminal === undefined) return `${c.name}: no terminal message`
  const expected = { ok: true, echo: c.expect.echo }
  if (terminal.type !== "success" || !sameJson(terminal.data?.response, expected)) {
    return `${c.name}: expected success ${JSON.stringify(expected)}, got ${show(terminal)}`
  }
  return undefined
}

const silent: Check = (messages, c) =>
  messages.length === 0
    ? undefined
    : `${c.name}: nothing may be published, but ${show(messages[0]!)}`

const startedFirst: Check = (messages, c) => {
  const runs = c.expect.kind === "success" || (c.expect.kind === "failure" && c.expect.attempts > 0)
  if (!runs || messages.length === 0) return undefined
  const first = messages[0]!
  if (first.type !== "started") return `${c.name}: the first message is not started: ${show(first)}`
  for (const started of messages.filter((m) => m.type === "started")) {
    const hostname = started.data?.hostname
    if (typeof hostname !== "string" || hostname === "") {
      return `${c.name}: started without a hostname: ${show(started)}`
    }
  }
  return undefined
}

const oneTerminal: Check = (messages, c) => {
  if (c.expect.kind === "poison") return undefined
  const terminals = messages.filter((m) => TERMINAL.has(m.type ?? ""))
  if (terminals.length !== 1) {
    return `${c.name}: ${terminals.length} terminal messages${
      terminals.length === 0 ? "" : `: ${terminals.map(show).join(" then ")}`
    }`
  }
  const after = messages.slice(messages.indexOf(terminals[0]!) + 1)
  return after.length === 0
    ? undefined
    : `${c.name}: published after its terminal message: ${show(after[0]!)}`
}

const retries: Check = (messages, c) => {
  if (c.expect.kind !== "failure") return undefined
  const started = messages.filter((m) => m.type === "started").length
  if (started !== c.expect.attempts) {
    return `${c.name}: ${started} attempts started, where the delivery limit is ${c.expect.attempts}`
  }
  return concludes(messages, c)
}

/** The progress messages of each attempt (a `started` begins one). */
const attemptsOf = (messages: ReadonlyArray<Reading>): ReadonlyArray<ReadonlyArray<Reading>> => {
  const attempts: Array<Array<Reading>> = []
  for (const m of messages) {
    if (m.type === "started" || attempts.length === 0) attempts.push([])
    if (m.type === "progress") attempts.at(-1)!.push(m)
  }
  return attempts
}

const progressValue = (m: Reading) => m.data?.progress

const progressRange: Check = (messages, c) => {
  for (const m of messages.filter((m) => m.type === "progress")) {
    const p = progressValue(m)
    const response = m.data?.response
    if (typeof p !== "number" || !Number.isFinite(p) || p < 0 || p >= 1) {
      return `${c.name}: a progress outside [0, 1): ${show(m)}`
    }
    if (
      response !== undefined &&
      (typeof response !== "object" || response === null || Array.isArray(response))
    ) {
      return `${c.name}: a progress response that is not an object: ${show(m)}`
    }
  }
  return undefined
}

const progressMonotonic: Check = (messages, c) => {
  for (const attempt of attemptsOf(messages)) {
    for (let i = 1; i < attempt.length; i++) {
      if ((progressValue(attempt[i]!) as number) < (progressValue(attempt[i - 1]!) as number)) {
        return `${c.name}: progress went back: ${show(attempt[i - 1]!)} then ${show(attempt[i]!)}`
      }
    }
  }
  return undefined
}

const progressThrottled = (intervalS: number): Check => (messages, c) => {
  if (c.rule !== "progress") return undefined
  // The kit reads the messages, not their publishes, and a busy machine delays one read more than
  // the next: half the interval allowed, where a worker that does not throttle sends at once.
  const least = intervalS * 1000 / 2
  for (const attempt of attemptsOf(messages)) {
    for (let i = 1; i < attempt.length; i++) {
      const gap = attempt[i]!.received.at - attempt[i - 1]!.received.at
      if (gap < least) {
        return `${c.name}: two progress messages ${gap} ms apart (the interval is ${intervalS} s): ` +
          `${show(attempt[i - 1]!)} then ${show(attempt[i]!)}`
      }
    }
  }
  return undefined
}

/**
 * The progress case reports 0.1, 0.3, 0.2 (back), 1 (out of range), 0.5 with a payload, all at
 * once, then 0.7 after 1.5 s, then 0.6 (back) after 1.5 s more. Whatever the throttle sent first,
 * the state held through the first wait is 0.5 with its payload, and the interval ends within it:
 * that must go out, then 0.7; nothing but the states reported (going back is another rule's).
 */
const progressLatest: Check = (messages, c) => {
  if (c.rule !== "progress") return undefined
  // Its steps take 4.2 s, within the time limit: a case that did not succeed says nothing here.
  const unread = succeeds(messages, c)
  if (unread !== undefined) return unread
  const progress = attemptsOf(messages).at(-1) ?? []
  const values = progress.map(progressValue)
  const stray = values.find((v) => ![0.1, 0.3, 0.2, 0.5, 0.7, 0.6].includes(v as number))
  if (stray !== undefined) {
    return `${c.name}: ${stray} was published, which was never a state: ${values.join(", ")}`
  }
  const late = progress.find((m) => progressValue(m) === 0.5)
  if (late === undefined || !sameJson(late.data?.response, { stage: "late" })) {
    return `${c.name}: the state held through the interval (0.5, {"stage":"late"}) was not sent: ` +
      (progress.map(show).join(" then ") || "no progress")
  }
  if (!values.includes(0.7)) {
    return `${c.name}: the state 0.7 was not sent: ${values.join(", ")}`
  }
  return undefined
}

interface Rule {
  readonly id: string
  readonly title: string
  readonly section: string
  /** The cases it reads (all, if undefined), and its check of each. */
  readonly cases?: ReadonlyArray<CaseRule>
  readonly check: Check
}

const rulesOf = (terms: Terms): ReadonlyArray<Rule> => [
  {
    id: "envelope-variants",
    title: "envelopes in every allowed form are accepted",
    section: "#the-task-envelope",
    cases: ["envelope-variants"],
    check: succeeds,
  },
  {
    id: "poison-silent",
    title: "each poison message is acked with nothing published",
    section: "#poison-messages",
    cases: ["poison-silent"],
    check: silent,
  },
  {
    id: "invalid-message",
    title: "an invalid envelope with a task id concludes INVALID_MESSAGE, no started",
    section: "#poison-messages",
    cases: ["invalid-message"],
    check: concludes,
  },
  {
    id: "invalid-input",
    title: "an input the schema refuses concludes INVALID_INPUT, no started",
    section: "#poison-messages",
    cases: ["invalid-input"],
    check: concludes,
  },
  {
    id: "invalid-output",
    title: "an output the schema refuses concludes INVALID_OUTPUT",
    section: "#failure-codes",
    cases: ["invalid-output"],
    check: concludes,
  },
  {
    id: "task-timeout",
    title: "a handler past its time limit concludes TASK_TIMEOUT",
    section: "#failure-codes",
    cases: ["task-timeout"],
    check: concludes,
  },
  {
    id: "handler-failure",
    title: "a handler's failure concludes with its code and message",
    section: "#failure-codes",
    cases: ["handler-failure"],
    check: concludes,
  },
  {
    id: "started-first",
    title: "started comes first in each attempt, with a hostname",
    section: "#output-messages",
    check: startedFirst,
  },
  {
    id: "progress-range",
    title: "progress is a number in [0, 1), its response an object",
    section: "#progress",
    check: progressRange,
  },
  {
    id: "progress-monotonic",
    title: "progress never goes back within an attempt",
    section: "#progress",
    check: progressMonotonic,
  },
  {
    id: "progress-throttled",
    title: "at most one progress message per interval per task",
    section: "#progress",
    cases: ["progress"],
    check: progressThrottled(terms.progressIntervalS),
  },
  {
    id: "progress-latest",
    title: "the progress sent after an interval is the latest state",
    section: "#progress",
    cases: ["progress"],
    check: progressLatest,
  },
  {
    id: "one-terminal",
    title: "exactly one terminal message per task, nothing after it",
    section: "#delivery-guarantees",
    check: oneTerminal,
  },
  {
    id: "retries-counted",
    title: "retries are counted by the broker and concluded at the delivery limit",
    section: "#retries-and-the-delivery-limit",
    cases: ["retries-counted"],
    check: retries,
  },
]

/** A rule over every message, not case by case. */
const everyMessage = (
  id: string,
  title: string,
  readings: ReadonlyArray<Reading>,
  problem: (r: Reading) => string | undefined,
): RuleResult => {
  for (const r of readings) {
    const found = problem(r)
    if (found !== undefined) {
      return {
        id,
        title,
        section: "#output-messages",
        verdict: "fail",
        detail: `${show(r)}: ${found}`,
      }
    }
  }
  return { id, title, section: "#output-messages", verdict: "pass" }
}

const drained = (observed: Observed): RuleResult => {
  const base = {
    id: "queue-drained",
    title: "nothing is left on the input queue, ready or unacked",
    section: "#the-life-of-a-delivery",
  }
  if (observed.ready > 0) {
    return {
      ...base,
      verdict: "fail",
      detail: `${observed.ready} messages still ready on the input queue`,
    }
  }
  if (typeof observed.unacked !== "number") {
    return { ...base, verdict: "not observable", detail: `0 ready; ${observed.unacked.unobserved}` }
  }
  return observed.unacked === 0
    ? { ...base, verdict: "pass" }
    : { ...base, verdict: "fail", detail: `${observed.unacked} deliveries left unacked` }
}

/** Every rule's verdict on what the kit observed of `cases`. */
export const judge = (
  cases: ReadonlyArray<Case>,
  observed: Observed,
  terms: Terms,
): ReadonlyArray<RuleResult> => {
  const byTask = new Map<string, Array<Reading>>(cases.map((c) => [c.taskId, []]))
  const strangers: Array<Reading> = []
  for (const r of observed.readings) {
    const list = r.taskId === undefined ? undefined : byTask.get(r.taskId)
    // A message the kit cannot read is bytes-exact's to report, not a stranger.
    if (list === undefined && r.taskId !== undefined) strangers.push(r)
    else list?.push(r)
  }
  const results = rulesOf(terms).map((rule): RuleResult => {
    const base = { id: rule.id, title: rule.title, section: rule.section }
    for (const c of cases) {
      if (rule.cases !== undefined && !rule.cases.includes(c.rule)) continue
      const problem = rule.check(byTask.get(c.taskId)!, c)
      if (problem !== undefined) return { ...base, verdict: "fail", detail: problem }
    }
    if (rule.id === "poison-silent" && strangers.length > 0) {
      return {
        ...base,
        verdict: "fail",
        detail: `a message for no task of the battery: ${show(strangers[0]!)}`,
      }
    }
    return { ...base, verdict: "pass" }
  })
  return [
    ...results,
    everyMessage(
      "bytes-exact",
      "every message is compact JSON, keys in the protocol's order",
      observed.readings,
      (r) => r.malformed,
    ),
    everyMessage(
      "properties",
      "every message is persistent, application/json, typed by its message_type",
      observed.readings,
      (r) => {
        const p = r.received.properties
        if (p.deliveryMode !== 2) return `delivery mode ${p.deliveryMode}, not 2 (persistent)`
        if (p.contentType !== "application/json") return `content type ${p.contentType}`
        if (p.type !== r.type) return `type ${p.type}, where its message_type is ${r.type}`
        return undefined
      },
    ),
    drained(observed),
  ]
}
