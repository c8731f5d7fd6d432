/**
 * The embedded broker the benches run the engine on, with its transport, keeping no log of what
 * is published (a bench publishes too much to keep). A new layer at each call: a layer is
 * memoized by its value, and each run wants a broker of its own.
 */
import { Layer } from "effect"
import { MemoryBroker } from "../src/index.ts"

export const memoryBroker = () =>
  MemoryBroker.layerTransport().pipe(
    Layer.provideMerge(MemoryBroker.layer({ retainPublished: false })),
  )
