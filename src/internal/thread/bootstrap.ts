/**
 * What a thread of a threaded handler runs: the handler's module imported once, then one task at
 * a time from the pool's messages, its context rebuilt on this side (`progress` and `logger` as
 * messages back, `signal` fired by the pool's `abort`), its end posted as `done` or `failed`.
 * Source text, run with `eval`: no file of the SDK's to find beside a bundle or under Deno.
 * A `FatalError` or `RetryableError` is known by its `_tag`, as the engine knows it, so that the
 * module may throw the SDK's classes or any object that says what it is; any other error is
 * described field by field for the worker's side to rebuild (`pool.ts`, `errorOf`).
 */
import { TASK_STORE_KEY } from "../taskStore.ts"

export const BOOTSTRAP = `
const { parentPort, workerData } = require("node:worker_threads")
const { AsyncLocalStorage } = require("node:async_hooks")
// The SDK's task store, as src/internal/taskStore.ts keeps it: TaskContext.logFields reads it.
const taskStore = (globalThis[Symbol.for("${TASK_STORE_KEY}")] ??= new AsyncLocalStorage())

const describe = (e) => {
  if (e !== null && typeof e === "object" && (e._tag === "FatalError" || e._tag === "RetryableError")) {
    // A Duration is a class of Effect's: it crosses as its milliseconds' text.
    const millis = e.delay !== null && typeof e.delay === "object" && typeof e.delay.toJSON === "function"
      ? e.delay.toJSON().millis
      : undefined
    const delay = typeof e.delay === "number" || typeof e.delay === "string"
      ? e.delay
      : typeof millis === "number" ? millis + " millis" : e.delay === undefined ? undefined : "invalid"
    return { _tag: e._tag, code: e.code, message: e.message, delay, congestion: e.congestion === true }
  }
  try {
    return { _tag: "Error", ...ordinary(e, 0) }
  } catch {
    return { _tag: "Error", name: "Error", message: "an unreadable error" }
  }
}

// Any other error crosses as what a definition's retryOn rules may read of it, as structured
// clone would keep none of an Error's own fields: its name, message and stack, its own fields of
// plain values (code, errno, status, …), its headers and its response's, its cause and errors.
const PLAIN = ["string", "number", "boolean"]
const DEPTH = 4

const plainFields = (o) => {
  const fields = {}
  for (const key of Object.keys(o)) {
    if (PLAIN.includes(typeof o[key])) fields[key] = o[key]
  }
  return fields
}

const headersOf = (h) => {
  if (h === null || typeof h !== "object") return undefined
  const entries = typeof h.entries === "function" && typeof h.get === "function" ? h.entries() : Object.entries(h)
  const headers = {}
  for (const [key, value] of entries) {
    if (PLAIN.includes(typeof value)) headers[key] = value
  }
  return headers
}

const ordinary = (e, depth) => {
  if (e === null || typeof e !== "object") return { name: typeof e, message: String(e), fields: {} }
  const crossed = {
    name: typeof e.name === "string" ? e.name : typeof e,
    message: String(e.message),
    stack: typeof e.stack === "string" ? e.stack : undefined,
    fields: plainFields(e),
    headers: headersOf(e.headers),
  }
  const response = e.response
  if (response !== null && typeof response === "object") {
    crossed.response = { status: response.status, statusCode: response.statusCode, headers: headersOf(response.headers) }
  }
  if (depth < DEPTH) {
    const cause = e.cause
    if (PLAIN.includes(typeof cause)) crossed.cause = cause
    else if (cause !== null && typeof cause === "object") crossed.cause = ordinary(cause, depth + 1)
    if (Array.isArray(e.errors)) crossed.errors = e.errors.slice(0, 8).map((x) => ordinary(x, depth + 1))
  }
  return crossed
}

const post = (event) => {
  try {
    parentPort.postMessage(event)
    return true
  } catch {
    return false
  }
}

let handler
const loading = import(workerData.module).then((module) => {
  handler = module[workerData.exportName]
  if (typeof handler !== "function") {
    throw new Error("it has no function named " + JSON.stringify(workerData.exportName))
  }
})
loading.then(
  () => post({ type: "ready" }),
  (e) => post({ type: "load_failed", message: describe(e).message }),
)

let controller
parentPort.on("message", async (message) => {
  if (message.type === "abort") return controller?.abort(new Error("The task must stop"))
  controller = new AbortController()
  const task = message.task
  const log = (level) => (line, fields) => {
    if (!post({ type: "log", task, level, message: String(line), fields })) {
      post({ type: "log", task, level, message: String(line) })
    }
  }
  const ctx = {
    ...message.context,
    signal: controller.signal,
    progress: (fraction, payload) => {
      if (!post({ type: "progress", task, fraction, payload })) {
        post({ type: "log", task, level: "warn", message: "A progress payload that cannot leave its thread was dropped" })
      }
      return Promise.resolve()
    },
    logger: { debug: log("debug"), info: log("info"), warn: log("warn"), error: log("error") },
  }
  try {
    await loading
    const output = await taskStore.run(message.fields, handler, message.input, ctx)
    if (!post({ type: "done", task, output })) {
      throw new Error("The handler's result cannot leave its thread (a function, a class instance's methods, a symbol)")
    }
  } catch (e) {
    post({ type: "failed", task, error: describe(e) })
  }
})
`
