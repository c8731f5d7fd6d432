/**
 * The embedded broker of a local trial (`--memory`, `WORKER_TRANSPORT=memory`): tasks from
 * standard input, messages to standard output.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as MemoryBroker from "../../MemoryBroker.ts"
import { Process } from "../../Process.ts"
import * as Settings from "../../Settings.ts"
import { Transport } from "../../Transport.ts"

/**
 * The embedded broker for local trials: each line of standard input is a task (a whole
 * envelope, or just its `data.body`), each message published is printed on standard output,
 * and intake stops once input has ended and every task is settled.
 */
export const layerMemoryTrial: Layer.Layer<Transport, never, Settings.Settings | Process> = Layer
  .effect(
    Transport,
    Effect.gen(function* () {
      const broker = yield* MemoryBroker.make()
      const settings = yield* Settings.Settings
      const process = yield* Process
      const transport = yield* broker.transport({
        inQueue: settings.inQueue,
        outQueue: settings.outQueue,
        capacity: settings.concurrency,
        leaseDuration: settings.consumerTimeout,
      })
      let n = 0
      const toEnvelope = (line: string): string => {
        try {
          const parsed: unknown = JSON.parse(line)
          if (typeof parsed === "object" && parsed !== null && "task_id" in parsed) return line
        } catch {
          return line // not JSON: published as it is, to be refused as poison, as RabbitMQ would
        }
        n += 1
        return `{"task_id":"local-${n}","data":{"message_type":"submission","body":${line}}}`
      }
      const settled = Effect.zipWith(
        broker.ready(settings.inQueue),
        broker.unacked(settings.inQueue),
        (ready, unacked) => ready + unacked === 0,
      )
      yield* process.stdinLines.pipe(
        Stream.filter((line) => line.trim() !== ""),
        Stream.runForEach((line) => broker.publish(settings.inQueue, toEnvelope(line))),
        Effect.andThen(
          settled.pipe(Effect.repeat({ schedule: Schedule.spaced("20 millis"), until: (s) => s })),
        ),
        Effect.andThen(transport.stopIntake),
        Effect.forkScoped,
      )
      const decoder = new TextDecoder()
      return Transport.of({
        ...transport,
        publish: (body, type, options) =>
          Effect.tap(
            transport.publish(body, type, options),
            () => process.writeOut(decoder.decode(body)),
          ),
      })
    }),
  )
