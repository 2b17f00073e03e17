/**
 * The driver contract: one SQLite connection behind four async methods.
 *
 * The lease core sends every statement through a driver, `BEGIN IMMEDIATE`,
 * `COMMIT` and `ROLLBACK` included, and serializes transactions per driver
 * with an async mutex, so a driver never needs its own transaction logic
 * (the shape follows Kysely's and Drizzle's sqlite-proxy drivers).
 *
 * @module
 */

import { BusyError, UnsafeIntegerError } from "./errors.ts";
import type { Dialect, TransactionStatus } from "./types.ts";

/** A value SQLite stores or returns: `NULL`, `INTEGER`/`REAL`, `TEXT` or `BLOB`. */
export type SqlValue = null | number | bigint | string | Uint8Array;

/** One result row, keyed by column name. */
export type Row = Record<string, SqlValue>;

/** What a data-changing statement reports. */
export interface RunResult {
  /** Rows inserted, updated or deleted by the statement (`sqlite3_changes()`). */
  readonly changes: number;
  /** Rowid of the last insert on this connection (`sqlite3_last_insert_rowid()`). */
  readonly lastInsertRowid: number | bigint;
}

/**
 * One connection to one SQLite database.
 *
 * Drivers map engine errors to {@linkcode SqliteError} subclasses
 * (`SQLITE_BUSY` to {@linkcode BusyError}, constraint failures to
 * {@linkcode ConstraintError}) and must leave SQLite's own busy handler off:
 * the core retries busy statements itself, without blocking the event loop.
 * Integers outside ±2^53 must come back as `bigint`, never rounded.
 */
export interface Driver {
  /**
   * Runs one statement and returns its rows (empty when it returns none).
   * SQL holding a second statement is refused with a `RangeError` before
   * anything runs.
   */
  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]>;
  /**
   * Runs one statement and reports its changes; SQL holding a second
   * statement is refused with a `RangeError` before anything runs.
   */
  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult>;
  /** Runs a script of several statements without parameters. */
  exec(sql: string): Promise<void>;
  /**
   * Waits until the lock that made this connection's last statement fail
   * with `SQLITE_BUSY` may be free, or `timeoutMs` milliseconds at most; the
   * caller then tries again. Optional: without it the core sleeps with
   * jittered backoff, which on timers of about 2 ms leaves the lock idle
   * through most handoffs.
   */
  busyWait?(timeoutMs: number): Promise<void>;
  /**
   * How the core spells its statements for this connection's engine.
   * Optional: SQLite's when absent.
   */
  readonly dialect?: Dialect;
  /**
   * Calls `listener` after another connection commits new events, so an
   * idle worker claims at once instead of at its next poll (PostgreSQL's
   * `LISTEN`/`NOTIFY`; the Deno file driver's watch of the database's
   * files). The outbox keeps it from opening on PostgreSQL, and on SQLite
   * only while a processing loop waits idle (`Outbox.watchWhileIdle`),
   * since a file watch costs something on every commit of its own process.
   * Optional: without it workers only poll.
   *
   * @returns Stops the calls.
   */
  watchEnqueues?(listener: () => void): Promise<() => Promise<void>>;
  /**
   * Whether a transaction is open on this connection now
   * (`sqlite3_get_autocommit()` is 0): outside the outbox's own
   * transactions, one the application began on the handle it shares with
   * the outbox. `enqueue` and the fenced `acknowledge` made inside
   * `Outbox.within` then run inside it, and every other call waits for it
   * to end. Optional: without it the
   * outbox assumes the connection is its own.
   */
  inTransaction?(): boolean;
  /**
   * The engine's own word on this connection's transaction: `idle` (none
   * open: SQLite's `sqlite3_get_autocommit()` is 1, PostgreSQL's
   * ReadyForQuery status `I`), `open` (`T`), `failed` (PostgreSQL's
   * `E`: open, but it will only roll back), or `lost` (the connection was
   * lost inside it: the core reports `ConnectionLostError`, not
   * a failed statement, and rolls back). The core asks after a
   * statement inside its transaction fails, caught or not, and before each
   * later statement and the `COMMIT`: once the transaction has ended or
   * failed, nothing more of it runs. Optional: without it the core reads
   * {@linkcode Driver.inTransaction}, and without both it cannot tell.
   */
  transactionStatus?(): TransactionStatus;
  /** Closes the connection; later calls reject. Closing twice is a no-op. */
  close(): Promise<void>;
}

/**
 * Throws unless the first statement SQLite parsed out of `sql` leaves only
 * whitespace, semicolons and comments behind: `query()` and `run()` prepare
 * one statement, and SQLite would otherwise skip the rest without a word.
 * Drivers call it once per SQL text, when they prepare it, so nothing has
 * run when it throws.
 *
 * @ignore
 * @param method The driver method the SQL was passed to.
 * @param sql The SQL text as passed.
 * @param firstStatement Reads the prefix of `sql` that SQLite parsed as its
 * first statement (`sqlite3_sql()`); not called when `sql` holds none.
 * @throws {RangeError} When anything but whitespace, semicolons or comments
 * follows the first statement.
 */
export function assertOneStatement(
  method: "query" | "run",
  sql: string,
  firstStatement: () => string,
): void {
  // SQLite reads up to the first NUL. With no statement before it, the
  // prepared statement is null (node:sqlite's sourceSQL would crash on it)
  // and running it fails as empty SQL.
  const nul = sql.indexOf("\0");
  if (onlySeparators(nul < 0 ? sql : sql.slice(0, nul))) return;
  const first = firstStatement();
  const rest = sql.slice(first.length);
  if (onlySeparators(rest)) return;
  throw new RangeError(
    `Cannot ${method} as 'sql' must hold one statement: found more after ${
      JSON.stringify(clip(first.trim()))
    }: ${JSON.stringify(clip(rest.trim()))}`,
  );
}

/**
 * Reads an opener's `busyTimeoutMs` option: how long opening waits for
 * another connection's lock, in milliseconds.
 *
 * @ignore
 * @param value The option as passed.
 * @default {5000}
 * @returns The timeout.
 * @throws {TypeError} When it is not a non-negative safe integer.
 */
export function openBusyTimeoutMs(value: unknown): number {
  const ms = value ?? 5_000;
  if (typeof ms !== "number" || !Number.isSafeInteger(ms) || ms < 0) {
    throw new TypeError(
      `Cannot open database as 'busyTimeoutMs' must be a non-negative integer: current value is ${
        String(ms)
      }`,
    );
  }
  return ms;
}

/**
 * Runs `fn` until it does not fail with {@linkcode BusyError}, for at most
 * `busyTimeoutMs` (by `performance.now()`), calling `wait` with the time
 * left between tries: how an opener waits out another connection's lock.
 *
 * @ignore
 * @param busyTimeoutMs How long to keep trying, in milliseconds.
 * @param fn The work that may find the database locked.
 * @param wait Waits before the next try, at most the time it is given.
 * @returns What `fn` returned.
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function untilNotBusy<T>(
  busyTimeoutMs: number,
  fn: () => Promise<T>,
  wait: (remainingMs: number) => Promise<void>,
): Promise<T> {
  const deadline = performance.now() + busyTimeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (error) {
      const remainingMs = deadline - performance.now();
      if (!(error instanceof BusyError) || remainingMs <= 0) throw error;
      await wait(remainingMs);
    }
  }
}

/**
 * The first keywords of the statements that begin, end or roll back a
 * transaction. Through `tx.run` they would commit or roll back behind the
 * outbox's back (a handler's writes committed before its stale
 * acknowledgement threw).
 *
 * @ignore
 */
export const TRANSACTION_CONTROL: ReadonlySet<string> = new Set([
  "BEGIN",
  "COMMIT",
  "END",
  "ROLLBACK",
  "SAVEPOINT",
  "RELEASE",
  // PostgreSQL's: ABORT rolls back, START TRANSACTION begins.
  "ABORT",
  "START",
]);

/**
 * The transaction-control statement `sql` is, by its leading keywords: one
 * of {@linkcode TRANSACTION_CONTROL}, or PostgreSQL's `PREPARE TRANSACTION`
 * (which ends the transaction, handing it to two-phase commit); `""` when
 * none.
 *
 * @ignore
 * @param sql SQL text.
 * @returns The keywords, upper-cased.
 */
export function transactionControl(sql: string): string {
  // As SQLite reads comments, and as PostgreSQL does (its block comments
  // nest): either reading may run.
  for (const postgres of [false, true]) {
    const start = separatorsEnd(sql, 0, postgres);
    const keyword = wordAt(sql, start).toUpperCase();
    if (TRANSACTION_CONTROL.has(keyword)) return keyword;
    const next = separatorsEnd(sql, start + keyword.length, postgres);
    if (
      keyword === "PREPARE" && wordAt(sql, next).toUpperCase() === "TRANSACTION"
    ) return "PREPARE TRANSACTION";
  }
  return "";
}

/**
 * The first word of `sql` after SQLite's whitespace, semicolons and
 * comments (`""` when none), as SQLite's tokenizer would read it: how the
 * core recognises a transaction-control statement before it runs.
 *
 * @ignore
 * @param sql SQL text.
 * @returns The leading keyword or identifier, as written.
 */
export function firstKeyword(sql: string): string {
  return wordAt(sql, separatorsEnd(sql, 0));
}

/** The keyword or identifier at `start` of `sql`, as written (`""` when none). */
function wordAt(sql: string, start: number): string {
  const match = /^[A-Za-z_][A-Za-z0-9_$]*/.exec(sql.slice(start, start + 64));
  return match?.[0] ?? "";
}

/**
 * Whether `text` holds only SQLite's whitespace, `;`, `-- …` to the end of
 * the line and `/* … *\/` (which SQLite, too, ends at the end of the text
 * when it is never closed). Scanned rather than matched with one regular
 * expression, which could read a closed comment as an unclosed one.
 */
function onlySeparators(text: string): boolean {
  return separatorsEnd(text, 0) === text.length;
}

/**
 * Where the run of separators that starts at `i` in `text` ends (SQLite
 * skips a byte order mark as space). `postgres`: as PostgreSQL reads them,
 * block comments nest (SQLite's end at the first `*\/`) and a line comment
 * also ends at a carriage return.
 */
function separatorsEnd(text: string, i: number, postgres = false): number {
  while (i < text.length) {
    const c = text[i]!;
    if (" \t\n\v\f\r;\uFEFF".includes(c)) i++;
    else if (text.startsWith("--", i)) i = lineEnd(text, i + 2, postgres);
    else if (text.startsWith("/*", i)) {
      i = commentEnd(text, i + 2, postgres);
    } else return i;
  }
  return i;
}

/**
 * Where a line comment whose text starts at `i` ends (past its newline, or
 * `postgres`, its carriage return).
 */
function lineEnd(text: string, i: number, postgres: boolean): number {
  while (i < text.length) {
    const c = text[i++];
    if (c === "\n" || (postgres && c === "\r")) return i;
  }
  return text.length;
}

/** Where a block comment whose text starts at `i` ends (past its `*\/`). */
function commentEnd(text: string, i: number, nested: boolean): number {
  for (let depth = 1; i < text.length;) {
    if (text.startsWith("*/", i)) {
      i += 2;
      if (--depth === 0 || !nested) return i;
    } else if (nested && text.startsWith("/*", i)) {
      depth++;
      i += 2;
    } else i++;
  }
  return text.length;
}

function clip(text: string): string {
  return text.length <= 60 ? text : `${text.slice(0, 57)}...`;
}

/**
 * Reads an integer column exactly: a value that is not a safe integer (a
 * `bigint` past 2^53 - 1, a rounded or non-integer number, text, NULL) throws
 * instead of becoming a rounded number that would name another event.
 *
 * @param row The row.
 * @param column The column to read.
 * @returns The value as a safe integer.
 * @throws {UnsafeIntegerError} When the value is not a safe integer.
 */
export function integerOf(row: Row, column: string): number {
  return safeInteger(column, row[column]);
}

/**
 * Checks one value read from the database as {@linkcode integerOf} does.
 *
 * @param column The column (or result field) it came from, for the error.
 * @param value The value as read.
 * @returns The value as a safe integer.
 * @throws {UnsafeIntegerError} When the value is not a safe integer.
 */
export function safeInteger(column: string, value: unknown): number {
  if (typeof value === "number" && Number.isSafeInteger(value)) return value;
  throw new UnsafeIntegerError(column, value);
}
