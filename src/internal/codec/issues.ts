/**
 * Schema issues as `path: problem` lines that never quote the offending values, since inputs
 * and outputs may hold personal data.
 */
import { type ParseResult, SchemaAST } from "effect"

const describe = (ast: SchemaAST.AST): string => {
  const title = SchemaAST.getTitleAnnotation(ast)
  if (title._tag === "Some") return title.value
  const description = SchemaAST.getDescriptionAnnotation(ast)
  if (description._tag === "Some") return description.value
  return String(ast)
}

const pathText = (path: ReadonlyArray<PropertyKey>): string =>
  path.length === 0
    ? "(root)"
    : path.map((k) => (typeof k === "number" ? `[${k}]` : String(k))).join(".")

const walk = (
  issue: ParseResult.ParseIssue,
  path: ReadonlyArray<PropertyKey>,
  out: Array<string>,
): void => {
  switch (issue._tag) {
    case "Type":
      out.push(`${pathText(path)}: expected ${describe(issue.ast)}`)
      return
    case "Missing":
      out.push(`${pathText(path)}: is missing`)
      return
    case "Unexpected":
      out.push(`${pathText(path)}: is unexpected`)
      return
    case "Forbidden":
      out.push(`${pathText(path)}: cannot be checked here`)
      return
    case "Pointer":
      walk(issue.issue, [...path, ...(Array.isArray(issue.path) ? issue.path : [issue.path])], out)
      return
    case "Refinement":
      if (issue.kind === "From") walk(issue.issue, path, out)
      else out.push(`${pathText(path)}: must satisfy ${describe(issue.ast)}`)
      return
    case "Transformation":
      walk(issue.issue, path, out)
      return
    case "Composite": {
      const issues = Array.isArray(issue.issues) ? issue.issues : [issue.issues]
      for (const i of issues) walk(i as ParseResult.ParseIssue, path, out)
      return
    }
  }
}

/** One line per problem, at most `limit` of them. */
export const formatIssues = (error: ParseResult.ParseError, limit = 20): string => {
  const out: Array<string> = []
  walk(error.issue, [], out)
  const shown = out.slice(0, limit).join("; ")
  return out.length > limit ? `${shown}; and ${out.length - limit} more` : shown
}
