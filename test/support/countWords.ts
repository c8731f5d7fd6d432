/**
 * Test support: the count-words task that the unit tests run — its input and output, and the
 * count itself.
 */
import { Schema } from "effect"

export const Text = Schema.Struct({ text: Schema.String })
export type Text = typeof Text.Type

export const Words = Schema.Struct({ words: Schema.Number })
export type Words = typeof Words.Type

/** How many words `text` has: its runs of anything but white space. */
export const countWords = (text: string): number =>
  text.split(/\s+/).filter((w) => w.length > 0).length
