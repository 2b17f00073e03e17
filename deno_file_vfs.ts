/**
 * A SQLite VFS that gives the official SQLite WASM build real files under
 * Deno, over Deno's synchronous file API.
 *
 * The package's node build (which Deno loads) only has a transient in-memory
 * filesystem; {@linkcode installDenoFileVfs} registers this VFS so that file
 * paths and `file:` URIs open real files on disk.
 *
 * Locking follows SQLite's own five lock levels (https://sqlite.org/lockingv3.html)
 * and the order of `unixLock`/`unixUnlock` in SQLite's `os_unix.c`, but over
 * `flock(2)`-style whole-file locks (`Deno.FsFile.tryLockSync`), because Deno
 * has no byte-range locks. Three permanent zero-byte sidecar files next to the
 * database stand for SQLite's PENDING, RESERVED and SHARED lock bytes:
 * `<db>-pending.lock`, `<db>-reserved.lock` and `<db>-shared.lock`; a fourth,
 * `<db>-waiting.lock`, is the line of connections refused a lock (see
 * `lock_wait.ts`): a writer that keeps beginning transactions while someone
 * waits in line lets them in after a few, so nobody is starved. flock
 * locks belong to an open file description, so every connection opens its
 * own sidecar handles and two connections in one process exclude each other
 * exactly like two processes do; the kernel drops a dead process's locks, so
 * a crash never leaves a stale lock behind. Paths are canonicalised
 * (symlinks resolved) so two names of one file share the journal and the
 * locks; a database file with several hard links is refused, since its links
 * could not share them.
 *
 * What this does not do: interlock with native SQLite processes writing the
 * same file (they use POSIX byte-range locks, which do not see flock locks),
 * lock reliably on network filesystems, or provide shared memory (so WAL
 * works only with `PRAGMA locking_mode=EXCLUSIVE`, one connection at a time).
 *
 * @module
 */
// SQLite asks about absent files (`-wal`, the journal in DELETE mode) on
// every transaction; node:fs's existsSync answers without building an
// exception, about ten times faster than a failing Deno.statSync.
import { existsSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import type { loadSqlite3 } from "./sqlite_wasm.ts";
import type { Sqlite3Static, WasmPointer } from "@sqlite.org/sqlite-wasm";
import { WaitLine } from "./lock_wait.ts";

/** Options for {@linkcode installDenoFileVfs}. */
export interface DenoFileVfsOptions {
  /**
   * The name the VFS is registered under (`?vfs=` in URIs, `vfs` in oo1).
   *
   * @default {"deno-file"}
   */
  readonly name?: string;
  /**
   * Whether the VFS becomes SQLite's default, so plain paths use it.
   *
   * @default {true}
   */
  readonly asDefault?: boolean;
}

/**
 * Registers the Deno file VFS with a SQLite WASM module, once per module and
 * name (later calls return the name without registering again).
 *
 * Needs `--allow-read` and `--allow-write` for the database's directory: the
 * VFS creates the journal and the three lock sidecar files there.
 *
 * @param sqlite3 The initialised module (from `loadSqlite3()`).
 * @param options See {@linkcode DenoFileVfsOptions}.
 * @returns The name the VFS is registered under.
 * @throws {Error} When SQLite refuses the registration.
 *
 * @example Open a database file through the VFS
 * ```ts
 * import { installDenoFileVfs } from "@leased/outbox/sqlite-wasm";
 * import sqlite3InitModule from "@sqlite.org/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const sqlite3 = await sqlite3InitModule();
 * const vfs = installDenoFileVfs(sqlite3, { name: "deno-file-example", asDefault: false });
 * const dir = Deno.makeTempDirSync();
 * const db = new sqlite3.oo1.DB({ filename: `${dir}/example.db`, flags: "c", vfs });
 * db.exec("CREATE TABLE t(x); INSERT INTO t VALUES (42)");
 * db.close();
 * assert.equal(Deno.statSync(`${dir}/example.db`).size > 0, true);
 * Deno.removeSync(dir, { recursive: true });
 * ```
 */
export function installDenoFileVfs(
  sqlite3: Awaited<ReturnType<typeof loadSqlite3>>,
  options: DenoFileVfsOptions = {},
): string {
  const name = options.name ?? "deno-file";
  if (typeof name !== "string" || name.length === 0) {
    throw new TypeError(
      `Cannot install the VFS as 'name' must be a non-empty string: current value is ${
        String(name)
      }`,
    );
  }
  const asDefault = options.asDefault ?? true;
  const capi = sqlite3.capi;
  if (capi.sqlite3_vfs_find(name)) {
    if (asDefault) capi.sqlite3_vfs_register(capi.sqlite3_vfs_find(name), 1);
    return name;
  }
  const { io, vfs, takeLastError, busyWait } = createVfs(sqlite3);
  lastErrors.set(sqlite3, takeLastError);
  busyWaits.set(sqlite3, busyWait);
  const ioStruct = new capi.sqlite3_io_methods();
  // The typings name it `iVersion`; the struct binder's member is `$iVersion`.
  (ioStruct as unknown as { $iVersion: number }).$iVersion = 1;
  const vfsStruct = new capi.sqlite3_vfs();
  vfsStruct.$iVersion = 2;
  // The typings put structInfo on instances; the binder puts it on the class.
  vfsStruct.$szOsFile = (capi.sqlite3_file as unknown as {
    structInfo: { sizeof: number };
  }).structInfo.sizeof;
  vfsStruct.$mxPathname = MAX_PATHNAME;
  ioMethodsPointer.set(sqlite3, ioStruct.pointer);
  sqlite3.vfs.installVfs({
    io: { struct: ioStruct, methods: io as never },
    vfs: { struct: vfsStruct, methods: vfs as never, name, asDefault },
  });
  return name;
}

/**
 * Returns and clears the message of the Deno file VFS's last failure in this
 * module. SQLite reports a failed open only as "unable to open database
 * file"; this says why (a missing directory, a missing `--allow-write`, ...).
 *
 * @param sqlite3 The module the VFS was installed in.
 * @returns The message, or `undefined` when nothing failed since the last call.
 *
 * @example Why an open failed
 * ```ts
 * import { installDenoFileVfs, takeDenoFileVfsError } from "@leased/outbox/sqlite-wasm";
 * import sqlite3InitModule from "@sqlite.org/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * const sqlite3 = await sqlite3InitModule();
 * const vfs = installDenoFileVfs(sqlite3, { name: "deno-file-errors", asDefault: false });
 * assert.throws(() => new sqlite3.oo1.DB({ filename: "/no/such/dir/x.db", flags: "c", vfs }));
 * assert.match(takeDenoFileVfsError(sqlite3) ?? "", /No such file or directory/);
 * assert.equal(takeDenoFileVfsError(sqlite3), undefined);
 * ```
 */
export function takeDenoFileVfsError(
  sqlite3: Awaited<ReturnType<typeof loadSqlite3>>,
): string | undefined {
  return lastErrors.get(sqlite3)?.();
}

const lastErrors = new WeakMap<Sqlite3Static, () => string | undefined>();

/**
 * Waits after the connection `db` got `SQLITE_BUSY` until the lock that
 * refused it may be free, or `timeoutMs` milliseconds at most: in line with
 * the other waiting connections of its database (see `lock_wait.ts`), or on
 * a timer when no lock can be watched. `SQLITE_FCNTL_FILE_POINTER` finds
 * the connection's main database file.
 *
 * @ignore
 * @param sqlite3 The module the VFS was installed in.
 * @param db The connection's `sqlite3*`.
 * @param timeoutMs The longest wait, in milliseconds.
 */
export function denoFileBusyWait(
  sqlite3: Awaited<ReturnType<typeof loadSqlite3>>,
  db: number,
  timeoutMs: number,
): Promise<void> {
  const busyWait = busyWaits.get(sqlite3);
  if (busyWait === undefined) return pause(timeoutMs);
  const { wasm, capi } = sqlite3;
  const stack = wasm.pstack.pointer;
  try {
    const slot = wasm.pstack.allocPtr() as WasmPointer;
    const rc = capi.sqlite3_file_control(
      db as unknown as WasmPointer,
      "main",
      capi.SQLITE_FCNTL_FILE_POINTER,
      slot,
    );
    return rc === OK
      ? busyWait(Number(wasm.peekPtr(slot)), timeoutMs)
      : pause(timeoutMs);
  } finally {
    wasm.pstack.restore(stack);
  }
}

const busyWaits = new WeakMap<
  Sqlite3Static,
  (pFile: number, timeoutMs: number) => Promise<void>
>();

/** Waits `PAUSE_MS`, or `timeoutMs` if that is shorter. */
function pause(timeoutMs: number): Promise<void> {
  return new Promise((resolve) =>
    setTimeout(resolve, Math.min(timeoutMs, PAUSE_MS))
  );
}

const MAX_PATHNAME = 1024;
const SECTOR_SIZE = 4096;

// SQLite's lock levels (sqlite3.h SQLITE_LOCK_*).
const NONE = 0;
const SHARED = 1;
const RESERVED = 2;
const PENDING = 3;
const EXCLUSIVE = 4;

// Result codes, spelled out so the hot paths do not look them up.
const OK = 0;
const BUSY = 5;
const IOERR = 10;
const FULL = 13;
const CANTOPEN = 14;
const NOTFOUND = 12;
const IOERR_READ = IOERR | (1 << 8);
const IOERR_SHORT_READ = IOERR | (2 << 8);
const IOERR_WRITE = IOERR | (3 << 8);
const IOERR_FSYNC = IOERR | (4 << 8);
const IOERR_DIR_FSYNC = IOERR | (5 << 8);
const IOERR_TRUNCATE = IOERR | (6 << 8);
const IOERR_FSTAT = IOERR | (7 << 8);
const IOERR_UNLOCK = IOERR | (8 << 8);
const IOERR_RDLOCK = IOERR | (9 << 8);
const IOERR_DELETE = IOERR | (10 << 8);
const IOERR_ACCESS = IOERR | (13 << 8);
const IOERR_CHECKRESERVEDLOCK = IOERR | (14 << 8);
const IOERR_LOCK = IOERR | (15 << 8);
const IOERR_CLOSE = IOERR | (16 << 8);
const IOERR_DELETE_NOENT = IOERR | (23 << 8);

// xOpen flags (sqlite3.h SQLITE_OPEN_*).
const OPEN_READONLY = 0x1;
const OPEN_READWRITE = 0x2;
const OPEN_CREATE = 0x4;
const OPEN_DELETEONCLOSE = 0x8;
const OPEN_EXCLUSIVE = 0x10;
const OPEN_MAIN_DB = 0x100;
const OPEN_MAIN_JOURNAL = 0x800;
const OPEN_SUPER_JOURNAL = 0x4000;
const OPEN_WAL = 0x80000;

const ACCESS_EXISTS = 0;
const IOCAP_POWERSAFE_OVERWRITE = 0x1000;
// The longest run of contiguous writes combined into one writeSync; larger
// than a journal record or WAL frame at SQLite's largest page (64 KiB).
const RUN_BYTES = 128 * 1024;
// Readers and writers briefly hold sidecar locks while probing or taking
// SHARED; a few immediate retries absorb those windows instead of reporting a
// spurious SQLITE_BUSY to the writer.
const LOCK_ATTEMPTS = 3;
// How long taking RESERVED keeps trying while only shared holders (probes,
// the first in line's worker) are in the way.
const RESERVED_SPIN_MS = 0.5;
// How many transactions in a row a writer may begin while others wait in
// line for the lock, before it gets in line behind them.
const TURN_TRANSACTIONS = 16;
// How long a writer does not yield again after a yield nobody took.
const STUCK_LINE_MS = 1_000;
// How long a writer keeps trying to get readers out of its way (PENDING,
// then EXCLUSIVE) before it reports SQLITE_BUSY.
const READERS_SPIN_MS = 2;

// The sidecars a refused connection can watch, as its WaitLine indexes them.
const RESERVED_FILE = 0;
const SHARED_FILE = 1;

/**
 * What a connection refused a lock waits for before it tries again: the
 * sidecar whose exclusive holder refused it, and whether it yielded its
 * turn; `undefined` when nothing can be watched and it pauses.
 */
type Refusal =
  | { readonly watch: number; readonly yielded?: true }
  | undefined;

// The pause when readers are in a writer's way (they hold their locks for
// one statement), or the lock that refused is unknown (not this VFS's
// database, or an error outside the lock calls).
const PAUSE_MS = 1;

const ioMethodsPointer = new WeakMap<Sqlite3Static, WasmPointer>();
const encoder = new TextEncoder();

/** A VFS failure that carries the SQLite result code to report. */
class VfsError extends Error {
  readonly code: number;
  constructor(message: string, code: number, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
  }
}

/** The operations SQLite calls on one open file. */
interface OpenFile {
  readonly path: string;
  lockLevel(): number;
  read(into: Uint8Array, offset: number): number;
  write(from: Uint8Array, offset: number): void;
  truncate(size: number): void;
  sync(): void;
  size(): number;
  lock(level: number): number;
  unlock(level: number): number;
  checkReserved(): boolean;
  close(): void;
}

/**
 * SQLite's lock levels over three sidecar files, one connection's view.
 *
 * The order mirrors os_unix.c: a reader takes PENDING shared for a moment
 * before SHARED (so it cannot slip in while a writer waits for readers to
 * drain); a writer keeps SHARED while it takes RESERVED (no upgrade gap); the
 * SHARED→EXCLUSIVE conversion happens only while holding PENDING, so nobody
 * else can take SHARED or EXCLUSIVE in the moment flock's non-atomic
 * conversion leaves the SHARED sidecar unlocked.
 */
class LockSet {
  #level = NONE;
  /** What to wait for after the last refused lock. */
  #refusal: Refusal;
  /** Transactions this connection began in a row while others waited. */
  #turns = 0;
  /** Until when (performance.now()) this connection does not yield. */
  #yieldAgainAt = 0;
  /** Whether a lock was refused since SHARED was last granted. */
  #refused = false;
  #pendingHeld = false;
  #reservedHeld = false;
  readonly #pending: Deno.FsFile;
  readonly #reserved: Deno.FsFile;
  readonly #shared: Deno.FsFile;
  readonly #waiting: Deno.FsFile;
  readonly #paths: readonly string[];
  /** This connection's place in the waiting line, once it had to wait. */
  #line: WaitLine | undefined;
  #inLine = false;

  constructor(databasePath: string) {
    this.#paths = ["pending", "reserved", "shared", "waiting"].map((kind) =>
      `${databasePath}-${kind}.lock`
    );
    const opened: Deno.FsFile[] = [];
    try {
      for (const path of this.#paths) opened.push(openSidecar(path));
    } catch (error) {
      for (const file of opened) file.close();
      throw error;
    }
    [this.#pending, this.#reserved, this.#shared, this.#waiting] = opened as [
      Deno.FsFile,
      Deno.FsFile,
      Deno.FsFile,
      Deno.FsFile,
    ];
  }

  get level(): number {
    return this.#level;
  }

  /**
   * Waits until the lock that refused this connection last may be free (see
   * {@linkcode WaitLine}), or `timeoutMs` at most.
   */
  async wait(timeoutMs: number): Promise<void> {
    const refusal = this.#refusal;
    if (refusal === undefined) return await pause(timeoutMs);
    const [, reserved, shared, waiting] = this.#paths as [
      string,
      string,
      string,
      string,
    ];
    // Indexed by RESERVED_FILE and SHARED_FILE.
    this.#line ??= new WaitLine(waiting, [reserved, shared]);
    this.#inLine = true;
    const reported = await this.#line.wait(refusal.watch, timeoutMs);
    // Nobody took the turn this connection yielded: whoever is first in
    // line is stopped or gone (its worker still holds the line until the
    // lock it watches is let go). Yielding to it again would only cost
    // every turn a wait.
    if (refusal.yielded && !reported) {
      this.#yieldAgainAt = performance.now() + STUCK_LINE_MS;
    }
  }

  lock(target: number): number {
    if (this.#level >= target) return OK;
    if (target === SHARED) {
      // A writer holds PENDING from its commit's start to its end, and
      // RESERVED from its transaction's start to the same end: watching
      // RESERVED wakes this connection once the whole transaction is over
      // (not between its commit and the same writer's next transaction).
      // Only a connection rolling back a hot journal holds PENDING without
      // RESERVED, and then the wait ends at once and the retry comes back.
      if (!this.#pending.tryLockSync(false)) {
        return this.#refuse({ watch: RESERVED_FILE });
      }
      const shared = this.#shared.tryLockSync(false);
      this.#pending.unlockSync();
      if (!shared) return this.#refuse({ watch: SHARED_FILE });
      this.#level = SHARED;
      this.#refused = false;
      return OK;
    }
    if (target === RESERVED) {
      // SQLite's lock has no queue: a writer that starts its next
      // transaction the moment it commits wins every race against writers
      // that must first be woken. So while someone waits in line, a writer
      // takes a few transactions in a row (a handoff costs about as much as
      // a transaction) and then gets in line behind them.
      const othersWaiting = this.#line?.isFirst !== true &&
        this.#othersWaiting();
      if (
        othersWaiting && this.#turns >= TURN_TRANSACTIONS &&
        performance.now() >= this.#yieldAgainAt
      ) {
        this.#turns = 0;
        return this.#refuse({ watch: RESERVED_FILE, yielded: true });
      }
      if (!this.#takeReserved()) {
        return this.#refuse({ watch: RESERVED_FILE });
      }
      this.#turns = othersWaiting ? this.#turns + 1 : 0;
      this.#leaveLine();
      this.#reservedHeld = true;
      this.#level = RESERVED;
      return OK;
    }
    // What stands in the way now is readers: the PENDING sidecar (readers
    // hold it shared while they take SHARED) or the SHARED one, which this
    // connection holds too, so neither can be watched. A reader holds SHARED
    // for one statement, often a writer's failed BEGIN IMMEDIATE (tens of
    // µs), and no new reader gets in once PENDING is held: trying again for
    // a moment is far cheaper than a pause on a timer, which would keep
    // every other connection out for milliseconds.
    const until = performance.now() + READERS_SPIN_MS;
    for (;;) {
      if (!this.#pendingHeld && this.#pending.tryLockSync(true)) {
        this.#pendingHeld = true;
        this.#level = PENDING;
      }
      if (this.#pendingHeld) {
        // flock converts SHARED to EXCLUSIVE by dropping the old lock first,
        // and a failed conversion leaves none (flock(2), Linux's
        // flock_lock_inode), so on failure SHARED is taken again.
        if (this.#shared.tryLockSync(true)) {
          this.#level = EXCLUSIVE;
          return OK;
        }
        if (!tryLock(this.#shared, false)) {
          throw new VfsError(
            "Could not re-take the SHARED lock after a failed EXCLUSIVE attempt",
            IOERR_LOCK,
          );
        }
      }
      if (performance.now() >= until) return this.#refuse(undefined);
    }
  }

  /**
   * Takes RESERVED (the sidecar exclusively). Besides a writer holding it,
   * probes (xCheckReservedLock) and the first in line's worker hold it
   * shared for a few µs, and a worker does so right when a writer lets go,
   * just as that writer may begin again: while only such shared holders are
   * in the way, this tries again for a moment rather than refuse.
   */
  #takeReserved(): boolean {
    const until = performance.now() + RESERVED_SPIN_MS;
    for (;;) {
      if (tryLock(this.#reserved, true)) return true;
      // A shared lock is refused only while a writer holds RESERVED.
      if (!this.#reserved.tryLockSync(false)) return false;
      this.#reserved.unlockSync();
      if (performance.now() >= until) return false;
    }
  }

  #refuse(refusal: Refusal): number {
    this.#refusal = refusal;
    this.#refused = true;
    return BUSY;
  }

  /** Leaves the line once this connection no longer waits for a lock. */
  #leaveLine(): void {
    if (!this.#inLine) return;
    this.#inLine = false;
    this.#line!.leave();
  }

  unlock(target: number): number {
    if (this.#level <= target) return OK;
    if (target === SHARED) {
      if (this.#level === EXCLUSIVE && !tryLock(this.#shared, false)) {
        throw new VfsError(
          "Could not downgrade the EXCLUSIVE lock to SHARED",
          IOERR_RDLOCK,
        );
      }
    } else {
      this.#shared.unlockSync();
    }
    // PENDING before RESERVED (os_unix lets both go in one call): a writer
    // waiting in line watches RESERVED and should find PENDING free.
    if (this.#pendingHeld) {
      this.#pending.unlockSync();
      this.#pendingHeld = false;
    }
    if (this.#reservedHeld) {
      this.#reserved.unlockSync();
      this.#reservedHeld = false;
    }
    this.#level = target;
    // A reader that waited got its read done; a writer refused RESERVED
    // comes back and stays in line.
    if (target === NONE && !this.#refused) this.#leaveLine();
    return OK;
  }

  /**
   * Whether some connection holds RESERVED or more. A probe with a shared
   * lock fails only against a real RESERVED holder (an exclusive lock), so
   * this never reports a reservation that is not there: after a crash the
   * kernel has dropped the dead writer's lock and the hot journal is seen.
   */
  checkReserved(): boolean {
    if (this.#level > SHARED) return true;
    if (!this.#reserved.tryLockSync(false)) return true;
    this.#reserved.unlockSync();
    return false;
  }

  close(): void {
    this.#line?.close();
    this.#pending.close();
    this.#reserved.close();
    this.#shared.close();
    this.#waiting.close();
    this.#level = NONE;
  }

  /** Whether another connection is first in line (holds the waiting sidecar). */
  #othersWaiting(): boolean {
    if (!this.#waiting.tryLockSync(false)) return true;
    this.#waiting.unlockSync();
    return false;
  }
}

function tryLock(file: Deno.FsFile, exclusive: boolean): boolean {
  for (let attempt = 0; attempt < LOCK_ATTEMPTS; attempt++) {
    if (file.tryLockSync(exclusive)) return true;
  }
  return false;
}

function openSidecar(path: string): Deno.FsFile {
  try {
    return Deno.openSync(path, { read: true, write: true, create: true });
  } catch (error) {
    // A read-only database (a read-only directory, or no --allow-write)
    // still locks through sidecars someone created earlier.
    if (
      error instanceof Deno.errors.PermissionDenied ||
      error instanceof Deno.errors.NotCapable
    ) {
      return Deno.openSync(path, { read: true });
    }
    throw error;
  }
}

/** A file on disk, with the lock set when it is a main database. */
class DiskFile implements OpenFile {
  readonly path: string;
  readonly #file: Deno.FsFile;
  readonly #locks: LockSet | undefined;
  readonly #deleteOnClose: boolean;
  #syncDirectory: boolean;
  // Where the OS file offset is, so sequential I/O skips the seek; -1 =
  // unknown. A file just opened (never with O_APPEND) is at 0.
  #position = 0;
  // The error of buffered writes that never reached the file, though each
  // xWrite of them returned OK (see `run` in createVfs).
  #lostWrite: unknown = undefined;

  constructor(
    path: string,
    file: Deno.FsFile,
    locks: LockSet | undefined,
    deleteOnClose: boolean,
    syncDirectory: boolean,
  ) {
    this.path = path;
    this.#file = file;
    this.#locks = locks;
    this.#deleteOnClose = deleteOnClose;
    this.#syncDirectory = syncDirectory;
  }

  lockLevel(): number {
    return this.#locks?.level ?? NONE;
  }

  /** Waits as {@linkcode LockSet.wait} does (a pause when unlocked). */
  busyWait(timeoutMs: number): Promise<void> {
    return this.#locks?.wait(timeoutMs) ?? pause(timeoutMs);
  }

  /**
   * Records that buffered writes never reached the file. Its next read,
   * write, truncate, sync or size fails with `error`, so SQLite hears of the
   * loss before it relies on those bytes. A journal or WAL stays failed until
   * closed: a rollback that read it back without the lost records would keep
   * their pages' changes in the cache. A main database fails once, as if the
   * write itself had failed; its rollback rewrites the pages from the journal.
   */
  loseWrite(error: unknown): void {
    this.#lostWrite = error;
  }

  #checkLostWrite(): void {
    if (this.#lostWrite === undefined) return;
    const error = this.#lostWrite;
    if (this.#locks !== undefined) this.#lostWrite = undefined;
    throw error;
  }

  read(into: Uint8Array, offset: number): number {
    this.#checkLostWrite();
    this.#seek(offset);
    let done = 0;
    try {
      while (done < into.length) {
        const n = this.#file.readSync(into.subarray(done));
        if (n === null || n === 0) break;
        done += n;
      }
    } catch (error) {
      this.#position = -1;
      throw error;
    }
    this.#position = offset + done;
    return done;
  }

  write(from: Uint8Array, offset: number): void {
    this.#checkLostWrite();
    this.#seek(offset);
    let done = 0;
    try {
      while (done < from.length) {
        done += this.#file.writeSync(from.subarray(done));
      }
    } catch (error) {
      this.#position = -1;
      throw error;
    }
    this.#position = offset + done;
  }

  truncate(size: number): void {
    this.#checkLostWrite();
    this.#file.truncateSync(size);
  }

  sync(): void {
    this.#checkLostWrite();
    // fdatasync also flushes the file size, which is all SQLite needs; on
    // Linux os_unix uses it for every sync flag.
    this.#file.syncDataSync();
    if (this.#syncDirectory) {
      // A journal created by this open survives power loss only once its
      // directory entry is on disk (os_unix's UNIXFILE_DIRSYNC).
      syncDirectory(dirname(this.path));
      this.#syncDirectory = false;
    }
  }

  size(): number {
    this.#checkLostWrite();
    // Seeking to the end reports the size for a fraction of fstat's cost
    // (no FileInfo object), and leaves the offset where it says.
    this.#position = -1;
    this.#position = this.#file.seekSync(0, Deno.SeekMode.End);
    return this.#position;
  }

  lock(level: number): number {
    return this.#locks?.lock(level) ?? OK;
  }

  unlock(level: number): number {
    return this.#locks?.unlock(level) ?? OK;
  }

  checkReserved(): boolean {
    return this.#locks?.checkReserved() ?? false;
  }

  close(): void {
    try {
      this.#locks?.unlock(NONE);
    } finally {
      this.#locks?.close();
      this.#file.close();
      if (this.#deleteOnClose) removeIfPresent(this.path);
    }
  }

  #seek(offset: number): void {
    if (this.#position === offset) return;
    this.#position = -1;
    this.#file.seekSync(offset, Deno.SeekMode.Start);
    this.#position = offset;
  }
}

/**
 * A nameless temporary file (sorter spill, temp database) kept in memory:
 * nothing else can see it, so it needs neither locks nor a disk.
 */
class MemoryFile implements OpenFile {
  readonly path = "";
  #bytes = new Uint8Array(0);
  #size = 0;

  lockLevel(): number {
    return NONE;
  }

  read(into: Uint8Array, offset: number): number {
    const available = Math.max(0, Math.min(into.length, this.#size - offset));
    into.set(this.#bytes.subarray(offset, offset + available));
    return available;
  }

  write(from: Uint8Array, offset: number): void {
    const end = offset + from.length;
    if (end > this.#bytes.length) {
      const grown = new Uint8Array(Math.max(end, this.#bytes.length * 2));
      grown.set(this.#bytes.subarray(0, this.#size));
      this.#bytes = grown;
    }
    this.#bytes.set(from, offset);
    this.#size = Math.max(this.#size, end);
  }

  truncate(size: number): void {
    // Like ftruncate: shrinking drops bytes, growing adds zeros.
    if (size < this.#size) this.#bytes.fill(0, size, this.#size);
    else if (size > this.#size) this.write(new Uint8Array(0), size);
    this.#size = size;
  }

  sync(): void {}

  size(): number {
    return this.#size;
  }

  lock(): number {
    return OK;
  }

  unlock(): number {
    return OK;
  }

  checkReserved(): boolean {
    return false;
  }

  close(): void {
    this.#bytes = new Uint8Array(0);
    this.#size = 0;
  }
}

function syncDirectory(path: string): void {
  let directory: Deno.FsFile;
  try {
    directory = Deno.openSync(path, { read: true });
  } catch {
    // As in os_unix: a directory that cannot be opened cannot be synced,
    // which is not the database's failure.
    return;
  }
  try {
    directory.syncSync();
  } finally {
    directory.close();
  }
}

function removeIfPresent(path: string): void {
  try {
    Deno.removeSync(path);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
}

/**
 * The absolute path with symlinks resolved, so that two names of one file
 * share one journal and one set of lock sidecars.
 */
function canonicalPath(name: string): string {
  const absolute = resolve(name);
  try {
    return Deno.realPathSync(absolute);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  try {
    return join(Deno.realPathSync(dirname(absolute)), basename(absolute));
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return absolute;
    throw error;
  }
}

function errorCode(error: unknown, fallback: number): number {
  if (error instanceof VfsError) return error.code;
  const code = (error as { code?: unknown } | null)?.code;
  if (code === "ENOSPC" || code === "EDQUOT") return FULL;
  return fallback;
}

function createVfs(sqlite3: Sqlite3Static) {
  const wasm = sqlite3.wasm;
  const files = new Map<number, OpenFile>();
  // Whether each journal, WAL or probed path was on disk when this VFS last
  // looked: SQLite probes the same few paths on every transaction, and
  // guessing right saves a system call (a wrong guess costs one more).
  const seen = new Map<string, boolean>();
  let lastError: { message: string; code: number } | undefined;

  // Exceptions must never cross into WASM: every method reports a result
  // code and keeps the message for xGetLastError.
  const fail = (error: unknown, fallback: number): number => {
    const code = errorCode(error, fallback);
    lastError = {
      message: error instanceof Error ? error.message : String(error),
      code,
    };
    return code;
  };
  const fileOf = (pFile: WasmPointer): OpenFile => {
    const file = files.get(Number(pFile));
    if (file === undefined) {
      throw new VfsError(`No open file at pointer ${pFile}`, IOERR);
    }
    return file;
  };
  // Heap views detach when memory grows, so take a fresh one on every call.
  const heap = (pointer: WasmPointer, length: number): Uint8Array =>
    wasm.heap8u().subarray(Number(pointer), Number(pointer) + length);

  // SQLite writes a journal record as three pieces (page number, page,
  // checksum) and a WAL frame as two, each at the offset where the last one
  // ended. A run of such writes to one file goes to the kernel as one
  // writeSync; every other call that touches files writes the run out first.
  // So the kernel sees the same writes in the same order, only fewer and
  // larger, and a crash can only cut the sequence at a point where the
  // unbuffered VFS could also have been cut.
  const run = {
    file: undefined as DiskFile | undefined,
    offset: 0,
    length: 0,
    bytes: new Uint8Array(RUN_BYTES),
  };
  const flush = (): void => {
    const file = run.file;
    if (file === undefined) return;
    run.file = undefined;
    try {
      file.write(run.bytes.subarray(0, run.length), run.offset);
    } catch (error) {
      file.loseWrite(error);
      throw error;
    }
  };
  // For the first line of every method that touches files.
  const flushed = (): number => {
    try {
      flush();
      return OK;
    } catch (error) {
      return fail(error, IOERR_WRITE);
    }
  };

  // Opens (creating if need be) a journal or WAL file and tells whether
  // this call created it, which decides the directory fsync: in one system
  // call when the file is where it was last time (there in TRUNCATE and
  // PERSIST mode, deleted in DELETE mode), in two when that guess is wrong.
  const openJournal = (path: string): [Deno.FsFile, boolean] => {
    for (let attempt = 0;; attempt++) {
      if (seen.get(path) !== false) {
        try {
          const file = Deno.openSync(path, { read: true, write: true });
          seen.set(path, true);
          return [file, false];
        } catch (error) {
          if (!(error instanceof Deno.errors.NotFound) || attempt > 2) {
            throw error;
          }
        }
      }
      try {
        const file = Deno.openSync(path, {
          read: true,
          write: true,
          createNew: true,
        });
        seen.set(path, true);
        return [file, true];
      } catch (error) {
        if (!(error instanceof Deno.errors.AlreadyExists) || attempt > 2) {
          throw error;
        }
      }
      // Created or deleted by another connection in between: look again.
      seen.set(path, true);
    }
  };

  const io = {
    xClose(pFile: WasmPointer): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      const file = files.get(Number(pFile));
      files.delete(Number(pFile));
      try {
        file?.close();
        return OK;
      } catch (error) {
        return fail(error, IOERR_CLOSE);
      }
    },
    xRead(
      pFile: WasmPointer,
      pDest: WasmPointer,
      amount: number,
      offset: bigint,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const into = heap(pDest, amount);
        const done = fileOf(pFile).read(into, Number(offset));
        if (done < amount) {
          // SQLite requires the unread tail zero-filled on a short read.
          into.fill(0, done);
          return IOERR_SHORT_READ;
        }
        return OK;
      } catch (error) {
        return fail(error, IOERR_READ);
      }
    },
    xWrite(
      pFile: WasmPointer,
      pSource: WasmPointer,
      amount: number,
      offset: bigint,
    ): number {
      try {
        const file = fileOf(pFile);
        const at = Number(offset);
        const from = heap(pSource, amount);
        if (
          run.file === file && at === run.offset + run.length &&
          run.length + amount <= RUN_BYTES
        ) {
          run.bytes.set(from, run.length);
          run.length += amount;
          return OK;
        }
        flush();
        if (file instanceof DiskFile && amount <= RUN_BYTES) {
          run.bytes.set(from, 0);
          run.file = file;
          run.offset = at;
          run.length = amount;
        } else {
          file.write(from, at);
        }
        return OK;
      } catch (error) {
        return fail(error, IOERR_WRITE);
      }
    },
    xTruncate(pFile: WasmPointer, size: bigint): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        fileOf(pFile).truncate(Number(size));
        return OK;
      } catch (error) {
        return fail(error, IOERR_TRUNCATE);
      }
    },
    xSync(pFile: WasmPointer): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        fileOf(pFile).sync();
        return OK;
      } catch (error) {
        return fail(error, IOERR_FSYNC);
      }
    },
    xFileSize(pFile: WasmPointer, pSize: WasmPointer): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        wasm.poke64(pSize, BigInt(fileOf(pFile).size()));
        return OK;
      } catch (error) {
        return fail(error, IOERR_FSTAT);
      }
    },
    xLock(pFile: WasmPointer, level: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        return fileOf(pFile).lock(level);
      } catch (error) {
        return fail(error, IOERR_LOCK);
      }
    },
    xUnlock(pFile: WasmPointer, level: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        return fileOf(pFile).unlock(level);
      } catch (error) {
        return fail(error, IOERR_UNLOCK);
      }
    },
    xCheckReservedLock(pFile: WasmPointer, pOut: WasmPointer): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        wasm.poke32(pOut, fileOf(pFile).checkReserved() ? 1 : 0);
        return OK;
      } catch (error) {
        wasm.poke32(pOut, 0);
        return fail(error, IOERR_CHECKRESERVEDLOCK);
      }
    },
    xFileControl(): number {
      return NOTFOUND;
    },
    xSectorSize(): number {
      return SECTOR_SIZE;
    },
    xDeviceCharacteristics(): number {
      // What os_unix reports on Linux by default (SQLITE_POWERSAFE_OVERWRITE=1).
      return IOCAP_POWERSAFE_OVERWRITE;
    },
  };

  const vfs = {
    xOpen(
      _pVfs: WasmPointer,
      zName: WasmPointer,
      pFile: WasmPointer,
      flags: number,
      pOutFlags: WasmPointer,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const name = zName ? wasm.cstrToJs(zName) : null;
        let outFlags = flags;
        let file: OpenFile;
        if (name === null || name === "") {
          file = new MemoryFile();
        } else {
          const writable = (flags & OPEN_READWRITE) !== 0;
          const create = writable && (flags & OPEN_CREATE) !== 0;
          const isJournal =
            (flags & (OPEN_MAIN_JOURNAL | OPEN_SUPER_JOURNAL | OPEN_WAL)) !== 0;
          let handle: Deno.FsFile;
          let created = false;
          if (create && isJournal && (flags & OPEN_EXCLUSIVE) === 0) {
            [handle, created] = openJournal(name);
          } else {
            try {
              handle = Deno.openSync(name, {
                read: true,
                write: writable,
                create,
                createNew: create && (flags & OPEN_EXCLUSIVE) !== 0,
              });
            } catch (error) {
              // Like os_unix: a database we may not write opens read-only.
              if (
                !(writable && (flags & OPEN_MAIN_DB) !== 0 &&
                  error instanceof Deno.errors.PermissionDenied)
              ) throw error;
              handle = Deno.openSync(name, { read: true });
              outFlags = (flags & ~(OPEN_READWRITE | OPEN_CREATE)) |
                OPEN_READONLY;
            }
          }
          let locks: LockSet | undefined;
          if ((flags & OPEN_MAIN_DB) !== 0) {
            try {
              // Locks and the journal follow the path; a second hard link
              // would get its own of both and not exclude this one.
              const links = handle.statSync().nlink ?? 1;
              if (links > 1) {
                throw new VfsError(
                  `Refusing ${name}: it has ${links} hard links, which would not share locks`,
                  CANTOPEN,
                );
              }
              locks = new LockSet(name);
            } catch (error) {
              handle.close();
              throw error;
            }
          }
          file = new DiskFile(
            name,
            handle,
            locks,
            (flags & OPEN_DELETEONCLOSE) !== 0,
            created,
          );
        }
        files.set(Number(pFile), file);
        wasm.pokePtr(pFile, ioMethodsPointer.get(sqlite3)!);
        if (pOutFlags) wasm.poke32(pOutFlags, outFlags);
        return OK;
      } catch (error) {
        return fail(error, CANTOPEN);
      }
    },
    xDelete(_pVfs: WasmPointer, zName: WasmPointer, syncDir: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      const path = wasm.cstrToJs(zName) ?? "";
      seen.set(path, false);
      try {
        Deno.removeSync(path);
      } catch (error) {
        if (error instanceof Deno.errors.NotFound) {
          fail(error, IOERR_DELETE_NOENT);
          return IOERR_DELETE_NOENT;
        }
        return fail(error, IOERR_DELETE);
      }
      if (syncDir) {
        try {
          syncDirectory(dirname(path));
        } catch (error) {
          return fail(error, IOERR_DIR_FSYNC);
        }
      }
      return OK;
    },
    xAccess(
      _pVfs: WasmPointer,
      zName: WasmPointer,
      flags: number,
      pOut: WasmPointer,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const path = wasm.cstrToJs(zName) ?? "";
        let result = false;
        if (flags === ACCESS_EXISTS) {
          // As os_unix: an empty regular file (a TRUNCATE-mode journal
          // between transactions) counts as absent, so it is not probed
          // as a possible hot journal on every read.
          // A file that was there last time is statted at once (one call);
          // one that was absent is probed first, as a failing stat costs
          // an exception.
          if (seen.get(path) !== false || existsSync(path)) {
            try {
              const info = Deno.statSync(path);
              result = !info.isFile || info.size > 0;
              seen.set(path, true);
            } catch (error) {
              if (!(error instanceof Deno.errors.NotFound)) throw error;
              seen.set(path, false);
            }
          }
        } else {
          try {
            Deno.openSync(path, { read: true, write: true }).close();
            result = true;
          } catch (error) {
            if (
              !(error instanceof Deno.errors.NotFound ||
                error instanceof Deno.errors.PermissionDenied ||
                error instanceof Deno.errors.NotCapable)
            ) throw error;
          }
        }
        wasm.poke32(pOut, result ? 1 : 0);
        return OK;
      } catch (error) {
        wasm.poke32(pOut, 0);
        return fail(error, IOERR_ACCESS);
      }
    },
    xFullPathname(
      _pVfs: WasmPointer,
      zName: WasmPointer,
      nOut: number,
      pOut: WasmPointer,
    ): number {
      try {
        const bytes = encoder.encode(canonicalPath(wasm.cstrToJs(zName) ?? ""));
        if (bytes.length >= nOut) {
          throw new VfsError("Path is longer than mxPathname", CANTOPEN);
        }
        const out = heap(pOut, nOut);
        out.set(bytes);
        out[bytes.length] = 0;
        return OK;
      } catch (error) {
        return fail(error, CANTOPEN);
      }
    },
    xRandomness(_pVfs: WasmPointer, nOut: number, pOut: WasmPointer): number {
      // getRandomValues fills at most 65536 bytes per call.
      for (let done = 0; done < nOut; done += 65536) {
        crypto.getRandomValues(
          heap(Number(pOut) + done, Math.min(65536, nOut - done)),
        );
      }
      return nOut;
    },
    xSleep(_pVfs: WasmPointer, microseconds: number): number {
      // A real, synchronous sleep: SQLite calls this between busy retries
      // and expects the time to pass.
      Atomics.wait(sleepCell, 0, 0, microseconds / 1000);
      return microseconds;
    },
    xCurrentTime(_pVfs: WasmPointer, pOut: WasmPointer): number {
      wasm.poke64f(pOut, 2440587.5 + Date.now() / 86_400_000);
      return OK;
    },
    xCurrentTimeInt64(_pVfs: WasmPointer, pOut: WasmPointer): number {
      // Julian day number in milliseconds, as SQLite's own VFSes report it.
      wasm.poke64(pOut, 210866760000000n + BigInt(Date.now()));
      return OK;
    },
    xGetLastError(_pVfs: WasmPointer, nOut: number, pOut: WasmPointer): number {
      const error = lastError;
      if (error === undefined) return OK;
      if (nOut > 0) {
        const bytes = encoder.encode(error.message).subarray(0, nOut - 1);
        const out = heap(pOut, nOut);
        out.set(bytes);
        out[bytes.length] = 0;
      }
      return error.code;
    },
  };
  const takeLastError = (): string | undefined => {
    const message = lastError?.message;
    lastError = undefined;
    return message;
  };
  const busyWait = (pFile: number, timeoutMs: number): Promise<void> => {
    const file = files.get(pFile);
    return file instanceof DiskFile
      ? file.busyWait(timeoutMs)
      : pause(timeoutMs);
  };
  return { io, vfs, takeLastError, busyWait };
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4));
