/**
 * A driver over `node:sqlite`, the native SQLite built into Deno: real WAL
 * and POSIX byte-range locks, for Deno servers that want native speed, and
 * the differential oracle the contract suite compares the WASM driver with.
 *
 * It behaves like the WASM driver in everything the contract observes:
 * integers read back as `number` within ±2^53 and as `bigint` beyond; integer
 * `number` parameters bind as SQLite `INTEGER` (node:sqlite alone binds every
 * `number` as `REAL`); rows are plain objects; SQLite's busy handler is off;
 * foreign keys follow SQLite's default (off) rather than node:sqlite's (on).
 * Two differences remain, both in Deno's node:sqlite itself: text read back
 * ends at its first NUL character (`"a\u0000b"` is stored whole but reads as
 * `"a"`), and after another connection changes the schema, the first run of
 * a cached `SELECT *` here still returns the old column set (its `all()`
 * counts columns before SQLite re-prepares).
 *
 * @module
 */
import { statSync } from "node:fs";
import { DatabaseSync, type StatementSync } from "node:sqlite";
import { closedNodeSqlite, openedNodeSqlite } from "./node_sqlite_files.ts";
import { StatementCache } from "./statement_cache.ts";
import {
  assertOneStatement,
  type Driver,
  openBusyTimeoutMs,
  type Row,
  type RunResult,
  type SqlValue,
  transactionControl,
  untilNotBusy,
} from "../driver.ts";
import { DatabaseMovedError, SqliteError, sqliteError } from "../errors.ts";
import { JOURNAL_SIZE_LIMIT_BYTES } from "../wal.ts";
import type { TransactionStatus } from "../types.ts";
import {
  checkBoolean,
  checkJournalMode,
  checkOneOf,
  checkOptions,
  describe,
} from "../validate.ts";
import { jitteredWait } from "../core/backoff.ts";

/**
 * A `PRAGMA journal_mode` (https://sqlite.org/pragma.html#pragma_journal_mode),
 * the same four `openSqliteWasm` offers: `"off"` and `"memory"` are not
 * offered, as without a journal a `ROLLBACK` leaves a refused
 * acknowledgement's rows written, and with one in memory a crash during a
 * commit can corrupt the file.
 */
export type JournalMode =
  | "wal"
  | "delete"
  | "truncate"
  | "persist";

/** A `PRAGMA synchronous` level (https://sqlite.org/pragma.html#pragma_synchronous). */
export type Synchronous = "off" | "normal" | "full" | "extra";

const JOURNAL_MODES: readonly JournalMode[] = [
  "wal",
  "delete",
  "truncate",
  "persist",
];
const OPEN = "open database";
const SYNCHRONOUS_LEVELS: readonly Synchronous[] = [
  "off",
  "normal",
  "full",
  "extra",
];

/** Options for {@linkcode openNodeSqlite}. */
export interface NodeSqliteOptions {
  /**
   * Journal mode set when the connection opens. `"wal"` lets readers run
   * beside the one writer across connections and processes. Unset, a new
   * file gets `"wal"`, and an existing one keeps its mode (`"wal"`, or a
   * rollback journal, SQLite's `"delete"`). Pass a rollback mode for a file on a
   * network file system, whose hosts share no memory (see `docs/wal.md`).
   * Ignored for in-memory databases, whose journal always lives in memory.
   *
   * @default {"wal" for a new file or a file in WAL mode, else "delete"}
   */
  readonly journalMode?: JournalMode;
  /**
   * Sync level set when the connection opens. `FULL` makes every commit
   * durable across power loss in any journal mode, which an outbox promises;
   * `"normal"` in WAL mode may lose the last commits on power loss (not on a
   * process crash).
   *
   * @default {"full"}
   */
  readonly synchronous?: Synchronous;
  /**
   * How long opening waits, in milliseconds, while another connection holds
   * a lock that keeps it from reading or applying `journalMode` (e.g. a
   * writer committing, or another connection switching the file to WAL);
   * past it, opening throws {@linkcode BusyError}. Waiting retries every few
   * milliseconds without blocking the event loop.
   *
   * @default {5000}
   */
  readonly busyTimeoutMs?: number;
  /**
   * Opens the file read-only (`SQLITE_OPEN_READONLY`): queries work, every
   * write fails with {@linkcode SqliteError} code 8 (`SQLITE_READONLY`), and
   * `journalMode` is not applied, since switching it writes the file; the
   * file keeps the journal mode it has. A file this process may not write
   * opens the same way without the option.
   *
   * @default {false}
   */
  readonly readOnly?: boolean;
}

/**
 * Opens one connection through `node:sqlite`. A new file gets
 * `auto_vacuum = INCREMENTAL` before its first page is written (so
 * `Outbox.maintain` can shrink it in any journal mode), and the connection
 * `journal_size_limit` 8 MiB, so a WAL that grew behind a long reader
 * shrinks once it is reset (see `docs/wal.md`).
 *
 * @param path A file path, a `file:` URL, or `":memory:"` for a private
 * in-memory database.
 * @param options See {@linkcode NodeSqliteOptions}.
 * @returns A {@linkcode Driver} for the connection.
 * @throws {TypeError} When `path` is empty or an option has the wrong type.
 * @throws {RangeError} When an option names no known mode.
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 * @throws {SqliteError} When SQLite cannot open the database or refuses the
 * journal mode (e.g. WAL on a file system without shared memory). Later, in
 * any journal mode, a transaction on a file renamed, deleted or replaced
 * under the connection fails with {@linkcode DatabaseMovedError} (code 1032)
 * at its `COMMIT` and is rolled back, even one that only read: native SQLite
 * checks this before a rollback journal only, the driver before each
 * `COMMIT` it runs.
 *
 * @example Two connections to one file in WAL mode
 * ```ts
 * import { openNodeSqlite } from "@leased/outbox/node-sqlite";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   await using a = await openNodeSqlite(`${dir}/outbox.db`);
 *   await using b = await openNodeSqlite(`${dir}/outbox.db`);
 *   await a.exec("CREATE TABLE t(x INTEGER) STRICT");
 *   await a.run("INSERT INTO t VALUES (?)", [2n ** 60n]);
 *   assert.deepEqual(await b.query("SELECT x FROM t"), [{ x: 2n ** 60n }]);
 *   assert.deepEqual(await b.query("PRAGMA journal_mode"), [{ journal_mode: "wal" }]);
 * }
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function openNodeSqlite(
  path: string | URL,
  options: NodeSqliteOptions = {},
): Promise<NodeSqliteDriver> {
  if (!(path instanceof URL) && (typeof path !== "string" || path === "")) {
    throw new TypeError(
      `Cannot open database as 'path' must be a non-empty string or URL: current value is ${
        describe(path)
      }`,
    );
  }
  checkOptions("open database", options, [
    "journalMode",
    "synchronous",
    "busyTimeoutMs",
    "readOnly",
  ]);
  const requested = checkJournalMode(
    OPEN,
    options.journalMode,
    JOURNAL_MODES,
  );
  let journalMode: JournalMode = requested ?? "wal";
  const synchronous = checkOneOf(
    OPEN,
    "synchronous",
    options.synchronous,
    SYNCHRONOUS_LEVELS,
  ) ?? "full";
  const busyTimeoutMs = openBusyTimeoutMs(options.busyTimeoutMs);
  const readOnly = checkBoolean(
    "open database",
    "readOnly",
    options.readOnly,
    false,
  );
  let db: DatabaseSync | undefined;
  try {
    db = new DatabaseSync(path, {
      enableForeignKeyConstraints: false,
      readOnly,
    });
    // Deno's node:sqlite installs a 5 s busy handler whatever `timeout`
    // says; the core retries SQLITE_BUSY itself without blocking the loop.
    db.exec("PRAGMA busy_timeout = 0");
    db.exec(`PRAGMA journal_size_limit = ${JOURNAL_SIZE_LIMIT_BYTES}`);
    let keptMode = false;
    // Both read the schema first, which takes a shared lock.
    const actual = await untilNotBusy(
      busyTimeoutMs,
      () => {
        try {
          db!.exec(`PRAGMA synchronous = ${synchronous}`);
          if (readOnly) {
            return Promise.resolve(db!.prepare("PRAGMA journal_mode").all());
          }
          // A new file: auto_vacuum takes effect only before its first page
          // is written, which journal_mode=wal does.
          const [pages] = db!.prepare("PRAGMA page_count").all();
          let isNew = Number(pages?.["page_count"]) === 0;
          if (isNew) {
            try {
              db!.exec("PRAGMA auto_vacuum = INCREMENTAL");
            } catch (error) {
              // A file SQLite opened read-only: left as it is, below.
              const mapped = toSqliteError(error);
              if (
                !(mapped instanceof SqliteError) || mapped.primaryCode !== 8
              ) {
                throw mapped;
              }
              isNew = false;
            }
          }
          if (requested === undefined && !isNew) {
            // An existing file keeps its mode: "wal" is stored in the file;
            // a rollback journal is the connection's own ("delete").
            const [current] = db!.prepare("PRAGMA journal_mode").all();
            journalMode = String(current?.["journal_mode"]) as JournalMode;
          }
          try {
            return Promise.resolve(
              db!.prepare(`PRAGMA journal_mode = ${journalMode}`).all(),
            );
          } catch (error) {
            // SQLite opened a file it may not write read-only; it keeps its
            // journal mode, as with `readOnly`.
            const mapped = toSqliteError(error);
            if (!(mapped instanceof SqliteError) || mapped.primaryCode !== 8) {
              throw mapped;
            }
            keptMode = true;
            return Promise.resolve(db!.prepare("PRAGMA journal_mode").all());
          }
        } catch (error) {
          return Promise.reject(toSqliteError(error));
        }
      },
      // No lock to watch here: a short jittered sleep, as the core's.
      (ms) => jitteredWait(ms, 3),
    );
    const mode = String(actual[0]?.["journal_mode"]);
    if (!readOnly && !keptMode && mode !== "memory" && mode !== journalMode) {
      throw sqliteError(
        `SQLite kept journal_mode ${mode} instead of ${journalMode}`,
        1,
      );
    }
  } catch (error) {
    db?.close();
    throw toSqliteError(error);
  }
  return new NodeSqliteDriver(db);
}

/** Options for {@linkcode nodeSqliteDriver}. */
export interface NodeSqliteDriverOptions {
  /**
   * Whether closing the driver (or the outbox over it) closes the
   * application's handle too.
   *
   * @default {false}
   */
  readonly closeDatabase?: boolean;
}

/**
 * Makes a driver over a `node:sqlite` handle the application already owns,
 * so an outbox shares its database, its connection and its transactions.
 * While the application has a transaction open on the handle (its own
 * `BEGIN`, or a query builder's `transaction()`), `Outbox.enqueue` and the
 * fenced `Outbox.acknowledge` made inside `Outbox.within` run inside it
 * without a `BEGIN` or `COMMIT` of their own, and the application's
 * `COMMIT` or `ROLLBACK` decides; other calls wait for it to end. The handle's settings stay as the application
 * made them: its busy timeout (Deno's node:sqlite sets 5 s) blocks the
 * thread while a statement waits for a lock, as the application's own
 * statements do. Keep one driver per handle.
 *
 * @param db An open handle; the application keeps it.
 * @param options See {@linkcode NodeSqliteDriverOptions}.
 * @returns A driver over `db`.
 * @throws {TypeError} When `db` is not an open `DatabaseSync`, or an option
 * is unknown or of the wrong type.
 *
 * @example An order and its event in the application's own transaction
 * ```ts
 * import { Outbox } from "@leased/outbox";
 * import { nodeSqliteDriver } from "@leased/outbox/node-sqlite";
 * import { DatabaseSync } from "node:sqlite";
 * import assert from "node:assert/strict";
 *
 * const db = new DatabaseSync(":memory:");
 * db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)");
 * const outbox = await Outbox.open(nodeSqliteDriver(db));
 * db.exec("BEGIN IMMEDIATE");
 * db.prepare("INSERT INTO orders (total) VALUES (?)").run(4200);
 * await outbox.within(() => outbox.enqueue({ type: "order.placed" }));
 * db.exec("ROLLBACK"); // drops the order and its event
 * assert.equal((await outbox.stats()).pending, 0);
 * await outbox.close();
 * assert.equal(db.isOpen, true); // the application's handle stays open
 * db.close();
 * ```
 */
export function nodeSqliteDriver(
  db: DatabaseSync,
  options: NodeSqliteDriverOptions = {},
): NodeSqliteDriver {
  const op = "make driver";
  if (!(db instanceof DatabaseSync) || !db.isOpen) {
    throw new TypeError(
      `Cannot ${op} as 'db' must be an open DatabaseSync: current value is ${
        db instanceof DatabaseSync ? "a closed DatabaseSync" : String(db)
      }`,
    );
  }
  checkOptions(op, options, ["closeDatabase"]);
  const closeDatabase = checkBoolean(
    op,
    "closeDatabase",
    options.closeDatabase,
    false,
  );
  return new NodeSqliteDriver(db, closeDatabase);
}

/**
 * A {@linkcode Driver} over one `node:sqlite` connection. Statements are
 * prepared once per SQL text and kept, the 256 most recently used, until
 * {@linkcode NodeSqliteDriver.close}. `StatementSync` has no `finalize()`:
 * one that leaves the cache is only let go, and Deno finalizes it when it is
 * garbage-collected (or when the connection closes).
 */
export class NodeSqliteDriver implements Driver, AsyncDisposable {
  #db: DatabaseSync | undefined;
  readonly #closeDatabase: boolean;
  readonly #statements = new StatementCache<StatementSync>(() => {});
  /** The database file's path and identity at open; see #checkNotMoved. */
  readonly #file: OpenedFile | undefined;

  /**
   * Wraps an open connection; {@linkcode openNodeSqlite} is the usual way in,
   * as it also sets the pragmas this driver relies on (`busy_timeout = 0`),
   * and {@linkcode nodeSqliteDriver} the way over the application's handle.
   *
   * @param db An open connection.
   * @param closeDatabase Whether {@linkcode NodeSqliteDriver.close} closes
   * `db` (the driver owns it).
   */
  constructor(db: DatabaseSync, closeDatabase = true) {
    this.#db = db;
    this.#closeDatabase = closeDatabase;
    this.#file = openedFile(db);
    if (this.#file !== undefined) {
      openedNodeSqlite(this.#file.dev, this.#file.ino);
    }
  }

  /** Whether a transaction is open on the connection (`sqlite3_get_autocommit()` is 0). */
  inTransaction(): boolean {
    return this.#db?.isTransaction ?? false;
  }

  /**
   * The connection's transaction as SQLite reports it (`isTransaction`):
   * `open` or `idle` (SQLite has no failed state: an error either leaves
   * the transaction open or rolls it back).
   */
  transactionStatus(): TransactionStatus {
    return this.inTransaction() ? "open" : "idle";
  }

  /** Runs one statement and returns its rows. */
  query(sql: string, params: readonly SqlValue[] = []): Promise<Row[]> {
    let statement: StatementSync | undefined;
    try {
      statement = this.#prepare("query", sql);
      const rows = statement.all(...bindable(params));
      return Promise.resolve(rows.map(toRow));
    } catch (error) {
      return Promise.reject(toSqliteError(error));
    } finally {
      if (statement !== undefined) this.#statements.leave();
    }
  }

  /** Runs one statement and reports its changes. */
  run(sql: string, params: readonly SqlValue[] = []): Promise<RunResult> {
    let statement: StatementSync | undefined;
    try {
      this.#checkNotMoved(sql);
      statement = this.#prepare("run", sql);
      const result = statement.run(...bindable(params));
      return Promise.resolve({
        changes: Number(result.changes),
        lastInsertRowid: exactInteger(result.lastInsertRowid),
      });
    } catch (error) {
      return Promise.reject(toSqliteError(error));
    } finally {
      if (statement !== undefined) this.#statements.leave();
    }
  }

  /** Runs a script of several statements. */
  exec(sql: string): Promise<void> {
    try {
      const db = this.#open();
      this.#checkNotMoved(sql);
      // Scripts usually change the schema; see #prepare.
      this.#statements.clear();
      db.exec(sql);
      return Promise.resolve();
    } catch (error) {
      return Promise.reject(toSqliteError(error));
    }
  }

  /**
   * Closes the connection, which finalizes every cached statement; over an
   * application's handle (closeDatabase false) only forgets the statements.
   */
  close(): Promise<void> {
    const db = this.#db;
    this.#db = undefined;
    this.#statements.clear();
    try {
      if (this.#closeDatabase) db?.close();
    } finally {
      // After the close: its locks are gone then (see node_sqlite_files.ts).
      if (db !== undefined && this.#file !== undefined) {
        closedNodeSqlite(this.#file.dev, this.#file.ino);
      }
    }
    return Promise.resolve();
  }

  /** Same as {@linkcode NodeSqliteDriver.close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /**
   * Before a COMMIT, fails with DatabaseMovedError (and rolls back) when the
   * path no longer names the file opened: native SQLite checks this before
   * a rollback journal only (os_unix.c's fileHasMoved), so in WAL mode a
   * renamed, deleted or replaced file would take commits nobody can read.
   * One stat per transaction.
   */
  #checkNotMoved(sql: string): void {
    const file = this.#file;
    if (file === undefined || !this.#db?.isTransaction) return;
    const keyword = transactionControl(sql);
    if (keyword !== "COMMIT" && keyword !== "END") return;
    if (sameFile(file)) return;
    this.#db.exec("ROLLBACK");
    throw new DatabaseMovedError(
      `Cannot commit to ${file.path} as it was moved`,
    );
  }

  #open(): DatabaseSync {
    if (this.#db === undefined) throw new Error("Database is closed");
    return this.#db;
  }

  /** The statement for `sql`, marked in use until the caller leaves it. */
  #prepare(method: "query" | "run", sql: string): StatementSync {
    const cached = this.#statements.get(sql);
    if (cached !== undefined) {
      this.#statements.enter(cached);
      return cached;
    }
    const statement = this.#open().prepare(sql);
    // prepare() compiles only the first statement; sourceSQL is its text.
    assertOneStatement(method, sql, () => statement.sourceSQL);
    // Without it, reading an integer past ±2^53 throws a RangeError.
    statement.setReadBigInts(true);
    // node:sqlite's all() counts result columns before the step that
    // re-prepares a statement after a schema change, so the first run of a
    // cached `SELECT *` would drop new columns; schema changes made through
    // this connection start a fresh cache instead.
    if (SCHEMA_CHANGE.test(sql)) this.#statements.clear();
    else this.#statements.add(sql, statement);
    this.#statements.enter(statement);
    return statement;
  }
}

const SCHEMA_CHANGE = /^\s*(?:CREATE|ALTER|DROP)\b/i;

interface OpenedFile {
  readonly path: string;
  readonly dev: number;
  readonly ino: number;
}

/** The main database file's path and identity, if it is a file we may stat. */
function openedFile(db: DatabaseSync): OpenedFile | undefined {
  try {
    const [main] = db.prepare("PRAGMA database_list").all();
    const path = main?.["file"];
    if (typeof path !== "string" || path === "") return undefined;
    const { dev, ino } = statSync(path);
    return { path, dev, ino };
  } catch {
    // No read permission for the path, or not a file: nothing to compare.
    return undefined;
  }
}

function sameFile(file: OpenedFile): boolean {
  const now = statSync(file.path, { throwIfNoEntry: false });
  return now !== undefined && now.dev === file.dev && now.ino === file.ino;
}

type NodeValue = null | number | bigint | string | Uint8Array;

/**
 * node:sqlite binds every `number` with `sqlite3_bind_double`; binding
 * integers as `bigint` stores them as `INTEGER`, as the WASM build does, so
 * `typeof(?)`, untyped columns and integer arithmetic agree across drivers.
 */
function bindable(params: readonly SqlValue[]): NodeValue[] {
  const values: NodeValue[] = new Array(params.length);
  for (let i = 0; i < params.length; i++) {
    const value = params[i];
    if (
      value !== null && typeof value !== "number" &&
      typeof value !== "bigint" && typeof value !== "string" &&
      !(value instanceof Uint8Array)
    ) {
      // node:sqlite would read an object as named parameters (binding NULL)
      // and other typed arrays as blobs; refuse what the WASM driver refuses.
      throw new TypeError(
        `Cannot bind parameter ${
          i + 1
        } as its type is not supported: current value is ${String(value)}`,
      );
    }
    if (
      typeof value === "bigint" && (value < INT64_MIN || value > INT64_MAX)
    ) {
      throw new RangeError(
        `Cannot bind parameter ${
          i + 1
        } as a bigint must fit in 64 bits: current value is ${value}`,
      );
    }
    values[i] = typeof value === "number" && Number.isSafeInteger(value)
      ? BigInt(value)
      : value;
  }
  return values;
}

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

function exactInteger(value: number | bigint): number | bigint {
  return typeof value === "bigint" && value >= MIN_SAFE && value <= MAX_SAFE
    ? Number(value)
    : value;
}

/**
 * Copies node:sqlite's null-prototype row into a plain object (so rows
 * compare equal to the WASM driver's), narrowing exact integers to `number`.
 */
function toRow(source: Record<string, unknown>): Row {
  const row: Row = {};
  for (const name in source) {
    row[name] = exactInteger(source[name] as number | bigint) as SqlValue;
  }
  return row;
}

/**
 * Result codes by `sqlite3_errstr()` text, for errors that Deno's
 * `DatabaseSync.exec()` reports without `errcode` (statements report it).
 * Only the primary code can be recovered this way.
 */
const CODES_BY_MESSAGE: ReadonlyMap<string, number> = new Map([
  ["database is locked", 5],
  ["database table is locked", 6],
  ["out of memory", 7],
  ["attempt to write a readonly database", 8],
  ["interrupted", 9],
  ["disk I/O error", 10],
  ["database disk image is malformed", 11],
  ["database or disk is full", 13],
  ["unable to open database file", 14],
  ["database schema has changed", 17],
  ["string or blob too big", 18],
  ["datatype mismatch", 20],
  ["file is not a database", 26],
]);

function codeFromMessage(message: string): number {
  return CODES_BY_MESSAGE.get(message) ??
    (/ constraint failed/.test(message) ? 19 : 1);
}

function toSqliteError(error: unknown): Error {
  if (!(error instanceof Error)) return new Error(String(error));
  if ((error as { code?: unknown }).code !== "ERR_SQLITE_ERROR") return error;
  // SQL with no statement (blank, or only comments) prepares to nothing and
  // fails when run with "not an error"; say what the WASM driver says.
  if (error.message === "not an error") {
    return sqliteError("Cannot prepare empty SQL.", 1, error);
  }
  const errcode = (error as { errcode?: unknown }).errcode;
  return sqliteError(
    error.message,
    typeof errcode === "number" ? errcode : codeFromMessage(error.message),
    error,
  );
}
