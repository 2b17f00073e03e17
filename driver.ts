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
  /** Runs one statement and returns its rows (empty when it returns none). */
  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]>;
  /** Runs one statement and reports its changes. */
  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult>;
  /** Runs a script of several statements without parameters. */
  exec(sql: string): Promise<void>;
  /** Closes the connection; later calls reject. Closing twice is a no-op. */
  close(): Promise<void>;
}
