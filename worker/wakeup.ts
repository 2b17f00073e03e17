/**
 * The processing loop's waits: for a delay, or until woken (an enqueue, a
 * freed slot, a stop), whichever comes first. A wake that finds no wait is
 * kept, so the next wait returns at once: a wake between two waits is not
 * lost.
 *
 * @module
 */
import { clearLongTimeout, type LongTimer, setLongTimeout } from "./options.ts";
import type { Timers } from "./types.ts";

/** One loop's wait and its wakes. */
export class Wakeup {
  readonly #timers: Timers;
  readonly #stopping: () => boolean;
  /** A wake that found no wait: the next wait returns at once. */
  #woken = false;
  #waiter: (() => void) | undefined;

  /**
   * @param timers The loop's timers (injected in tests).
   * @param stopping Whether the loop is stopping: a wait then returns at once.
   */
  constructor(
    timers: Timers,
    stopping: () => boolean,
  ) {
    this.#timers = timers;
    this.#stopping = stopping;
  }

  /** Whether a wake came with no wait since the last call, forgetting it. */
  take(): boolean {
    const woken = this.#woken;
    this.#woken = false;
    return woken;
  }

  /**
   * Waits for `delayMs` (forever when `undefined`) or until woken; true when
   * a wake ended it (or one was kept, or the loop is stopping).
   */
  wait(delayMs: number | undefined): Promise<boolean> {
    if (this.#woken || this.#stopping()) {
      this.#woken = false;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      let timer: LongTimer | undefined;
      const end = (woken: boolean) => {
        clearLongTimeout(this.#timers, timer);
        this.#waiter = undefined;
        this.#woken = false;
        resolve(woken);
      };
      this.#waiter = () => end(true);
      if (delayMs !== undefined) {
        timer = setLongTimeout(this.#timers, () => end(false), delayMs);
      }
    });
  }

  /** Ends the current wait; a wake that finds no wait makes the next one return at once. */
  wake(): void {
    if (this.#waiter === undefined) this.#woken = true;
    else this.#waiter();
  }
}
