/**
 * The default driver on Deno: the official SQLite WASM build
 * (`npm:@sqlite.org/sqlite-wasm`, pinned to 3.54.1-build1) with database
 * files on disk through {@linkcode installDenoFileVfs}.
 *
 * Permissions: `--allow-ffi` for file databases (SQLite's locks and the
 * database's I/O go through libc; without it opening a file path fails,
 * naming the flag), `--allow-read` and `--allow-write` for the database's
 * directory (the journal lives next to the database). The package's
 * `sqlite3.wasm` is imported as a module, so it needs no permission;
 * `:memory:` needs none at all.
 *
 * Systems: Linux (open file description locks), macOS and the BSDs (classic
 * POSIX locks, as os_unix.c takes them); on Windows opening a file fails,
 * naming `openNodeSqlite` (`@leased/outbox/node-sqlite`), which runs there.
 * See docs/persistence-and-platforms.md.
 *
 * @module
 */
import type { Sqlite3Static } from "@sqlite.org/sqlite-wasm";
import sqlite3Wasm from "../drivers/sqlite3_wasm_module.js";
import {
  type BusyWaitHook,
  loadSqlite3 as loadSqlite3From,
  NEW_FILE_PAGE_SIZE,
  openDatabase,
  SqliteWasmDriver,
  sqliteWasmDriver,
  type SqliteWasmOptions,
} from "../drivers/sqlite_wasm.ts";
import {
  denoFileBusyWait,
  installDenoFileVfs,
  takeDenoFileVfsError,
  takeDenoFileVfsReason,
} from "./file_vfs.ts";
import { openBusyTimeoutMs, type Row, untilNotBusy } from "../driver.ts";
import { BusyError, SqliteError, sqliteError } from "../errors.ts";
import { checkJournalMode, checkOneOf, checkOptions } from "../validate.ts";
import { type EnqueueCounter, watchFileEnqueues } from "./enqueue_watch.ts";
import { JOURNAL_SIZE_LIMIT_BYTES } from "../wal.ts";

export {
  installDenoFileVfs,
  SqliteWasmDriver,
  sqliteWasmDriver,
  takeDenoFileVfsError,
};
export type { DenoFileVfsOptions } from "./file_vfs.ts";
export type {
  SqliteWasmDriverOptions,
  SqliteWasmModule,
  SqliteWasmOptions,
} from "../drivers/sqlite_wasm.ts";

/**
 * Loads and initialises the SQLite WASM module once per realm, from the
 * `sqlite3.wasm` imported as a module (no read permission needed). For the
 * project's own drivers and VFS, which reach into the module's C API, and for
 * {@linkcode sqliteWasmDriver} over an application's own `oo1.DB`.
 *
 * @ignore
 * @returns The module's namespace (`capi`, `oo1`, `wasm`, `vfs`).
 */
export function loadSqlite3(): Promise<Sqlite3Static> {
  return loadSqlite3From(sqlite3Wasm);
}

/**
 * How the database keeps its rollback journal (https://sqlite.org/pragma.html#pragma_journal_mode).
 *
 * - `"truncate"`: the journal file stays and is truncated at commit (the
 *   default for an existing file not in WAL mode, and for new files off
 *   x86-64).
 * - `"delete"`: the journal file is deleted at commit.
 * - `"persist"`: the journal file stays and its header is zeroed at commit.
 * - `"wal"`: write-ahead log (https://sqlite.org/wal.html), shared by
 *   connections in this and other processes, native SQLite's too: the VFS
 *   maps the `-shm` index into WASM memory and locks it as os_unix does.
 *   One sync per commit rather than the rollback journal's four. The
 *   default for new files (and files in WAL mode). x86-64 only: elsewhere
 *   asking for it fails with `TypeError`, and a file already in WAL mode
 *   fails to open (`SqliteError`) whatever mode is asked for. Not on a
 *   network file system, whose hosts share no memory (see `docs/wal.md`).
 */
export type JournalMode = "truncate" | "delete" | "persist" | "wal";

/** When SQLite waits for the disk (https://sqlite.org/pragma.html#pragma_synchronous). */
export type Synchronous = "off" | "normal" | "full" | "extra";

/** Options for {@linkcode openSqliteWasm} on Deno. */
export interface DenoSqliteWasmOptions extends SqliteWasmOptions {
  /**
   * The journal mode of file databases (ignored for in-memory ones). Unset,
   * a new file gets `"wal"` (on x86-64; `"truncate"` elsewhere, or on a
   * read-only connection), a file already in WAL mode stays in it, as its
   * other users expect (`openNodeSqlite` defaults to WAL), and any other
   * existing file keeps a rollback journal, `"truncate"`. Pass `"truncate"`
   * for a file on a network file system (see `docs/wal.md`).
   *
   * @default {"wal" for a new file or a file in WAL mode, else "truncate"}
   */
  readonly journalMode?: JournalMode;
  /**
   * The `synchronous` setting of file databases (ignored for in-memory ones).
   * `"full"` makes every commit durable before it returns.
   *
   * @default {"full"}
   */
  readonly synchronous?: Synchronous;
  /**
   * How long opening waits, in milliseconds, while another connection holds
   * a lock that keeps it from applying `journalMode` (e.g. a writer
   * committing); past it, opening throws {@linkcode BusyError}. Waiting
   * retries without blocking the event loop.
   *
   * @default {5000}
   */
  readonly busyTimeoutMs?: number;
}

const journalModes: readonly JournalMode[] = [
  "truncate",
  "delete",
  "persist",
  "wal",
];
const synchronousModes: readonly Synchronous[] = [
  "off",
  "normal",
  "full",
  "extra",
];

/**
 * Opens one connection through the SQLite WASM build, with file paths and
 * `file:` URLs on disk.
 *
 * Installs the Deno file VFS as the module's default VFS first, then applies
 * `journalMode` and `synchronous` to file databases. A new file gets
 * `page_size` 4096, native SQLite's default (the build's own is 8192);
 * `PRAGMA page_size` before the first write still chooses another. A new
 * file also gets `auto_vacuum = INCREMENTAL` (so `Outbox.maintain` can
 * shrink it in any journal mode), and file connections `journal_size_limit`
 * 8 MiB, so a WAL that grew behind a long reader shrinks once it is reset
 * (see `docs/wal.md`), and `cache_size` -2000 (2,000 KiB), native SQLite's
 * default (the build's own 16 MiB made every commit that split a page walk
 * the whole cache). `":memory:"` and
 * `"file:/name?vfs=memdb"` stay in memory. A database in WAL mode stays in
 * it unless `journalMode` asks for a rollback mode; switching needs the
 * file to itself for a moment, so while other connections use it, opening
 * throws {@linkcode BusyError} after `busyTimeoutMs` (x86-64 only, see
 * {@linkcode JournalMode}).
 *
 * @param path A file path, a `file:` URL or URI, or `":memory:"`.
 * @param options See {@linkcode DenoSqliteWasmOptions}.
 * @returns A driver for the connection.
 * @throws {TypeError} When `path` or an option has the wrong type or value,
 *   or `path` holds a NUL character (`"\0"`, or `%00` in a `file:` URL or
 *   URI), which would open the file named by the text before it.
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`,
 *   e.g. `journalMode` switches a file in or out of WAL mode that another
 *   connection has open.
 * @throws {SqliteError} When SQLite cannot open the file (`SQLITE_CANTOPEN`,
 *   e.g. without `--allow-ffi`, on Windows, where the message names
 *   `openNodeSqlite`, or while a process of the earlier flock-sidecar
 *   release holds the file); later, in any journal mode, writes to a file
 *   renamed, deleted or replaced under the connection fail with code 1032
 *   (`SQLITE_READONLY_DBMOVED`, `DatabaseMovedError`).
 *
 * @example A database file that outlives its connection
 * ```ts
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   await using db = await openSqliteWasm(`${dir}/app.db`);
 *   await db.exec("CREATE TABLE t(x INTEGER) STRICT; INSERT INTO t VALUES (7)");
 * }
 * await using again = await openSqliteWasm(new URL(`file://${dir}/app.db`));
 * assert.deepEqual(await again.query("SELECT x FROM t"), [{ x: 7 }]);
 * assert.deepEqual(await again.query("PRAGMA journal_mode"), [{ journal_mode: "wal" }]);
 * await again.close();
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function openSqliteWasm(
  path: string | URL,
  options: DenoSqliteWasmOptions = {},
): Promise<SqliteWasmDriver> {
  checkOptions("open database", options, [
    "vfs",
    "journalMode",
    "synchronous",
    "busyTimeoutMs",
  ]);
  const journalMode = checkJournalMode(
    "open database",
    options.journalMode,
    journalModes,
  );
  const synchronous = checkOneOf(
    "open database",
    "synchronous",
    options.synchronous,
    synchronousModes,
  ) ?? "full";
  const busyTimeoutMs = openBusyTimeoutMs(options.busyTimeoutMs);
  let name: string;
  if (path instanceof URL) {
    if (path.protocol !== "file:") {
      throw new TypeError(
        `Cannot open database as 'path' must be a file: URL: current value is ${path.href}`,
      );
    }
    // SQLite parses file: URIs itself (percent-decoding, ?mode=, ?vfs=).
    name = path.href;
  } else {
    name = path;
  }
  // SQLite reads the name up to its first NUL, and a URI's %00 ends the
  // text it decodes: either would open another file.
  if (
    typeof name === "string" &&
    (name.includes("\0") || /^file:/i.test(name) && /%00/.test(name))
  ) {
    throw new TypeError(
      `Cannot open database as 'path' must not contain a NUL character (SQLite would open the file named by the text before it): current value is ${
        JSON.stringify(name)
      }`,
    );
  }
  const sqlite3 = await loadSqlite3();
  installDenoFileVfs(sqlite3);
  takeDenoFileVfsError(sqlite3);
  // How this VFS's locks are waited for: not a public option.
  const busyWait: BusyWaitHook = (db, timeoutMs) =>
    denoFileBusyWait(sqlite3, db, timeoutMs);
  let driver: DenoFileDriver;
  try {
    driver = new DenoFileDriver(
      sqlite3,
      openDatabase(sqlite3, name, options),
      busyWait,
      true,
      (code) => takeDenoFileVfsReason(sqlite3, code),
    );
  } catch (error) {
    throw withVfsReason(sqlite3, error);
  }
  try {
    const [main] = await driver.query("PRAGMA database_list");
    if (main?.file !== "") {
      if (typeof main?.file === "string") driver.file = main.file;
      if (journalMode === "wal" && Deno.build.arch !== "x86_64") {
        throw new TypeError(
          `Cannot open database as 'journalMode' "wal" needs x86-64 here: the VFS shares the WAL index through memory whose writes only x86-64 keeps in order (this is ${Deno.build.arch}); use "truncate"`,
        );
      }
      // Before the first write, so only a new file takes it: the build's
      // 8192 journals and syncs twice the bytes per changed row of native
      // SQLite's 4096, the disk's block and the VFS's sector size.
      // Both read the file's header, so a writer committing refuses them.
      await untilNotBusy(
        busyTimeoutMs,
        async () => {
          await driver.exec(`PRAGMA page_size=${NEW_FILE_PAGE_SIZE}`);
          // Likewise auto_vacuum, before journal_mode=wal writes page 1.
          const [pages] = await driver.query("PRAGMA page_count");
          const isNew = pages?.["page_count"] === 0 &&
            await writable(driver.exec("PRAGMA auto_vacuum=INCREMENTAL"));
          await expectJournalMode(driver, name, journalMode, isNew);
        },
        (ms) => driver.busyWait!(ms),
      );
      await driver.exec(`PRAGMA synchronous=${synchronous}`);
      await driver.exec(
        `PRAGMA journal_size_limit=${JOURNAL_SIZE_LIMIT_BYTES}`,
      );
      await driver.exec(`PRAGMA cache_size=${CACHE_SIZE}`);
    }
  } catch (error) {
    await driver.close();
    // The first read of a WAL file opens its index, which can fail too.
    throw withVfsReason(sqlite3, error);
  }
  return driver;
}

/**
 * The driver {@linkcode openSqliteWasm} returns: a file database's idle
 * workers also wake when another process enqueues (see
 * `deno/enqueue_watch.ts`), not only at their polls.
 */
class DenoFileDriver extends SqliteWasmDriver {
  readonly #counter: EnqueueCounter = { seen: undefined };
  /** The database file's absolute path, read at open; none in memory. */
  file: string | undefined;

  /**
   * Calls `listener` after another connection, of this process or another,
   * commits new events to the database file, and once at the start when
   * events were enqueued since the last watch ended (by any connection,
   * this one included); nothing for `:memory:`. The outbox keeps this watch
   * only while a loop waits idle (`Outbox.watchWhileIdle`): it
   * also sees this process's own commits, each a few file-system events.
   *
   * @param listener Called with no arguments.
   * @returns Stops the calls.
   */
  watchEnqueues(listener: () => void): Promise<() => Promise<void>> {
    const none = () => Promise.resolve();
    const file = this.file;
    if (file === undefined) return Promise.resolve(none);
    return Promise.resolve(
      watchFileEnqueues(this, file, this.#counter, listener),
    );
  }
}

/**
 * SQLite says only "unable to open database file" or "disk I/O error" when
 * the VFS cannot open a file (the database, or a WAL file's `-shm`); the
 * VFS knows why.
 */
function withVfsReason(sqlite3: Sqlite3Static, error: unknown): unknown {
  const reason = takeDenoFileVfsError(sqlite3);
  if (
    error instanceof SqliteError &&
    (error.primaryCode === SQLITE_CANTOPEN ||
      error.primaryCode === SQLITE_IOERR) &&
    reason !== undefined &&
    // The driver adds the reason to a statement's error itself.
    !error.message.includes(reason)
  ) {
    return sqliteError(`${error.message}: ${reason}`, error.code, error);
  }
  return error;
}

const SQLITE_READONLY = 8;
const SQLITE_IOERR = 10;
const SQLITE_CANTOPEN = 14;
/**
 * A file connection's page cache, in KiB when negative: native SQLite's
 * default, 2,000 KiB (the build's own is 16 MiB). Every commit that
 * rebalanced a B-tree page walks the whole cache: SQLite keys a page it
 * renumbers at the pending-byte page (262,145 at 4096 bytes) for a moment,
 * and the transaction's end then drops every cached page above the file's
 * size by a walk of each hash bucket and the pages in it (pcache1's
 * truncate). A batch claim or acknowledgement of 256 rebalances at every
 * commit: with 16 MiB that walk took 0.15 ms of each commit on a 6 MB file,
 * a third of the WASM driver's BEGIN and COMMIT time.
 */
const CACHE_SIZE = -2000;

/**
 * Applies `requested`, or unset, keeps a file's WAL mode, gives a new file
 * (one this connection may write) WAL where the VFS shares its index safely
 * (x86-64), and any other file "truncate".
 */
async function expectJournalMode(
  driver: SqliteWasmDriver,
  name: string,
  requested: JournalMode | undefined,
  isNew: boolean,
): Promise<void> {
  // Reads the file's header: "wal" for a file in WAL mode.
  const [current] = await driver.query("PRAGMA journal_mode");
  const inWal = current?.journal_mode === "wal";
  const journalMode = requested ??
    (inWal || (isNew && Deno.build.arch === "x86_64") ? "wal" : "truncate");
  let row: Row | undefined;
  try {
    [row] = await driver.query(`PRAGMA journal_mode=${journalMode}`);
  } catch (error) {
    throw withLeavingWal(error, name, inWal, journalMode);
  }
  const actual = row?.journal_mode;
  if (actual !== journalMode) {
    throw new SqliteError(
      `Could not set journal_mode=${journalMode}: SQLite kept ${
        String(actual)
      }`,
      1,
    );
  }
}

/**
 * Whether a write went through: `false` when the connection is read-only
 * (`SQLITE_READONLY`), which leaves a new file as it is.
 */
async function writable(write: Promise<unknown>): Promise<boolean> {
  try {
    await write;
    return true;
  } catch (error) {
    if (error instanceof SqliteError && error.primaryCode === SQLITE_READONLY) {
      return false;
    }
    throw error;
  }
}

/** Says why, when leaving WAL waits for the file's other users. */
function withLeavingWal(
  error: unknown,
  name: string,
  inWal: boolean,
  journalMode: JournalMode,
): unknown {
  if (error instanceof BusyError && inWal && journalMode !== "wal") {
    return new BusyError(
      `Cannot open ${name} with journalMode "${journalMode}": the file is in WAL mode, and leaving WAL needs it alone, but another connection has it open (openNodeSqlite defaults to WAL); leave journalMode unset, or "wal", to share it`,
      error.code,
      { cause: error },
    );
  }
  return error;
}
