/**
 * The watch for other connections' enqueues that a driver keeps only while
 * a processing loop waits idle: on SQLite files (the Deno file driver
 * watches the database's files, and every commit of its own process then
 * costs a file-system event), as opposed to PostgreSQL's `LISTEN`, which
 * the outbox holds from opening (see `core/schema.ts`).
 *
 * @module
 */

/** Starts the driver's watch; resolves to what stops it, if it started. */
export type StartWatch = () => Promise<(() => Promise<void>) | undefined>;

/**
 * Counts the waits, starting the watch when the first begins and stopping
 * it when the last ends; starts and stops run one after another.
 */
export class IdleWatch {
  readonly #start: StartWatch;
  #waits = 0;
  #stop: (() => Promise<void>) | undefined;
  #turns: Promise<void> = Promise.resolve();
  #closed = false;

  constructor(start: StartWatch) {
    this.#start = start;
  }

  /**
   * Begins a wait.
   *
   * @returns Ends it (a second call does nothing).
   */
  begin(): () => void {
    if (++this.#waits === 1) this.#turn(() => this.#settle());
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      if (--this.#waits === 0) this.#turn(() => this.#settle());
    };
  }

  /** Resolves once the starts and stops asked for so far have run. */
  settled(): Promise<void> {
    return this.#turns;
  }

  /** Stops the watch for good, once the starts and stops before it ran. */
  close(): Promise<void> {
    this.#closed = true;
    this.#turn(() => this.#settle());
    return this.#turns;
  }

  /** Starts or stops the watch to match the waits now. */
  async #settle(): Promise<void> {
    const wanted = this.#waits > 0 && !this.#closed;
    if (wanted && this.#stop === undefined) {
      // A watch that cannot start leaves the loops to their polls.
      this.#stop = await this.#start().catch(() => undefined);
    } else if (!wanted && this.#stop !== undefined) {
      const stop = this.#stop;
      this.#stop = undefined;
      await stop().catch(() => {});
    }
  }

  #turn(fn: () => Promise<void>): void {
    this.#turns = this.#turns.then(fn);
  }
}
