/**
 * The outbox's write path: every call's transaction goes through the
 * connection's {@linkcode TransactionRunner} here, with the lease clock read
 * under the write lock, the closed and nesting checks first, and the
 * dialect's one-statement form tried outside a transaction.
 *
 * @module
 */
import type { Driver } from "../driver.ts";
import type { Dialect } from "../types.ts";
import { describe } from "../validate.ts";
import type { WriteOptions } from "./context.ts";
import type { Clock } from "./shapes.ts";
import {
  insideTransactionBody,
  type TransactionRunner,
} from "./transaction.ts";

const MAX_DATE_MS = 8_640_000_000_000_000;

/** One outbox's way into its connection's transactions. */
export class WritePath {
  readonly #runner: TransactionRunner;
  readonly #driver: Driver;
  readonly #sql: Dialect;
  readonly #now: Clock | "database";
  readonly #closed: () => boolean;
  readonly #start: (op: string, expire: boolean) => Promise<number>;

  /**
   * @param start Reads the lease clock at the start of a transaction and,
   * with `expire`, makes lapsed last-attempt leases dead letters (the lease
   * rules' expiry).
   */
  constructor(
    runner: TransactionRunner,
    sql: Dialect,
    now: Clock | "database",
    closed: () => boolean,
    start: (op: string, expire: boolean) => Promise<number>,
  ) {
    this.#runner = runner;
    this.#driver = runner.driver;
    this.#sql = sql;
    this.#now = now;
    this.#closed = closed;
    this.#start = start;
  }

  /**
   * Runs `fn` in a `BEGIN IMMEDIATE` transaction under the connection's
   * mutex, retrying `SQLITE_BUSY` after the driver's `busyWait` (or with
   * jittered exponential backoff when it has none) until `busyTimeoutMs`
   * (measured by `performance.now()`, a monotonic clock that
   * the injected lease clock must not stretch). `fn` sees the lease clock
   * read once the write lock is held, after lapsed last-attempt leases became
   * dead letters (`expire`, off only while the schema may not exist yet).
   *
   * Through the connection's {@linkcode TransactionRunner}: while the
   * application has a transaction open on the connection, a `join` call
   * (one made inside {@linkcode Outbox.within}) runs `fn` inside it under a
   * savepoint (`joined` is then `true`), and any other call waits, outside
   * the mutex, until the application's transaction ends: a claim or renewal
   * committed or rolled back with the application's writes would leave a
   * worker holding a lease the database never kept. A transaction the engine
   * ended or failed commits nothing (`TransactionEndedError`).
   *
   * Outside a transaction, `inOne` (the dialect's one-statement form of
   * the call, given the injected clock's `now` or null for the server's)
   * runs instead of `fn` and its transaction, unless it resolves to
   * `undefined`: it refused, having changed nothing `fn` must see undone.
   *
   * A transaction the server rolled back for contention alone (the
   * dialect's `rerun` codes: a deadlock's victim) runs again, with `fn`,
   * until `busyTimeoutMs`, unless `rerun` is false (`fn` runs the
   * application's code, which may have done more than SQL).
   */
  async write<T>(
    op: string,
    fn: (now: number, joined: boolean) => Promise<T>,
    {
      expire = true,
      join = false,
      inOne,
      rerun = true,
      refused,
    }: WriteOptions<T> = {},
  ): Promise<T> {
    this.checkOpen(op);
    this.notNested(op);
    const now = inOne && (() =>
      inOne(
        this.localNow(op),
      ));
    return await this.#runner.run(
      op,
      async (joined) => await fn(await this.#start(op, expire), joined),
      { join, inOne: now, rerun, refused },
    );
  }

  /** Throws when the outbox is closed. */
  checkOpen(op: string): void {
    if (this.#closed()) {
      throw new Error(`Cannot ${op} as the outbox is closed`);
    }
  }

  /**
   * Throws when called from inside `transaction(fn)` of an outbox, or
   * `accept(fn)` of an inbox, on the same connection: the call would wait
   * for the mutex that the transaction holds while it waits for the call.
   * The message names the transaction open there.
   */
  notNested(op: string): void {
    const body = insideTransactionBody(this.#runner.mutex);
    if (body === "transaction") {
      throw new Error(
        `Cannot ${op} on the outbox inside its own transaction(fn): use the transaction's handle (tx.enqueue, tx.acknowledge, tx.run), or the call would wait for the transaction that waits for it`,
      );
    }
    if (body === "accept") {
      throw new Error(
        `Cannot ${op} on the outbox inside an inbox's accept(fn) on the same connection: the acceptance's transaction is open there, and its handle runs SQL only (tx.run, tx.query); make the call after accept() returns, or it would wait for the transaction that waits for it`,
      );
    }
  }

  /** Reads the lease clock (the server's, when it is `"database"`). */
  async clock(op: string): Promise<number> {
    if (this.#now === "database") {
      const [row] = await this.#driver.query(this.#sql.now!);
      return this.checkNow(op, row?.["now"]);
    }
    return this.checkNow(op, this.#now());
  }

  /** The injected clock's reading, or `null` for the database's clock. */
  localNow(op: string): number | null {
    return this.#now === "database" ? null : this.checkNow(op, this.#now());
  }

  /** Checks a clock reading, throwing a `RangeError` naming `op`. */
  checkNow(op: string, now: unknown): number {
    // Date's own range keeps now + MAX_DURATION_MS an exact integer.
    if (
      typeof now !== "number" || !Number.isSafeInteger(now) || now < 0 ||
      now > MAX_DATE_MS
    ) {
      throw new RangeError(
        `Cannot ${op} as the clock must return a non-negative integer of milliseconds within Date's range: current value is ${
          describe(now)
        }`,
      );
    }
    return now;
  }
}
