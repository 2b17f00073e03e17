/**
 * The SQLite drivers' prepared statements, kept per SQL text and bounded:
 * an application that inlines values into its SQL makes a new text per
 * call, and a cache that kept them all grew for the connection's life
 * (100,000 such statements held 202 MB, and WASM memory never shrinks).
 *
 * @module
 */

/**
 * How many prepared statements a SQLite driver keeps per connection. The
 * outbox's own statements are a few dozen fixed texts, so they stay cached
 * beside an application's; past this, the least recently used go.
 */
export const STATEMENT_CACHE_SIZE = 256;

/**
 * A least-recently-used cache of prepared statements by SQL text, as the
 * SQLite drivers keep them. A statement leaves it when more than `capacity`
 * are cached and it is the least recently used, and on
 * {@linkcode StatementCache.clear}; either way `finalize` is called on it
 * once, unless it is in use ({@linkcode StatementCache.enter}): that one is
 * finalized when it is left.
 *
 * Recency is kept the CLOCK way ("second chance"), which costs a hit one
 * flag rather than a move: a `Map` keeps its keys in insertion order, a hit
 * marks its entry used, and eviction walks from the oldest entry, moving a
 * used one to the end with its mark cleared and evicting the first unused
 * one.
 *
 * @ignore
 * @typeParam S The driver's statement.
 */
export class StatementCache<S> {
  readonly #statements = new Map<string, Entry<S>>();
  readonly #capacity: number;
  readonly #finalize: (statement: S) => void;
  /** Statements being run now, innermost last (a run can nest in another's step, through an application's SQL function). */
  readonly #running: S[] = [];
  /** Statements that left the cache while in use, finalized when left. */
  readonly #retired = new Set<S>();
  #finalized = 0;

  /**
   * @param finalize Releases a statement that left the cache (the WASM
   * driver's `sqlite3_finalize`; nothing for `node:sqlite`, whose
   * statements are finalized when they are garbage-collected).
   * @param capacity How many statements to keep, at least 1.
   * @default {capacity} {@linkcode STATEMENT_CACHE_SIZE}
   * @throws {RangeError} When `capacity` is not a positive integer.
   */
  constructor(
    finalize: (statement: S) => void,
    capacity: number = STATEMENT_CACHE_SIZE,
  ) {
    if (!Number.isInteger(capacity) || capacity < 1) {
      throw new RangeError(
        `Cannot create a statement cache as 'capacity' must be a positive integer: current value is ${capacity}`,
      );
    }
    this.#capacity = capacity;
    this.#finalize = finalize;
  }

  /** How many statements are cached. */
  get size(): number {
    return this.#statements.size;
  }

  /** How many statements were finalized since the cache was made. */
  get finalized(): number {
    return this.#finalized;
  }

  /**
   * The statement cached for `sql`, now marked used; `undefined` when there
   * is none, or when it is in use ({@linkcode StatementCache.enter}): a run
   * of the same text inside its step (an application's SQL function) needs
   * a statement of its own, since binding or resetting the running one would
   * restart the outer run. The driver prepares one and
   * {@linkcode StatementCache.add}s it in place of the running one, which is
   * finalized when it is left.
   */
  get(sql: string): S | undefined {
    const entry = this.#statements.get(sql);
    if (entry === undefined || this.#running.includes(entry.statement)) {
      return undefined;
    }
    entry.used = true;
    return entry.statement;
  }

  /**
   * Caches `statement` for `sql` as the most recently used, and finalizes
   * the least recently used ones past the capacity.
   */
  add(sql: string, statement: S): void {
    const statements = this.#statements;
    const previous = statements.get(sql);
    statements.delete(sql);
    if (previous !== undefined) this.#release(previous.statement);
    while (statements.size >= this.#capacity) {
      // Each pass clears a mark or evicts, so this ends within two rounds.
      for (const [text, entry] of statements) {
        statements.delete(text);
        if (entry.used) {
          entry.used = false;
          statements.set(text, entry);
        } else {
          this.#release(entry.statement);
          break;
        }
      }
    }
    statements.set(sql, { statement, used: false });
  }

  /**
   * Marks a statement in use: it is not finalized until it is left. Uses
   * nest: leave them in the reverse order.
   */
  enter(statement: S): void {
    this.#running.push(statement);
  }

  /** Ends the innermost use, begun with {@linkcode StatementCache.enter}. */
  leave(): void {
    const statement = this.#running.pop();
    if (
      this.#retired.size > 0 && this.#retired.has(statement!) &&
      !this.#running.includes(statement!)
    ) {
      this.#retired.delete(statement!);
      this.#release(statement!);
    }
  }

  /** Finalizes every cached statement (those in use when they are left). */
  clear(): void {
    const entries = [...this.#statements.values()];
    this.#statements.clear();
    for (const { statement } of entries) this.#release(statement);
  }

  #release(statement: S): void {
    if (this.#running.includes(statement)) {
      this.#retired.add(statement);
      return;
    }
    this.#finalized++;
    this.#finalize(statement);
  }
}

interface Entry<S> {
  readonly statement: S;
  /** Whether it was used since eviction last passed it. */
  used: boolean;
}
