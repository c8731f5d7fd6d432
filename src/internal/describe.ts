/**
 * How the SDK says what an unknown error is, in one place. Two ways, for two readers: its kind
 * (a tag, a class name), which may go anywhere (a probe's answer, a metric, a failure decision);
 * and its text (`Name: message`, or the message alone beside the kind), for the worker's own log
 * and its author. Neither throws, whatever the value (a Proxy whose every trap throws included).
 */

/** The error's kind: its `_tag`, else its class's name, else its `typeof`. Never its text. */
export const errorKind = (u: unknown): string => {
  try {
    if (typeof u !== "object" || u === null) return typeof u
    const tag = (u as { _tag?: unknown })._tag
    if (typeof tag === "string") return tag
    const name = (u as { constructor?: { name?: unknown } }).constructor?.name
    return typeof name === "string" && name !== "" ? name : "Object"
  } catch {
    return "unreadable value"
  }
}

/** The error as a person reads it: `Name: message` for an Error, a string as it is. */
export const errorText = (u: unknown): string => {
  try {
    if (u instanceof Error) return `${u.name}: ${u.message}`
    if (typeof u === "string") return u
    return `a non-Error value (${errorKind(u)})`
  } catch {
    return "an unreadable value"
  }
}

/**
 * The error's text beside its kind (a log line's `error_type`): an Error's message alone, as
 * the kind names it already (its stack keeps the name); anything else as {@link errorText}.
 */
export const errorTextBesideKind = (u: unknown): string => {
  try {
    if (u instanceof Error) return String(u.message)
  } catch {
    return "an unreadable value"
  }
  return errorText(u)
}

/** The error's message (an Error's), or the value as a string. */
export const errorMessage = (u: unknown): string => {
  try {
    return u instanceof Error ? u.message : String(u)
  } catch {
    return "an unreadable value"
  }
}

/** The first line of the error's message, trimmed. */
export const firstLine = (u: unknown): string => errorMessage(u).split("\n")[0]!.trim()

/**
 * The error and its causes (`cause`, a few deep) on one line, for a person: each as its kind (a
 * tag, a class name) and its message, the kind alone when the message is empty (a `ServeError`
 * gives its reason only in `cause`).
 */
export const errorChain = (u: unknown): string => {
  const parts: Array<string> = []
  let current = u
  for (let depth = 0; depth < 5 && current !== undefined && current !== null; depth++) {
    const message = typeof current === "string" ? current : errorMessage(current).trim()
    const kind = typeof current === "object" ? errorKind(current) : undefined
    parts.push(kind === undefined ? message : message === "" ? kind : `${kind}: ${message}`)
    current = typeof current === "object" ? (current as { cause?: unknown }).cause : undefined
  }
  return oneLine(parts.join(": "))
}

/** Text on one line: each line break and the indentation after it, one space. */
export const oneLine = (text: string): string => text.replace(/\s*\n\s*/g, " ").trim()
