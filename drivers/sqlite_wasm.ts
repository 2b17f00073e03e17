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
import {
  assertOneStatement,
  type Driver,
  type Row,
  type RunResult,
  type SqlValue,
} from "../driver.ts";
import type { TransactionStatus } from "../types.ts";
import { SqliteError, sqliteError } from "../errors.ts";

const SQLITE_IOERR = 10;
const SQLITE_CANTOPEN = 14;
import { StatementCache } from "./statement_cache.ts";
import { checkBoolean, checkOptions, describe } from "../validate.ts";

let sqlite3: Promise<Sqlite3Static> | undefined;

/**
 * The page size the project's SQLite WASM connections give a new file:
 * native SQLite's default, the disk's block and the Deno VFS's sector (the
 * WASM build's own default is 8192). Set before the first write.
 *
 * @ignore
 */
export const NEW_FILE_PAGE_SIZE = 4096;

/**
 * Loads and initialises the SQLite WASM module once per realm. For the
 * project's own drivers and VFS, which reach into the module's C API.
 *
 * @ignore
 * @param wasm The compiled `sqlite3.wasm`, when the caller has it already
 * (Deno imports it as a module, which needs no read permission); without
 * it, the build fetches or reads the file next to its script.
 * @returns The module's namespace (`capi`, `oo1`, `wasm`, `vfs`).
 */
export function loadSqlite3(wasm?: WebAssembly.Module): Promise<Sqlite3Static> {
  const moduleArg = wasm === undefined ? {} : {
    instantiateWasm(
      imports: WebAssembly.Imports,
      receive: (
        instance: WebAssembly.Instance,
        module: WebAssembly.Module,
      ) => void,
    ) {
      WebAssembly.instantiate(wasm, imports).then((instance) =>
        receive(instance, wasm)
      );
      return {};
    },
  };
  // The package's types omit the Emscripten module argument it passes on.
  const init = sqlite3InitModule as (
    moduleArg: object,
  ) => Promise<Sqlite3Static>;
  sqlite3 ??= init(moduleArg).then((module) => {
    // oo1 logs every failed step before throwing; the driver turns each into
    // a typed rejection, so the log would only repeat it, once per busy retry.
    const warn = module.config.warn;
    module.config.warn = (...args: unknown[]) => {
      if (String(args[0]).startsWith("sqlite3_step() rc=")) return;
      warn(...args);
    };
    return module;
  });
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
 * @throws {TypeError} When `path` is not a non-empty string.
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
  checkOptions("open database", options, ["vfs"]);
  const sqlite3 = await loadSqlite3();
  return new SqliteWasmDriver(sqlite3, openDatabase(sqlite3, path, options));
}

/**
 * The part of the official build's module namespace (what its
 * `sqlite3InitModule()` resolves to) that {@linkcode sqliteWasmDriver}
 * checks a connection against.
 */
export interface SqliteWasmModule {
  /** The object-oriented API, whose `DB` class the connection must be of. */
  readonly oo1: { readonly DB: abstract new (...args: never[]) => object };
}

/** Options for {@linkcode sqliteWasmDriver}. */
export interface SqliteWasmDriverOptions {
  /**
   * The module namespace `db` was opened with (what the build's
   * `sqlite3InitModule()` resolved to): each call of it makes a separate
   * WASM instance, whose connections another instance cannot use.
   *
   * @default {the module {@linkcode loadSqlite3} loads, which this package's openers use}
   */
  readonly sqlite3?: SqliteWasmModule;
  /**
   * Whether closing the driver (or the outbox over it) closes the
   * application's `db` too.
   *
   * @default {false}
   */
  readonly closeDatabase?: boolean;
}

/**
 * Makes a driver over an `oo1.DB` the application already owns, so an
 * outbox shares its database, its connection and its transactions. While
 * the application has a transaction open on `db` (its own `BEGIN`, or a
 * query builder's `transaction()`), `Outbox.enqueue` and the fenced
 * `Outbox.acknowledge` made inside `Outbox.within` run inside it without a
 * `BEGIN` or `COMMIT` of their own, and the application's `COMMIT` or
 * `ROLLBACK` decides; other calls wait for it to end. Keep one driver per handle.
 *
 * It is asynchronous: await it. `db` must come from the module the driver
 * is given: by default the one `loadSqlite3()` loads (which this package's
 * openers use); a handle opened with the module of the application's own
 * `sqlite3InitModule()` call needs that module, as `{ sqlite3 }`.
 *
 * @param db An open oo1 connection; the application keeps it.
 * @param options See {@linkcode SqliteWasmDriverOptions}.
 * @returns A promise of a driver over `db`.
 * @throws {TypeError} When `db` is not an open `oo1.DB` of the module, or an
 * option is unknown.
 *
 * @example An order and its event in the application's own transaction
 * ```ts
 * import { Outbox } from "@leased/outbox";
 * import { loadSqlite3, sqliteWasmDriver } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const sqlite3 = await loadSqlite3();
 * const db = new sqlite3.oo1.DB(":memory:");
 * db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)");
 * const outbox = await Outbox.open(await sqliteWasmDriver(db, { sqlite3 }));
 * db.exec("BEGIN IMMEDIATE");
 * db.exec("INSERT INTO orders (total) VALUES (4200)");
 * await outbox.within(() => outbox.enqueue({ type: "order.placed" }));
 * db.exec("COMMIT"); // the order and its event, together
 * assert.equal((await outbox.stats()).pending, 1);
 * await outbox.close();
 * assert.equal(db.isOpen(), true); // the application's handle stays open
 * db.close();
 * ```
 */
export async function sqliteWasmDriver(
  db: object,
  options: SqliteWasmDriverOptions = {},
): Promise<SqliteWasmDriver> {
  const op = "make driver";
  checkOptions(op, options, ["sqlite3", "closeDatabase"]);
  const sqlite3 = (options.sqlite3 ?? await loadSqlite3()) as Sqlite3Static;
  if (!(db instanceof sqlite3.oo1.DB) || !db.pointer) {
    throw new TypeError(
      `Cannot ${op} as 'db' must be an open oo1.DB of the module given as 'sqlite3' (default: loadSqlite3()'s): current value is ${
        db instanceof sqlite3.oo1.DB ? "a closed oo1.DB" : String(db)
      }`,
    );
  }
  const closeDatabase = checkBoolean(
    op,
    "closeDatabase",
    options.closeDatabase,
    false,
  );
  return new SqliteWasmDriver(sqlite3, db, undefined, closeDatabase);
}

/**
 * Opens an oo1 connection, creating the database if need be, for the
 * runtime-specific openers that wrap it in their own driver.
 *
 * @ignore
 * @param sqlite3 The module namespace from {@linkcode loadSqlite3}.
 * @param path What {@linkcode openSqliteWasm} takes.
 * @param options See {@linkcode SqliteWasmOptions}.
 * @returns The open connection.
 * @throws {TypeError} When `path` is not a non-empty string.
 * @throws {SqliteError} When SQLite cannot open the database.
 */
export function openDatabase(
  sqlite3: Sqlite3Static,
  path: string,
  options: SqliteWasmOptions,
): Database {
  if (typeof path !== "string" || path.length === 0) {
    throw new TypeError(
      `Cannot open database as 'path' must be a non-empty string: current value is ${
        describe(path)
      }`,
    );
  }
  const vfs = options.vfs;
  if (vfs !== undefined) {
    if (typeof vfs !== "string" || vfs === "") {
      throw new TypeError(
        `Cannot open database as 'vfs' must be a VFS name: current value is ${
          describe(vfs)
        }`,
      );
    }
    if (!sqlite3.capi.sqlite3_vfs_find(vfs)) {
      throw new RangeError(
        `Cannot open database as 'vfs' must name a VFS registered with SQLite: current value is ${
          describe(vfs)
        }`,
      );
    }
  }
  try {
    return new sqlite3.oo1.DB({
      filename: path,
      flags: "c",
      ...(options.vfs === undefined ? {} : { vfs: options.vfs }),
    });
  } catch (error) {
    throw toSqliteError(error);
  }
}

/**
 * Waits after `SQLITE_BUSY` on the connection `db` (its `sqlite3*`) for at
 * most `timeoutMs` milliseconds: the hook behind
 * {@linkcode SqliteWasmDriver.busyWait}.
 *
 * @ignore
 */
export type BusyWaitHook = (db: number, timeoutMs: number) => Promise<void>;

/**
 * A {@linkcode Driver} over one oo1 connection. Statements are prepared once
 * per SQL text and kept, the 256 most recently used, until
 * {@linkcode SqliteWasmDriver.close}; those that leave the cache are
 * finalized.
 *
 * oo1 opens and prepares; binding, stepping and reading columns call the
 * module's raw C exports, which skips oo1's per-call argument checks,
 * string conversions and `get({})` object building (see bench/README.md).
 */
export class SqliteWasmDriver implements Driver, AsyncDisposable {
  readonly #capi: RawCapi;
  readonly #memory: WebAssembly.Memory;
  #heap: Uint8Array;
  #db: Database | undefined;
  readonly #closeDatabase: boolean;
  readonly #pointer: number;
  readonly #statements = new StatementCache<CachedStatement>(
    ({ statement }) => statement.finalize(),
  );
  readonly #alloc: (bytes: number) => number;
  readonly #dealloc: (pointer: number) => void;
  /** Scratch space in the WASM heap for text and blob parameters. */
  #scratch = 0;
  #scratchBytes = 0;
  /**
   * Waits until the lock that made the last statement fail with
   * `SQLITE_BUSY` may be free, or `timeoutMs` milliseconds at most. Present
   * when the opener knows how to watch the database's locks (the Deno file
   * VFS does); see {@linkcode Driver.busyWait}.
   */
  readonly busyWait?: (timeoutMs: number) => Promise<void>;
  readonly #reason: ((code: number) => string | undefined) | undefined;

  /**
   * Wraps an open oo1 connection (for the project's own openers).
   *
   * @ignore
   * @param sqlite3 The module namespace from {@linkcode loadSqlite3}.
   * @param db An open oo1 database.
   * @param busyWait How to wait after `SQLITE_BUSY`, if the opener knows.
   * @param closeDatabase Whether {@linkcode SqliteWasmDriver.close} closes
   * `db` (the driver owns it).
   * @param reason The VFS's reason for a failure with an extended result
   * code, if it knows it: added to an I/O or open error's message.
   */
  constructor(
    sqlite3: Sqlite3Static,
    db: Database,
    busyWait?: BusyWaitHook,
    closeDatabase = true,
    reason?: (code: number) => string | undefined,
  ) {
    this.#closeDatabase = closeDatabase;
    this.#reason = reason;
    this.#capi = sqlite3.wasm.exports as RawCapi;
    this.#memory = sqlite3.config.memory;
    this.#heap = new Uint8Array(this.#memory.buffer);
    this.#db = db;
    this.#pointer = db.pointer!;
    this.#alloc = (bytes) => sqlite3.wasm.alloc(bytes);
    this.#dealloc = (pointer) => sqlite3.wasm.dealloc(pointer);
    if (busyWait !== undefined) {
      // A closed connection's pointer is freed: nothing is left to wait for.
      this.busyWait = (timeoutMs) =>
        this.#db === undefined
          ? Promise.resolve()
          : busyWait(this.#pointer, timeoutMs);
    }
  }

  /** Whether a transaction is open on the connection (`sqlite3_get_autocommit()` is 0). */
  inTransaction(): boolean {
    return this.#db !== undefined &&
      this.#capi.sqlite3_get_autocommit(this.#pointer) === 0;
  }

  /**
   * The connection's transaction as SQLite reports it: `open` while
   * `sqlite3_get_autocommit()` is 0, `idle` otherwise (SQLite has no failed
   * state: an error either leaves the transaction open or rolls it back).
   */
  transactionStatus(): TransactionStatus {
    return this.inTransaction() ? "open" : "idle";
  }

  /** Runs one statement and returns its rows. */
  query(sql: string, params: readonly SqlValue[] = []): Promise<Row[]> {
    let statement: CachedStatement | undefined;
    try {
      statement = this.#prepare("query", sql);
      const rows: Row[] = [];
      this.#bind(statement.pointer, params);
      const capi = this.#capi;
      let rc: number;
      while ((rc = capi.sqlite3_step(statement.pointer)) === SQLITE_ROW) {
        rows.push(this.#row(statement));
      }
      this.#finish(statement.pointer, rc, params.length);
      return Promise.resolve(rows);
    } catch (error) {
      return Promise.reject(this.#explained(toSqliteError(error)));
    } finally {
      if (statement !== undefined) this.#statements.leave();
    }
  }

  /** Runs one statement and reports its changes. */
  run(sql: string, params: readonly SqlValue[] = []): Promise<RunResult> {
    let statement: CachedStatement | undefined;
    try {
      statement = this.#prepare("run", sql);
      this.#bind(statement.pointer, params);
      const capi = this.#capi;
      let rc: number;
      while ((rc = capi.sqlite3_step(statement.pointer)) === SQLITE_ROW);
      this.#finish(statement.pointer, rc, params.length);
      return Promise.resolve({
        changes: capi.sqlite3_changes(this.#pointer),
        lastInsertRowid: exactInteger(
          capi.sqlite3_last_insert_rowid(this.#pointer),
        ),
      });
    } catch (error) {
      return Promise.reject(this.#explained(toSqliteError(error)));
    } finally {
      if (statement !== undefined) this.#statements.leave();
    }
  }

  /** Runs a script of several statements. */
  exec(sql: string): Promise<void> {
    try {
      this.#open().exec(sql);
      return Promise.resolve();
    } catch (error) {
      return Promise.reject(this.#explained(toSqliteError(error)));
    }
  }

  /**
   * Finalizes cached statements and closes the connection (over an
   * application's `db`, closeDatabase false, leaves it open).
   */
  close(): Promise<void> {
    const db = this.#db;
    this.#db = undefined;
    this.#statements.clear();
    if (this.#scratch !== 0) this.#dealloc(this.#scratch);
    this.#scratch = 0;
    this.#scratchBytes = 0;
    if (this.#closeDatabase) db?.close();
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

  /** The statement for `sql`, marked in use until the caller leaves it. */
  #prepare(method: "query" | "run", sql: string): CachedStatement {
    let cached = this.#statements.get(sql);
    if (cached === undefined) {
      const statement = this.#open().prepare(sql);
      // oo1 compiles only the first statement and drops the tail pointer;
      // sqlite3_sql() is that statement's text, a prefix of `sql`.
      try {
        assertOneStatement(
          method,
          sql,
          () => this.#text(this.#capi.sqlite3_sql(statement.pointer!), -1),
        );
      } catch (error) {
        statement.finalize();
        throw error;
      }
      cached = {
        statement,
        pointer: statement.pointer!,
        names: [],
        reprepares: -1,
      };
      this.#statements.add(sql, cached);
    }
    this.#statements.enter(cached);
    return cached;
  }

  /** Views of WASM memory detach when it grows, so re-read after any call. */
  #view(): Uint8Array {
    if (this.#heap.buffer !== this.#memory.buffer) {
      this.#heap = new Uint8Array(this.#memory.buffer);
    }
    return this.#heap;
  }

  #reserve(bytes: number): number {
    // Never the null pointer: SQLite binds a null text or blob as NULL.
    if (bytes > this.#scratchBytes || this.#scratch === 0) {
      if (this.#scratch !== 0) this.#dealloc(this.#scratch);
      this.#scratch = 0;
      const size = Math.max(bytes, 256);
      this.#scratch = this.#alloc(size);
      this.#scratchBytes = size;
    }
    return this.#scratch;
  }

  #bind(pointer: number, params: readonly SqlValue[]): void {
    const capi = this.#capi;
    for (let i = 0; i < params.length; i++) {
      const value = params[i];
      const index = i + 1;
      let rc: number;
      if (typeof value === "number") {
        rc = (value | 0) === value
          ? capi.sqlite3_bind_int(pointer, index, value)
          : Number.isSafeInteger(value)
          ? capi.sqlite3_bind_int64(pointer, index, BigInt(value))
          : capi.sqlite3_bind_double(pointer, index, value);
      } else if (typeof value === "string") {
        const bytes = this.#writeText(value);
        rc = capi.sqlite3_bind_text(
          pointer,
          index,
          this.#scratch,
          bytes,
          SQLITE_TRANSIENT,
        );
      } else if (value === null) {
        rc = capi.sqlite3_bind_null(pointer, index);
      } else if (typeof value === "bigint") {
        if (value < INT64_MIN || value > INT64_MAX) {
          throw new RangeError(
            `Cannot bind parameter ${index} as a bigint must fit in 64 bits: current value is ${value}`,
          );
        }
        rc = capi.sqlite3_bind_int64(pointer, index, value);
      } else if (value instanceof Uint8Array) {
        const scratch = this.#reserve(value.byteLength);
        this.#view().set(value, scratch);
        rc = capi.sqlite3_bind_blob(
          pointer,
          index,
          scratch,
          value.byteLength,
          SQLITE_TRANSIENT,
        );
      } else {
        throw new TypeError(
          `Cannot bind parameter ${index} as its type is not supported: current value is ${
            String(value)
          }`,
        );
      }
      if (rc !== 0) this.#fail(pointer, rc, params.length);
    }
  }

  /** Writes `text` as UTF-8 to the scratch space; returns its byte length. */
  #writeText(text: string): number {
    const length = text.length;
    // UTF-8 needs at most 3 bytes per UTF-16 code unit.
    const scratch = this.#reserve(length * 3);
    const heap = this.#view();
    // Short ASCII strings (queue names, tokens, SQL states) are most
    // parameters; copying them here avoids a TextEncoder call per parameter.
    if (length <= 64) {
      let i = 0;
      for (; i < length; i++) {
        const code = text.charCodeAt(i);
        if (code >= 0x80) break;
        heap[scratch + i] = code;
      }
      if (i === length) return length;
    }
    return encoder.encodeInto(
      text,
      heap.subarray(scratch, scratch + length * 3),
    ).written;
  }

  #row(cached: CachedStatement): Row {
    const capi = this.#capi;
    const pointer = cached.pointer;
    const count = capi.sqlite3_column_count(pointer);
    // A schema change re-prepares the statement and may change its columns.
    const reprepares = capi.sqlite3_stmt_status(
      pointer,
      SQLITE_STMTSTATUS_REPREPARE,
      0,
    );
    if (reprepares !== cached.reprepares || count !== cached.names.length) {
      cached.names = [];
      for (let i = 0; i < count; i++) {
        cached.names.push(
          this.#text(capi.sqlite3_column_name(pointer, i), -1),
        );
      }
      cached.reprepares = reprepares;
    }
    const names = cached.names;
    const row: Row = {};
    for (let i = 0; i < count; i++) {
      let value: SqlValue;
      switch (capi.sqlite3_column_type(pointer, i)) {
        case SQLITE_INTEGER: {
          // A double holds every integer within ±2^53 exactly; only larger
          // ones need the BigInt that sqlite3_column_int64 allocates.
          const double = capi.sqlite3_column_double(pointer, i);
          value = double <= Number.MAX_SAFE_INTEGER &&
              double >= Number.MIN_SAFE_INTEGER
            ? double
            : exactInteger(capi.sqlite3_column_int64(pointer, i));
          break;
        }
        case SQLITE_FLOAT:
          value = capi.sqlite3_column_double(pointer, i);
          break;
        case SQLITE_TEXT: {
          const text = capi.sqlite3_column_text(pointer, i);
          value = this.#text(text, capi.sqlite3_column_bytes(pointer, i));
          break;
        }
        case SQLITE_BLOB: {
          const blob = capi.sqlite3_column_blob(pointer, i);
          const bytes = capi.sqlite3_column_bytes(pointer, i);
          value = this.#view().slice(blob, blob + bytes);
          break;
        }
        default:
          value = null;
      }
      row[names[i]!] = value;
    }
    return row;
  }

  /** Decodes UTF-8 at `pointer`: `bytes` long, or up to its NUL when `-1`. */
  #text(pointer: number, bytes: number): string {
    const heap = this.#view();
    if (bytes < 0) bytes = heap.indexOf(0, pointer) - pointer;
    if (bytes <= 32) {
      let text = "";
      let i = 0;
      for (; i < bytes; i++) {
        const byte = heap[pointer + i]!;
        if (byte >= 0x80) break;
        text += String.fromCharCode(byte);
      }
      if (i === bytes) return text;
    }
    return decoder.decode(heap.subarray(pointer, pointer + bytes));
  }

  /** Resets the statement after its last step, throwing what that step reported. */
  #finish(pointer: number, rc: number, params: number): void {
    if (rc !== SQLITE_DONE) this.#fail(pointer, rc, params);
    this.#capi.sqlite3_reset(pointer);
    if (params > 0) this.#capi.sqlite3_clear_bindings(pointer);
  }

  #fail(pointer: number, rc: number, params: number): never {
    const capi = this.#capi;
    const code = capi.sqlite3_extended_errcode(this.#pointer) || rc;
    const message = this.#text(capi.sqlite3_errmsg(this.#pointer), -1);
    capi.sqlite3_reset(pointer);
    if (params > 0) capi.sqlite3_clear_bindings(pointer);
    throw this.#explained(sqliteError(message, code));
  }

  /**
   * `error` with the VFS's reason added, for an I/O or open error whose
   * code the VFS's last failure had: SQLite itself says only "disk I/O
   * error" or "unable to open database file".
   */
  #explained(error: Error): Error {
    if (
      this.#reason === undefined || !(error instanceof SqliteError) ||
      (error.primaryCode !== SQLITE_IOERR &&
        error.primaryCode !== SQLITE_CANTOPEN)
    ) {
      return error;
    }
    const reason = this.#reason(error.code);
    return reason === undefined
      ? error
      : sqliteError(`${error.message}: ${reason}`, error.code, error);
  }
}

/** A prepared statement kept for its SQL text, with its column names. */
interface CachedStatement {
  readonly statement: PreparedStatement;
  readonly pointer: number;
  names: string[];
  /** `SQLITE_STMTSTATUS_REPREPARE` when `names` was read. */
  reprepares: number;
}

/** The raw C exports this driver calls (pointers are numbers, i64 bigints). */
interface RawCapi {
  sqlite3_step(stmt: number): number;
  sqlite3_reset(stmt: number): number;
  sqlite3_clear_bindings(stmt: number): number;
  sqlite3_bind_int(stmt: number, index: number, value: number): number;
  sqlite3_bind_int64(stmt: number, index: number, value: bigint): number;
  sqlite3_bind_double(stmt: number, index: number, value: number): number;
  sqlite3_bind_null(stmt: number, index: number): number;
  sqlite3_bind_text(
    stmt: number,
    index: number,
    text: number,
    bytes: number,
    destructor: number,
  ): number;
  sqlite3_bind_blob(
    stmt: number,
    index: number,
    blob: number,
    bytes: number,
    destructor: number,
  ): number;
  sqlite3_column_count(stmt: number): number;
  sqlite3_column_name(stmt: number, column: number): number;
  sqlite3_column_type(stmt: number, column: number): number;
  sqlite3_column_double(stmt: number, column: number): number;
  sqlite3_column_int64(stmt: number, column: number): bigint;
  sqlite3_column_text(stmt: number, column: number): number;
  sqlite3_column_blob(stmt: number, column: number): number;
  sqlite3_column_bytes(stmt: number, column: number): number;
  sqlite3_stmt_status(stmt: number, op: number, reset: number): number;
  sqlite3_sql(stmt: number): number;
  sqlite3_changes(db: number): number;
  sqlite3_get_autocommit(db: number): number;
  sqlite3_last_insert_rowid(db: number): bigint;
  sqlite3_errmsg(db: number): number;
  sqlite3_extended_errcode(db: number): number;
}

const SQLITE_ROW = 100;
const SQLITE_DONE = 101;
const SQLITE_INTEGER = 1;
const SQLITE_FLOAT = 2;
const SQLITE_TEXT = 3;
const SQLITE_BLOB = 4;
/** Tells SQLite to copy a bound value before the call returns. */
const SQLITE_TRANSIENT = -1;
const SQLITE_STMTSTATUS_REPREPARE = 5;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

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
    // oo1 prefixes the engine's message with the code's name and number,
    // which SqliteError carries already; the bare message matches node:sqlite.
    const message = error.message.replace(
      /^SQLITE_[A-Z0-9_]+: sqlite3 result code \d+: /,
      "",
    );
    return sqliteError(message, error.resultCode, error);
  }
  return error instanceof Error ? error : new Error(String(error));
}
