/**
 * What a transport has received and the engine has not taken yet: offered from the broker's
 * callbacks, taken by the engine's fibers, closed once. Effect's `Queue` does this too, but its end
 * is an error (`Cause.Done`) that the transport would map to `None` around every take, and a
 * waiting take is woken to take again. Here an offer hands its item to the taker waiting longest,
 * and a waiting take is one `Effect.callback`, whose canceler (its one interruption handler)
 * forgets the taker.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"

const NONE = Effect.succeed(Option.none())

/** A take that waits: given the next item, or the end. */
type Taker<A, E> = (item: A | undefined, end?: Effect.Effect<Option.Option<never>, E>) => void

export class Inbox<A, E> {
  private items: Array<A | undefined> = []
  private head = 0
  private readonly takers = new Set<Taker<A, E>>()
  private end: Effect.Effect<Option.Option<never>, E> | undefined

  /** Hands `item` to the taker waiting longest, or keeps it; `false` once closed. */
  offer(item: A): boolean {
    if (this.end !== undefined) return false
    for (const taker of this.takers) {
      this.takers.delete(taker)
      taker(item)
      return true
    }
    this.items.push(item)
    return true
  }

  /**
   * The next item as `f` makes it, waiting for one; once closed, `None` or the error it was
   * closed with. A transport that hands out something made of each item makes it here, rather
   * than in one more step per item.
   */
  takeMap<B>(f: (item: A) => B): Effect.Effect<Option.Option<B>, E> {
    return Effect.suspend(() => {
      if (this.end !== undefined) return this.end
      if (this.head < this.items.length) return Effect.succeed(Option.some(f(this.shift())))
      return Effect.callback<Option.Option<B>, E>((resume) => {
        const taker: Taker<A, E> = (item, end) =>
          resume(end ?? Effect.succeed(Option.some(f(item as A))))
        this.takers.add(taker)
        return Effect.sync(() => void this.takers.delete(taker))
      })
    })
  }

  /** The next item, waiting for one; once closed, `None` or the error it was closed with. */
  readonly take: Effect.Effect<Option.Option<A>, E> = this.takeMap((item) => item)

  /** Every item not taken, removed. */
  takeAll(): Array<A> {
    const all = this.items.slice(this.head) as Array<A>
    this.items = []
    this.head = 0
    return all
  }

  /**
   * Closes the inbox: waiting and later takes end with `None`, or fail with `error`. Items not
   * taken are dropped (a transport gives them back before, or its broker does).
   */
  close(error?: E): void {
    if (this.end !== undefined) return
    this.end = error === undefined ? NONE : Effect.fail(error)
    this.items = []
    this.head = 0
    const takers = [...this.takers]
    this.takers.clear()
    for (const taker of takers) taker(undefined, this.end)
  }

  get isClosed(): boolean {
    return this.end !== undefined
  }

  private shift(): A {
    const item = this.items[this.head] as A
    this.items[this.head++] = undefined
    if (this.head === this.items.length) {
      this.items = []
      this.head = 0
    }
    return item
  }
}
