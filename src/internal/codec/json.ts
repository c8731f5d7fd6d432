/**
 * JSON helpers shared by the codec: a depth guard that runs before `JSON.parse`, and a check
 * that a value is plain JSON data (finite numbers, plain objects and arrays only).
 */

const OPEN_BRACE = 0x7b
const OPEN_BRACKET = 0x5b
const CLOSE_BRACE = 0x7d
const CLOSE_BRACKET = 0x5d
const QUOTE = 0x22
const BACKSLASH = 0x5c

/**
 * Whether the JSON text nests deeper than `limit`. Scans once, skipping string contents, so a
 * hostile document is refused before `JSON.parse` builds it.
 */
export const nestsDeeperThan = (text: string, limit: number): boolean => {
  let depth = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === BACKSLASH) i++
      else if (c === QUOTE) inString = false
    } else if (c === QUOTE) {
      inString = true
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > limit) return true
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      depth--
    }
  }
  return false
}

/** A plain object: `{}` or `Object.create(null)`, never an array, class instance or null. */
export const isPlainObject = (value: unknown): value is Record<string, unknown> => {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false
  const proto = Object.getPrototypeOf(value)
  return proto === Object.prototype || proto === null
}

/**
 * The first place where `value` is not JSON data, as a path (`$.a[2].b`) and what is wrong
 * there, or `undefined` when it is JSON data. Object keys whose value is `undefined` are allowed
 * (JSON.stringify omits them), as an output schema may leave optional keys so.
 */
export const findNonJson = (
  value: unknown,
  path = "$",
  ancestors: Set<object> = new Set(),
): string | undefined => {
  switch (typeof value) {
    case "string":
    case "boolean":
      return undefined
    case "number":
      return Number.isFinite(value) ? undefined : `${path} is a non-finite number`
    case "object": {
      if (value === null) return undefined
      // A cycle has no JSON text (and would recurse forever); a value shared twice is fine.
      if (ancestors.has(value)) return `${path} is a circular reference`
      ancestors.add(value)
      const found = findNonJsonIn(value, path, ancestors)
      ancestors.delete(value)
      return found
    }
    default:
      return `${path} is a ${typeof value}`
  }
}

const findNonJsonIn = (value: object, path: string, ancestors: Set<object>): string | undefined => {
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const item = value[i]
      if (item === undefined) return `${path}[${i}] is undefined`
      const found = findNonJson(item, `${path}[${i}]`, ancestors)
      if (found !== undefined) return found
    }
    return undefined
  }
  if (!isPlainObject(value)) return `${path} is not a plain object`
  for (const key of Object.keys(value)) {
    const item = value[key]
    if (item === undefined) continue
    const found = findNonJson(item, `${path}.${key}`, ancestors)
    if (found !== undefined) return found
  }
  return undefined
}
