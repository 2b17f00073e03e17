/**
 * What an opened outbox lends the modules that do its work (the admin
 * calls, group commit, the `tx` handle, maintenance, schema set-up): its
 * connection, dialect and settings, and its write path. `lease.ts` builds
 * one per `Outbox`; the modules take it instead of reaching into the class.
 *
 * @module
 */
import type { Driver } from "../driver.ts";
import type { Dialect } from "../types.ts";
import type { Ledger } from "./ledger.ts";
import type { Mutex, TransactionRunner } from "./transaction.ts";

/** How one call goes through the outbox's write path (`Outbox.#write`). */
export interface WriteOptions<T> {
  /** Make lapsed last-attempt leases dead letters first. @default {true} */
  readonly expire?: boolean;
  /** Join the application's transaction when called inside `within()`. */
  readonly join?: boolean;
  /**
   * The dialect's one-statement form of the call (given the injected
   * clock's `now`, or null for the server's); `undefined` from it means it
   * refused, having changed nothing, and the transaction runs instead.
   */
  readonly inOne?:
    | ((now: number | null) => Promise<T | undefined>)
    | undefined;
  /** Run again after a contention rollback. @default {true} */
  readonly rerun?: boolean;
  /**
   * What runs when a constraint refused the transaction as a whole: the
   * COMMIT (a deferred one), or a statement that rolled it back (SQLite's
   * `RAISE(ROLLBACK)`).
   */
  readonly refused?: (() => Promise<T>) | undefined;
}

/** An opened outbox's connection, settings and write path. */
export interface OutboxCore {
  readonly driver: Driver;
  readonly sql: Dialect;
  readonly mutex: Mutex;
  readonly runner: TransactionRunner;
  readonly ledger: Ledger;
  /** The queue of calls that name none. */
  readonly queue: string;
  /** Attempts of an event enqueued without `maxAttempts`. */
  readonly maxAttempts: number;
  /** The largest payload accepted and handed out, in bytes. */
  readonly maxPayloadBytes: number;
  /** Whether the outbox was closed. */
  isClosed(): boolean;
  /**
   * Runs `fn` in a transaction of the outbox's write path, given the lease
   * clock read under the write lock and whether it joined the
   * application's transaction.
   */
  write<T>(
    op: string,
    fn: (now: number, joined: boolean) => Promise<T>,
    options?: WriteOptions<T>,
  ): Promise<T>;
  /**
   * Reads the lease clock at the start of a transaction and, with
   * `expire`, makes lapsed last-attempt leases dead letters.
   */
  start(op: string, expire: boolean): Promise<number>;
  /** Checks a clock reading, throwing a `RangeError` naming `op`. */
  checkNow(op: string, now: unknown): number;
  /**
   * The injected lease clock's reading, read without SQL, or `null` when
   * the lease clock is the database server's.
   */
  localNow(op: string): number | null;
  /** Tells the enqueue listeners that events were committed. */
  enqueued(): void;
}
