/**
 * Schema issues as `path: problem` lines that never quote the offending values, since inputs
 * and outputs may hold personal data.
 */
import type * as Schema from "effect/Schema"
import * as SchemaAST from "effect/SchemaAST"
import * as SchemaIssue from "effect/SchemaIssue"

/**
 * What a schema expects: its title or description, else Effect's own wording without the
 * leading "Expected" (`string`, `"en" | "fr"`, `object`). A value is quoted only when the
 * parser reports its input, which ours never asks for.
 */
const expected = (ast: SchemaAST.AST): string => {
  const named = SchemaAST.resolveTitle(ast) ?? SchemaAST.resolveDescription(ast)
  if (named !== undefined) return `expected ${named}`
  const text = SchemaIssue.defaultLeafHook(new SchemaIssue.InvalidType(ast))
  // Without the prefix, the text is the schema's own `message` annotation: shown as it is.
  return text.startsWith("Expected ") ? `expected ${text.slice("Expected ".length)}` : text
}

/**
 * What a failed check asks for: a check its author named must be satisfied; Effect's own
 * checks say what they expect (`expected an integer`). A check's message is never shown, as a
 * check may build it from the value.
 */
const checked = (filter: SchemaAST.Filter<unknown>): string => {
  const annotations = filter.annotations
  const named = annotations?.title ?? annotations?.description
  if (named !== undefined) return `must satisfy ${named}`
  return annotations?.expected === undefined
    ? "must satisfy a check"
    : `expected ${annotations.expected}`
}

const pathText = (path: ReadonlyArray<PropertyKey>): string =>
  path.length === 0
    ? "(root)"
    : path.map((k) => (typeof k === "number" ? `[${k}]` : String(k))).join(".")

// `problem`, when given, is a failed check's, and replaces what the issues under it say.
const walk = (
  issue: SchemaIssue.Issue,
  path: ReadonlyArray<PropertyKey>,
  out: Array<string>,
  problem?: string,
): void => {
  const line = (text: string) => void out.push(`${pathText(path)}: ${problem ?? text}`)
  switch (issue._tag) {
    case "InvalidType":
      return line(expected(issue.ast))
    case "InvalidValue": {
      // A value's own message may quote it: only what the schema declares it expects.
      const wanted = issue.annotations?.expected
      return line(typeof wanted === "string" ? `expected ${wanted}` : "is invalid")
    }
    case "MissingKey":
      return line("is missing")
    case "UnexpectedKey":
      return line("is unexpected")
    case "Forbidden":
      return line("cannot be checked here")
    case "OneOf":
      return line("matches more than one member of its union")
    case "Filter":
      return walk(issue.issue, path, out, problem ?? checked(issue.filter))
    case "Encoding":
      return walk(issue.issue, path, out, problem)
    case "Pointer":
      return walk(issue.issue, [...path, ...issue.path], out, problem)
    case "AnyOf":
      // No member came close: the union as a whole was expected.
      if (issue.issues.length === 0) return line(expected(issue.ast))
      for (const i of issue.issues) walk(i, path, out, problem)
      return
    case "Composite":
      for (const i of issue.issues) walk(i, path, out, problem)
      return
  }
}

/** One line per problem, at most `limit` of them. */
export const formatIssues = (error: Schema.SchemaError, limit = 20): string => {
  const out: Array<string> = []
  walk(error.issue, [], out)
  const shown = out.slice(0, limit).join("; ")
  return out.length > limit ? `${shown}; and ${out.length - limit} more` : shown
}
