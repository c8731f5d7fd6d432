/**
 * UTF-8 for the codec, through `node:buffer` (Deno has it too), as every delivery decodes one
 * message and encodes at least two: for a small message, `Buffer.from` encodes several times
 * faster than `TextEncoder.encode` on Node and Deno, and `isUtf8` then `toString` decodes faster
 * than a fatal `TextDecoder` (a cost `bench/engine.ts` sees; the figures are in
 * `bench/README.md`).
 */
import { Buffer, isUtf8 } from "node:buffer"

/** The text of `bytes`, or `undefined` when they are not UTF-8. A byte order mark is kept. */
export const decodeUtf8 = (bytes: Uint8Array): string | undefined =>
  isUtf8(bytes)
    ? Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("utf8")
    : undefined

/** The UTF-8 bytes of `text`, as a plain `Uint8Array` (a view, not a `Buffer`). */
export const encodeUtf8 = (text: string): Uint8Array => {
  const bytes = Buffer.from(text, "utf8")
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)
}

/**
 * The UTF-8 length of `text`: a UTF-16 code unit is at most 3 bytes of UTF-8, so a text short
 * enough for `maxBytes` at 3 bytes a unit is not measured (every result is checked on its way out).
 */
export const utf8Exceeds = (text: string, maxBytes: number): boolean =>
  text.length * 3 > maxBytes && Buffer.byteLength(text, "utf8") > maxBytes
