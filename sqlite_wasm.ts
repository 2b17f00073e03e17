/**
 * The default driver: the official SQLite WASM build
 * (`npm:@sqlite.org/sqlite-wasm`, pinned to 3.54.1-build1).
 *
 * @module
 */
import sqlite3InitModule, {
  type Database,
  type PreparedStatement,
  type Sqlite3Static,
} from "@sqlite.org/sqlite-wasm";
import type { Driver, Row, RunResult, SqlValue } from "./driver.ts";
import { sqliteError } from "./errors.ts";

let sqlite3: Promise<Sqlite3Static> | undefined;

/**
 * Loads and initialises the SQLite WASM module once per realm. For the
 * project's own drivers and VFS, which reach into the module's C API.
 *
 * @ignore
 * @returns The module's namespace (`capi`, `oo1`, `wasm`, `vfs`).
 */
export function loadSqlite3(): Promise<Sqlite3Static> {
  sqlite3 ??= sqlite3InitModule();
  return sqlite3;
}

/** Options for {@linkcode openSqliteWasm}. */
export interface SqliteWasmOptions {
  /**
   * Name of a registered VFS to open the database through.
   *
   * @default {undefined} (the build's default VFS)
   */
  readonly vfs?: string;
}

/**
 * Opens one connection through the SQLite WASM build.
 *
 * `":memory:"` is a private in-memory database. A name of the form
 * `"file:/name?vfs=memdb"` is an in-memory database that every connection of
 * this realm opening the same name shares (SQLite's `memdb` VFS), which is
 * how tests give two connections one database without a filesystem.
 *
 * @param path `":memory:"`, a `file:` URI, or a path the chosen VFS understands.
 * @param options See {@linkcode SqliteWasmOptions}.
 * @returns A {@linkcode Driver} for the connection.
 * @throws {SqliteError} When SQLite cannot open the database (`SQLITE_CANTOPEN`).
 *
 * @example Two connections to one shared in-memory database
 * ```ts
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * await using a = await openSqliteWasm("file:/doc?vfs=memdb");
 * await using b = await openSqliteWasm("file:/doc?vfs=memdb");
 * await a.exec("CREATE TABLE t(x INTEGER) STRICT; INSERT INTO t VALUES (1)");
 * assert.deepEqual(await b.query("SELECT x FROM t"), [{ x: 1 }]);
 * ```
 */
export async function openSqliteWasm(
  path: string,
  options: SqliteWasmOptions = {},
): Promise<SqliteWasmDriver> {
  if (typeof path !== "string" || path.length === 0) {
    throw new TypeError(
      `Cannot open database as 'path' must be a non-empty string: current value is ${
        String(path)
      }`,
    );
  }
  const sqlite3 = await loadSqlite3();
  let db: Database;
  try {
    db = new sqlite3.oo1.DB({
      filename: path,
      flags: "c",
      ...(options.vfs === undefined ? {} : { vfs: options.vfs }),
    });
  } catch (error) {
    throw toSqliteError(error);
  }
  return new SqliteWasmDriver(sqlite3, db);
}

/**
 * A {@linkcode Driver} over one oo1 connection. Statements are prepared once
 * per SQL text and kept until {@linkcode SqliteWasmDriver.close}.
 */
export class SqliteWasmDriver implements Driver, AsyncDisposable {
  readonly #sqlite3: Sqlite3Static;
  #db: Database | undefined;
  readonly #statements = new Map<string, PreparedStatement>();

  /**
   * Wraps an open oo1 connection (for the project's own openers).
   *
   * @ignore
   * @param sqlite3 The module namespace from {@linkcode loadSqlite3}.
   * @param db An open oo1 database this driver takes ownership of.
   */
  constructor(sqlite3: Sqlite3Static, db: Database) {
    this.#sqlite3 = sqlite3;
    this.#db = db;
  }

  /** Runs one statement and returns its rows. */
  query(sql: string, params: readonly SqlValue[] = []): Promise<Row[]> {
    try {
      const statement = this.#prepare(sql, params);
      const rows: Row[] = [];
      try {
        while (statement.step()) rows.push(statement.get({}) as Row);
      } finally {
        statement.reset(true);
      }
      return Promise.resolve(rows);
    } catch (error) {
      return Promise.reject(toSqliteError(error));
    }
  }

  /** Runs one statement and reports its changes. */
  run(sql: string, params: readonly SqlValue[] = []): Promise<RunResult> {
    try {
      const statement = this.#prepare(sql, params);
      try {
        while (statement.step());
      } finally {
        statement.reset(true);
      }
      const db = this.#open();
      return Promise.resolve({
        changes: db.changes() as number,
        lastInsertRowid: exactInteger(
          this.#sqlite3.capi.sqlite3_last_insert_rowid(db.pointer!),
        ),
      });
    } catch (error) {
      return Promise.reject(toSqliteError(error));
    }
  }

  /** Runs a script of several statements. */
  exec(sql: string): Promise<void> {
    try {
      this.#open().exec(sql);
      return Promise.resolve();
    } catch (error) {
      return Promise.reject(toSqliteError(error));
    }
  }

  /** Finalizes cached statements and closes the connection. */
  close(): Promise<void> {
    const db = this.#db;
    this.#db = undefined;
    for (const statement of this.#statements.values()) statement.finalize();
    this.#statements.clear();
    db?.close();
    return Promise.resolve();
  }

  /** Same as {@linkcode SqliteWasmDriver.close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #open(): Database {
    if (this.#db === undefined) throw new Error("Database is closed");
    return this.#db;
  }

  #prepare(sql: string, params: readonly SqlValue[]): PreparedStatement {
    let statement = this.#statements.get(sql);
    if (statement === undefined) {
      statement = this.#open().prepare(sql);
      this.#statements.set(sql, statement);
    }
    if (params.length > 0) statement.bind(params as SqlValue[]);
    return statement;
  }
}

function exactInteger(value: bigint): number | bigint {
  return value >= BigInt(Number.MIN_SAFE_INTEGER) &&
      value <= BigInt(Number.MAX_SAFE_INTEGER)
    ? Number(value)
    : value;
}

function toSqliteError(error: unknown): Error {
  if (
    error instanceof Error && "resultCode" in error &&
    typeof error.resultCode === "number"
  ) {
    return sqliteError(error.message, error.resultCode, error);
  }
  return error instanceof Error ? error : new Error(String(error));
}
