/**
 * Manual time and an in-memory outbox for the processing loop's tests.
 */
import { type Driver, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../drivers/sqlite_wasm.ts";
import type { ProcessOptions, Timers } from "../worker.ts";
import { ManualClock } from "./helpers.ts";

/**
 * Manual time for the processor: the monotonic clock and the timers, driven
 * by hand. `advance` fires due timers in order, letting the promises they
 * start settle after each; `jump` moves time without firing anything, which
 * is what a stalled event loop or a suspended process looks like.
 */
export class ManualTimers implements Timers {
  ms = 0;
  readonly #timers = new Map<number, { at: number; callback: () => void }>();
  #nextId = 1;
  readonly monotonicNow = (): number => this.ms;

  setTimeout(callback: () => void, delayMs: number): unknown {
    const id = this.#nextId++;
    this.#timers.set(id, { at: this.ms + delayMs, callback });
    return id;
  }

  clearTimeout(handle: unknown): void {
    this.#timers.delete(handle as number);
  }

  /** Fires every timer due up to `ms` from now, in order, then settles. */
  async advance(ms: number, wall?: ManualClock): Promise<void> {
    const target = this.ms + ms;
    for (;;) {
      await settle();
      let next: [number, { at: number; callback: () => void }] | undefined;
      for (const entry of this.#timers) {
        if (entry[1].at <= target && (!next || entry[1].at < next[1].at)) {
          next = entry;
        }
      }
      if (next === undefined) break;
      const [id, { at, callback }] = next;
      this.#timers.delete(id);
      wall?.advance(Math.max(0, at - this.ms));
      this.ms = Math.max(this.ms, at);
      callback();
    }
    wall?.advance(target - this.ms);
    this.ms = target;
    await settle();
  }

  /** Moves time without firing timers, as a stalled event loop sees it. */
  jump(ms: number, wall?: ManualClock): void {
    this.ms += ms;
    wall?.advance(ms);
  }
}

/**
 * `time`, with the runtime's `setImmediate` as well (the default timers
 * have it): a write waits for the end of the event loop's turn while
 * handlers still run.
 */
export function withImmediate(time: ManualTimers): Timers {
  return {
    setTimeout: (callback, delayMs) => time.setTimeout(callback, delayMs),
    clearTimeout: (handle) => time.clearTimeout(handle),
    setImmediate: (callback) => void setImmediate(callback),
  };
}

/** Lets every pending promise chain run (one macrotask turn). */
export function settle(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

export interface Fixture {
  outbox: Outbox;
  wall: ManualClock;
  time: ManualTimers;
  errors: unknown[];
  options: (extra?: ProcessOptions) => ProcessOptions;
  [Symbol.asyncDispose](): Promise<void>;
}

export async function fixture(driver?: Driver): Promise<Fixture> {
  const wall = new ManualClock(1_000_000);
  const time = new ManualTimers();
  const errors: unknown[] = [];
  const outbox = await Outbox.open(
    driver ?? await openSqliteWasm(":memory:"),
    { now: wall.now, leaseMs: 1_000 },
  );
  return {
    outbox,
    wall,
    time,
    errors,
    options: (extra = {}) => ({
      leaseMs: 1_000,
      pollMinMs: 10,
      pollMaxMs: 10,
      backoffMinMs: 100,
      backoffJitter: 0,
      now: wall.now,
      monotonicNow: time.monotonicNow,
      timers: time,
      onError: (error) => errors.push(error),
      ...extra,
    }),
    [Symbol.asyncDispose]: () => outbox.close(),
  };
}
