/**
 * The processing loop's leases claimed ahead of a free handler slot
 * (`prefetch`): held in claim order until a handler slot frees, and given
 * back unstarted, their attempts not counted, when their first renewal falls
 * due (they are never renewed) or the loop stops.
 *
 * @module
 */
import type { Lease } from "../lease.ts";
import {
  clearLongTimeout,
  type LongTimer,
  setLongTimeout,
  type Settings,
} from "./options.ts";

/** A lease claimed ahead, with when it was claimed by both clocks. */
export interface Ahead<P> {
  readonly lease: Lease<P>;
  readonly claimedAt: number;
  readonly claimedAtWall: number;
}

/** What the queue needs of the processor: a give-back as `release` does it. */
export type GiveBack<P> = (lease: Lease<P>) => Promise<void>;

/** Leases claimed ahead, oldest first. */
export class LeasesAhead<P> {
  readonly #o: Settings;
  readonly #giveBack: GiveBack<P>;
  readonly #held: (Ahead<P> & { timer: LongTimer | undefined })[] = [];
  readonly #givingBack = new Set<Promise<void>>();
  #claiming = true;

  /**
   * @param settings The loop's settings (clocks, timers, `renewIntervalMs`,
   * `prefetch`).
   * @param giveBack Gives a lease back unstarted, its attempt not counted;
   * never rejects.
   */
  constructor(settings: Settings, giveBack: GiveBack<P>) {
    this.#o = settings;
    this.#giveBack = giveBack;
  }

  /** Leases held. */
  get length(): number {
    return this.#held.length;
  }

  /**
   * How many leases the loop may hold ahead now: `prefetch`'s, but none
   * after one had to be given back at its renewal time, until a handler
   * finishes ({@linkcode LeasesAhead.handlerFinished}): handlers that slow
   * gain nothing from it.
   */
  get room(): number {
    return this.#claiming ? this.#o.prefetch : 0;
  }

  /** A handler finished: the loop claims ahead again. */
  handlerFinished(): void {
    this.#claiming = true;
  }

  /** Holds `ahead` until a slot frees, or gives it back at its renewal time. */
  hold(ahead: Ahead<P>): void {
    const o = this.#o;
    const held = { ...ahead, timer: undefined as LongTimer | undefined };
    held.timer = setLongTimeout(o.timers, () => {
      const at = this.#held.indexOf(held);
      if (at < 0) return;
      this.#held.splice(at, 1);
      this.#return(held);
    }, ahead.claimedAt + o.renewIntervalMs - o.monotonicNow());
    this.#held.push(held);
  }

  /**
   * The oldest lease held whose renewal is not due yet by either clock;
   * older ones (their renewal time passed while the event loop stalled)
   * are given back on the way.
   */
  next(): Ahead<P> | undefined {
    const o = this.#o;
    for (let held = this.#held.shift(); held; held = this.#held.shift()) {
      clearLongTimeout(o.timers, held.timer);
      if (
        o.monotonicNow() < held.claimedAt + o.renewIntervalMs &&
        o.now() < held.claimedAtWall + o.renewIntervalMs
      ) return held;
      this.#return(held);
    }
    return undefined;
  }

  /**
   * Gives every lease held back (the loop stops); with `closed`, drops them
   * instead, to lapse, the outbox being gone.
   */
  returnAll(closed: boolean): void {
    for (const held of this.#held.splice(0)) {
      clearLongTimeout(this.#o.timers, held.timer);
      if (!closed) this.#return(held);
    }
  }

  /** Settles when every give-back under way has. */
  async returned(): Promise<void> {
    await Promise.all(this.#givingBack);
  }

  #return(ahead: Ahead<P>): void {
    this.#claiming = false;
    const given = this.#giveBack(ahead.lease)
      .finally(() => this.#givingBack.delete(given));
    this.#givingBack.add(given);
  }
}
