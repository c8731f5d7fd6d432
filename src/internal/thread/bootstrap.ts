/**
 * What a thread of a threaded handler runs: the handler's module imported once, then one task at
 * a time from the pool's messages, its context rebuilt on this side (`progress` and `logger` as
 * messages back, `signal` fired by the pool's `abort`), its end posted as `done` or `failed`.
 * Source text, run with `eval`: no file of the SDK's to find beside a bundle or under Deno.
 * A `FatalError` or `RetryableError` is known by its `_tag`, as the engine knows it, so that the
 * module may throw the SDK's classes or any object that says what it is.
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
  const name = e !== null && typeof e === "object" && typeof e.name === "string" ? e.name : typeof e
  const message = e !== null && typeof e === "object" ? String(e.message) : String(e)
  const stack = e !== null && typeof e === "object" && typeof e.stack === "string" ? e.stack : undefined
  return { _tag: "Error", name, message, stack }
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
