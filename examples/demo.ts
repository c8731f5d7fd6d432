/**
 * The demo: three workers on the embedded broker, a handful of tasks, and what the platform
 * would see on the output queues — the raw JSON of each message — with the decision lines.
 *
 *   deno task demo      (or: npm run demo)
 */
import { Effect, Layer, Logger, References, Schedule } from "effect"
import { MemoryBroker, Settings, Worker } from "../src/index.ts"
import { worker as countWords } from "./count-words.ts"
import { worker as flakyUpstream } from "./flaky-upstream.ts"
import { worker as slowReport } from "./slow-report.ts"

const decoder = new TextDecoder()

const envelope = (taskId: string, body: unknown) =>
  JSON.stringify({ task_id: taskId, data: { message_type: "submission", body } })

/** Prints each log line as `  | [service task_id] message`, the way an operator would grep it. */
const demoLogger = Logger.make(({ fiber, message }) => {
  const annotations = fiber.getRef(References.CurrentLogAnnotations)
  const at = ["service", "task_id"].flatMap((k) => k in annotations ? [String(annotations[k])] : [])
  const text = Array.isArray(message) ? message.join(" ") : String(message)
  console.log(`  | [${at.join(" ")}] ${text}`)
})

const runWorker = <A, I, O>(worker: Worker.Worker<A, I, O, never>) =>
  Worker.serve(worker).pipe(
    Effect.provide(MemoryBroker.layerTransport()),
    Effect.provide(
      Settings.layer(
        { name: worker.name, timeout: worker.timeout },
        {
          retryBackoffBase: "50 millis",
          retryBackoffMax: "200 millis",
          progressMinInterval: "50 millis",
        },
      ),
    ),
    Effect.forkScoped,
  )

const terminalCount = (broker: MemoryBroker.MemoryBroker["Service"], queue: string) =>
  Effect.map(
    broker.published(queue),
    (messages) => messages.filter((m) => m.type === "success" || m.type === "failure").length,
  )

const program = Effect.gen(function* () {
  const broker = yield* MemoryBroker.MemoryBroker
  yield* runWorker(countWords)
  yield* runWorker(flakyUpstream)
  yield* runWorker(slowReport)

  console.log("Submitting tasks to the embedded broker…")
  yield* broker.publish("count-words_queue_in", envelope("t-success", { text: "hello big world" }))
  yield* broker.publish("count-words_queue_in", envelope("t-fatal", { text: "   " }))
  yield* broker.publish("count-words_queue_in", envelope("t-invalid-input", { text: 42 }))
  yield* broker.publish("count-words_queue_in", "this is not JSON")
  yield* broker.publish(
    "flaky-upstream_queue_in",
    envelope("t-retried", { url: "https://example.test" }),
  )
  yield* broker.publish("slow-report_queue_in", envelope("t-timeout", { pages: 10 }))

  const expected: ReadonlyArray<readonly [string, number]> = [
    ["count-words_queue_out", 3],
    ["flaky-upstream_queue_out", 1],
    ["slow-report_queue_out", 1],
  ]
  yield* Effect.forEach(expected, ([queue, count]) =>
    terminalCount(broker, queue).pipe(
      Effect.repeat({ schedule: Schedule.spaced("20 millis"), until: (n) => n >= count }),
      Effect.timeoutOrElse({
        duration: "10 seconds",
        orElse: () => Effect.fail(new Error(`${queue} did not settle`)),
      }),
    ))

  for (const [queue] of expected) {
    console.log(`\nOutput queue ${queue}:`)
    for (const message of yield* broker.published(queue)) {
      console.log(`  ${decoder.decode(message.body)}`)
    }
  }
  console.log("\nInput queues left:", {
    "count-words": yield* broker.ready("count-words_queue_in"),
    "flaky-upstream": yield* broker.ready("flaky-upstream_queue_in"),
    "slow-report": yield* broker.ready("slow-report_queue_in"),
  })
})

await Effect.runPromise(
  program.pipe(
    Effect.scoped,
    Effect.provide(
      Layer.merge(MemoryBroker.layer(), Logger.layer([demoLogger])),
    ),
  ),
)
