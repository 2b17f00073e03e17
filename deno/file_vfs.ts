/**
 * A SQLite VFS that gives the official SQLite WASM build real files under
 * Deno: the database, its journals, WAL and WAL index through descriptors of
 * its own (libc via `Deno.dlopen`).
 *
 * The package's node build (which Deno loads) only has a transient in-memory
 * filesystem; {@linkcode installDenoFileVfs} registers this VFS so that file
 * paths and `file:` URIs open real files on disk.
 *
 * Locking is SQLite's own (https://sqlite.org/lockingv3.html): byte-range
 * locks on the database file at os_unix.c's offsets (PENDING_BYTE
 * 0x40000000, RESERVED +1, the 510-byte SHARED range from +2), taken in the
 * order and with the conversions of `unixLock`/`unixUnlock`. They are Linux
 * open file description locks (`F_OFD_SETLK`, see `deno/libc.ts`): they conflict
 * with native SQLite's classic POSIX locks on the same bytes, so the
 * `sqlite3` CLI, `node:sqlite` and any other SQLite process exclude WASM
 * connections and are excluded by them; each open file description owns its
 * locks, so two connections in one process exclude each other like two
 * processes; the kernel drops a dead process's locks. Locks follow the
 * inode, so hard links and renames share them; paths are canonicalised
 * (symlinks resolved) so that two names of one file also share the journal.
 * A connection refused a lock waits in the kernel (`F_OFD_SETLKW`) on a
 * second open file description, for a read lock or for the writers' turn
 * (a byte native SQLite never locks), never for SQLite's own write locks,
 * which are only taken as os_unix.c takes them (see `LockSet`).
 *
 * WAL's shared memory is the `<db>-shm` file mapped into the WASM memory,
 * with os_unix.c's locks on it (see `SharedMemory`), so WAL is shared across
 * connections and processes, native SQLite's included.
 *
 * What this does not do: lock reliably on network filesystems, run off Linux
 * (no open file description locks: opening fails), or share WAL off x86-64.
 *
 * @module
 */
import { basename, dirname, join, resolve } from "node:path";
import type { loadSqlite3 } from "../drivers/sqlite_wasm.ts";
import type { Sqlite3Static, WasmPointer } from "@sqlite.org/sqlite-wasm";
import {
  F_RDLCK,
  F_UNLCK,
  F_WRLCK,
  type FileId,
  type Libc,
  LibcError,
  loadLibc,
} from "./libc.ts";
import { monotonicMs, TurnWatchdog } from "./turn_watchdog.ts";

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
 * Opening a database file needs `--allow-ffi` (its locks and I/O go through
 * libc; without it the open fails with an error naming the flag), and
 * `--allow-read` and `--allow-write` for the database's directory, where the
 * VFS creates the journal.
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
  // Version 2 adds the xShm methods: WAL shared across connections.
  (ioStruct as unknown as { $iVersion: number }).$iVersion = 2;
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
 * refused it is free, or `timeoutMs` milliseconds at most: in the kernel
 * (see `LockSet.wait`), or on a short timer when readers are in a writer's
 * way or the lock is unknown. `SQLITE_FCNTL_FILE_POINTER` finds the
 * connection's main database file.
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
const IOERR_SHMOPEN = IOERR | (18 << 8);
const IOERR_SHMLOCK = IOERR | (20 << 8);
const IOERR_SHMMAP = IOERR | (21 << 8);

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
const ACCESS_READWRITE = 1;
const IOCAP_POWERSAFE_OVERWRITE = 0x1000;

// xShmLock's flags, and where os_unix puts the WAL locks and the dead-man
// switch in the -shm file ((22 + SQLITE_SHM_NLOCK) * 4, then 8 locks).
const SHM_UNLOCK = 1;
const SHM_SHARED = 4;
const SHM_BASE = 120;
const SHM_DMS = SHM_BASE + 8;
const PAGE = 4096;
const ZERO_BYTE = new Uint8Array(1);
/** SQLite's largest page size. */
const MAX_PAGE_SIZE = 65536;
/** The bytes of a WAL frame's header (wal.c's WAL_FRAME_HDRSIZE). */
const WAL_FRAME_HEADER = 24;
// How long a writer keeps trying to get readers out of its way (PENDING,
// then EXCLUSIVE) before it reports SQLITE_BUSY: readers hold SHARED for
// one statement and, once PENDING is held, no new one gets in.
const READERS_SPIN_MS = 2;
// How long the writer's turn, granted to a waiting connection, is kept for
// its retry before it is given back. The retry follows the wait's end at
// once (see LockSet.wait), so this only bounds a caller that never retries.
const GRANT_KEPT_MS = 100;
// A writer refused the turn this long by a wait in flight, while RESERVED is
// free, takes RESERVED without the turn: the turn's holder is then a grant
// its process has not taken up (its event loop blocked, or a wait its
// caller gave up on), and RESERVED, not the turn, is what excludes writers.
const STALE_TURN_MS = 2 * GRANT_KEPT_MS;
// Kept turns: while another writer of this VFS waits for the turn, a writer
// keeps the turn (not RESERVED: SQLite's own locks are let go between
// transactions, also for a process stopped there) after its commit for its
// own next transaction, four transactions a turn (a worker's two claims and
// acknowledgements), so the lock changes process once a turn rather than
// once a transaction (each change costs the next writer a wake-up, cold
// caches and an emptied page cache; see bench/README.md: two a turn left
// four busy processes at 0.69× of one, four at 0.82×, and cost a paced
// producer among them a tenth of its commits). A kept turn not
// taken up by the event loop's next timers is given back then, and one not
// taken up within TURN_MS is given back by the watchdog thread
// (deno/turn_watchdog.ts), also while the event loop is blocked (a
// handler's synchronous work after a claim).
const TURN_TRANSACTIONS = 4;
const TURN_MS = 10;
// Kernel waits in flight in this process at most: each holds a thread of
// Deno's blocking pool until the kernel answers, and a full pool would
// also hold up the async file operations of the writer they wait for.
const MAX_KERNEL_WAITS = 8;

// os_unix.c's lock bytes: one page-sized range past 1 GiB that SQLite never
// reads or writes, so native SQLite and this VFS lock the same bytes.
const PENDING_BYTE = 0x40000000;
const RESERVED_BYTE = PENDING_BYTE + 1;
const SHARED_FIRST = PENDING_BYTE + 2;
const SHARED_SIZE = 510;
// The writer's turn among this VFS's connections: a write lock on the byte
// after the SHARED range, held with RESERVED. Native SQLite never locks it,
// so the kernel can hand it to a waiting connection without telling anyone
// that RESERVED is held (see LockSet). In the same page SQLite never reads
// or writes at page sizes of 1 KiB and up; at 512 a lock is still only a
// lock, and SQLite's I/O ignores it.
const TURN_BYTE = SHARED_FIRST + SHARED_SIZE;
// A read lock on the next byte, held by a connection while its wait for the
// turn is in flight: a writer that finds it locked keeps its turn.
const QUEUE_BYTE = TURN_BYTE + 1;

// SQLITE_FCNTL_HAS_MOVED (sqlite3.h).
const FCNTL_HAS_MOVED = 20;

// The pause when readers are in a writer's way, or the lock that refused is
// unknown (not this VFS's database, or an error outside the lock calls).
const PAUSE_MS = 1;

/** The process's turn watchdog, started by the first turn kept. */
let watchdog: TurnWatchdog | null | undefined;
/** Kernel waits in flight in this process (see MAX_KERNEL_WAITS). */
let kernelWaits = 0;

/** The watchdog, started on first use; undefined when it cannot start. */
function turnWatchdog(): TurnWatchdog | undefined {
  if (watchdog === undefined) {
    try {
      watchdog = new TurnWatchdog(TURN_BYTE, 1);
    } catch {
      // No thread for it: no turn is kept, which only costs speed.
      watchdog = null;
    }
  }
  return watchdog ?? undefined;
}

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
 * A database file's descriptors in this process. Closing any descriptor of
 * a file drops every classic POSIX lock this process holds on it, and native
 * SQLite in the process (node:sqlite) holds those: so, like os_unix.c's
 * unused-descriptor list, a closed connection's descriptors stay open (and
 * are reused by the next connection) until the process's last connection
 * to the file closes; one whose kernel wait was still in flight then stays
 * open until the next last close, or the process's exit, rather than close
 * whenever the kernel happens to answer the wait.
 */
interface Inode {
  readonly key: string;
  connections: number;
  readonly idle: { readonly fd: number; readonly writable: boolean }[];
  /** Closed connections whose kernel wait is still in flight. */
  lateWaits: number;
  /** Descriptors of `<db>-shm` closed connections let go, unlocked. */
  readonly idleShm: number[];
}

const inodes = new Map<string, Inode>();

function inodeKey(id: FileId): string {
  return `${id.dev}:${id.ino}`;
}

/** Takes an idle descriptor of the file at `path`, when there is one. */
function takeIdle(
  libc: Libc,
  path: string,
  writable: boolean,
): number | undefined {
  const id = libc.pathId(path);
  const idle = id === undefined ? undefined : inodes.get(inodeKey(id))?.idle;
  const at = idle?.findIndex((entry) => entry.writable === writable) ?? -1;
  return at < 0 ? undefined : idle!.splice(at, 1)[0]!.fd;
}

/** Gives back a descriptor of `inode` that holds no lock. */
function releaseDescriptor(
  libc: Libc,
  inode: Inode,
  fd: number,
  writable: boolean,
): void {
  if (inode.connections > 0) {
    inode.idle.push({ fd, writable });
    return;
  }
  libc.close(fd);
}

/**
 * SQLite's lock levels as os_unix.c takes them, one connection's view, over
 * two open file descriptions of the database file, each the owner of its
 * locks: the main one holds PENDING and the SHARED range (and does the
 * I/O), the second holds RESERVED and the turn (TURN_BYTE) and waits in the
 * kernel for a lock that refused the connection. Native SQLite's classic
 * POSIX locks on the same bytes conflict with them, and so do other
 * connections' in this process.
 *
 * SQLite's own locks are taken only as os_unix.c takes them, never handed
 * out by a kernel wait: RESERVED held tells a reader checking for a hot
 * journal (xCheckReservedLock) that the journal is live, so a connection
 * that had not itself looked for one first (under SHARED) would let readers
 * read a crashed writer's pages. A kernel wait only ever gets a read lock on
 * PENDING or the SHARED range (what a reader holds), or the turn.
 *
 * The turn is what makes a wait fair among this VFS's connections: a writer
 * takes it with RESERVED, and when it lets both go the kernel grants the
 * turn to the waiting description; the connection keeps it for its retry,
 * and the writer's next transaction, refused the turn, waits in its place.
 * A native writer takes no turn, so a connection refused RESERVED by one
 * polls, as native connections do.
 */
class LockSet {
  #level = NONE;
  /**
   * The turn: held with RESERVED, granted to a wait for the retry, or kept
   * with RESERVED after a commit for the next transaction.
   */
  #turn: "none" | "held" | "granted" | "kept" | "bypassed" = "none";
  /** Transactions in the current turn. */
  #turnTransactions = 0;
  /** The watchdog's slot for this connection's kept turns. */
  #slot: number | undefined;
  #grantTimer: ReturnType<typeof setTimeout> | undefined;
  /** Whether the last refused lock was the turn (else a pause follows). */
  #refusedTurn = false;
  /** The kernel wait for the turn in flight: it cannot be cancelled. */
  #call: Promise<void> | undefined;
  /** When it began (performance.now() ms). */
  #callStarted = 0;
  /** When this connection's current run of turn refusals began, and the last. */
  #refusedSince = 0;
  #lastRefused = -Infinity;
  /** Callers of wait() still waiting. */
  #waiters = 0;
  #closed = false;
  /** Resolved on close: a closed connection has nothing left to wait for. */
  readonly #closing = Promise.withResolvers<void>();
  readonly #libc: Libc;
  readonly #fd: number;
  readonly #waitFd: number;
  /** Gives the second descriptor back once no wait uses it. */
  readonly #release: (fd: number) => void;
  /** Whether the descriptors may take write locks (not a read-only open). */
  readonly #writable: boolean;

  constructor(
    libc: Libc,
    fds: readonly [number, number],
    writable: boolean,
    release: (fd: number) => void,
  ) {
    this.#libc = libc;
    [this.#fd, this.#waitFd] = fds;
    this.#writable = writable;
    this.#release = release;
  }

  get level(): number {
    return this.#level;
  }

  get waitFd(): number {
    return this.#waitFd;
  }

  /**
   * Waits until the turn that refused this connection last is let go (the
   * kernel grants it to the second description, which keeps it for the
   * retry), or `timeoutMs` at most; refused anything else, it pauses, as
   * native SQLite's busy handler does. A wait that timed out stays in
   * flight; the turn it is granted later is given back when it returns.
   */
  async wait(timeoutMs: number): Promise<void> {
    if (
      !this.#refusedTurn || this.#closed ||
      this.#call === undefined && kernelWaits >= MAX_KERNEL_WAITS
    ) {
      return await pause(timeoutMs);
    }
    if (this.#turn === "granted") return;
    this.#call ??= this.#startWait();
    // Queued while someone waits: writers keep their turns for waiters.
    if (this.#waiters++ === 0) {
      this.#libc.setLock(this.#waitFd, F_RDLCK, QUEUE_BYTE, 1);
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      // At most STALE_TURN_MS at a time, so that the retry can take
      // RESERVED past a stale turn (see lock).
      await Promise.race([
        this.#call,
        this.#closing.promise,
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, Math.min(timeoutMs, STALE_TURN_MS));
        }),
      ]);
    } finally {
      clearTimeout(timer);
      if (--this.#waiters === 0 && !this.#closed) {
        this.#libc.setLock(this.#waitFd, F_UNLCK, QUEUE_BYTE, 1);
      }
    }
  }

  #startWait(): Promise<void> {
    this.#callStarted = performance.now();
    kernelWaits++;
    const returned = (held: boolean) => {
      this.#call = undefined;
      kernelWaits--;
      if (held) this.#granted();
      // A closed connection's descriptor is parked, never closed here: a
      // close at the moment the kernel grants would drop the classic POSIX
      // locks node:sqlite holds in this process (see Inode).
      if (this.#closed) this.#release(this.#waitFd);
    };
    return this.#libc.waitLock(this.#waitFd, F_WRLCK, TURN_BYTE, 1).then(
      returned,
      () => returned(false),
    );
  }

  /**
   * The kernel granted the turn to the second description. It is kept for
   * the retry while a caller waits for it. The connection takes the turn
   * itself only while no wait for it is in flight (see lock), so the grant
   * never merges into a turn the connection holds; it may hold RESERVED
   * without the turn meanwhile ("bypassed"), and then needs no grant.
   */
  #granted(): void {
    if (!this.#closed && this.#waiters > 0 && this.#turn === "none") {
      this.#turn = "granted";
      const timer = setTimeout(() => this.#dropGrant(), GRANT_KEPT_MS);
      Deno.unrefTimer(timer as unknown as number);
      this.#grantTimer = timer;
      return;
    }
    this.#libc.setLock(this.#waitFd, F_UNLCK, TURN_BYTE, 1);
  }

  /**
   * Whether to keep the turn after this transaction for the next one, and
   * if so hands it to the watchdog: only while another writer of this VFS
   * waits for it (a read lock on QUEUE_BYTE), and only for the rest of the
   * turn. RESERVED goes in any case: native writers, which poll, find it
   * free between transactions, and a reader deciding whether a journal is
   * hot sees what it would without this VFS.
   */
  #keepsTurn(): boolean {
    if (++this.#turnTransactions >= TURN_TRANSACTIONS) return false;
    if (!this.#libc.conflicts(this.#waitFd, F_WRLCK, QUEUE_BYTE, 1)) {
      return false;
    }
    const dog = turnWatchdog();
    if (dog === undefined) return false;
    this.#slot ??= dog.slot();
    return this.#slot !== undefined &&
      dog.keep(this.#slot, this.#waitFd, monotonicMs() + TURN_MS);
  }

  /** Ends a kept turn not taken up: it goes, unless already gone. */
  #endKeptTurn(): void {
    if (this.#turn !== "kept") return;
    if (watchdog!.end(this.#slot!)) this.#releaseTurn();
    this.#turn = "none";
    this.#turnTransactions = 0;
  }

  /**
   * Lets RESERVED and the turn go, and nothing else the second description
   * holds between them (no wait's lock: only the turn is waited for).
   */
  #releaseTurn(): void {
    this.#libc.setLock(
      this.#waitFd,
      F_UNLCK,
      RESERVED_BYTE,
      TURN_BYTE - RESERVED_BYTE + 1,
    );
    this.#turn = "none";
    this.#turnTransactions = 0;
  }

  #dropGrant(): void {
    if (this.#turn !== "granted") return;
    clearTimeout(this.#grantTimer);
    this.#turn = "none";
    this.#libc.setLock(this.#waitFd, F_UNLCK, TURN_BYTE, 1);
  }

  lock(target: number): number {
    this.#refusedTurn = false;
    if (this.#level >= target) return OK;
    const libc = this.#libc;
    if (target === SHARED) {
      // As unixLock: a read lock on PENDING first, so no reader slips in
      // while a writer holds PENDING to wait for readers to leave.
      if (!libc.setLock(this.#fd, F_RDLCK, PENDING_BYTE, 1)) {
        // A writer of this VFS committing holds the turn too, until its
        // transaction ends: a writer waits for the turn. Anyone else polls:
        // a read lock on PENDING granted by the kernel would hold up the
        // next commit until this process's event loop let it go (the same
        // goes for the SHARED range below), a node:sqlite commit on the
        // same thread for its whole busy timeout.
        return this.#refuse(false);
      }
      const shared = libc.setLock(
        this.#fd,
        F_RDLCK,
        SHARED_FIRST,
        SHARED_SIZE,
      );
      libc.setLock(this.#fd, F_UNLCK, PENDING_BYTE, 1);
      if (!shared) return this.#refuse(false);
      this.#level = SHARED;
      return OK;
    }
    if (target === RESERVED) {
      // The turn first: kept from this connection's last transaction,
      // granted to its wait, or taken now.
      let turn = this.#turn === "granted";
      if (this.#turn === "kept") {
        turn = watchdog!.end(this.#slot!);
        if (!turn) this.#turnTransactions = 0;
      }
      clearTimeout(this.#grantTimer);
      this.#turn = "none";
      if (
        !turn && (
          // A wait for the turn in flight takes it first (see #granted).
          this.#call !== undefined ||
          !libc.setLock(this.#waitFd, F_WRLCK, TURN_BYTE, 1)
        )
      ) {
        const now = performance.now();
        // Refused the turn continuously (retries at most STALE_TURN_MS
        // apart) since #refusedSince, whether or not a kernel wait is in
        // flight: a connection that polls (MAX_KERNEL_WAITS) has none.
        if (now - this.#lastRefused > STALE_TURN_MS) this.#refusedSince = now;
        this.#lastRefused = now;
        const since = this.#call !== undefined
          ? this.#callStarted
          : this.#refusedSince;
        if (
          now - since >= STALE_TURN_MS &&
          libc.setLock(this.#waitFd, F_WRLCK, RESERVED_BYTE, 1)
        ) {
          this.#lastRefused = -Infinity;
          this.#turn = "bypassed";
          this.#level = RESERVED;
          return OK;
        }
        return this.#refuse(true);
      }
      this.#turn = "held";
      if (!libc.setLock(this.#waitFd, F_WRLCK, RESERVED_BYTE, 1)) {
        // A native writer holds it (writers of this VFS hold the turn), or
        // one that went past a stale turn: give the turn to the next writer
        // of this VFS, and poll.
        this.#releaseTurn();
        return this.#refuse(false);
      }
      this.#level = RESERVED;
      return OK;
    }
    // EXCLUSIVE: a write lock on PENDING (kept when the next step fails, as
    // unixLock does, so no new reader gets in), then the SHARED range turned
    // from read to write in one fcntl, which keeps the read lock if it fails.
    // Only readers can be in the way (a writer would hold RESERVED, or
    // PENDING while it recovers a hot journal), and they leave within a
    // statement, so this tries again for a moment rather than refuse.
    const until = performance.now() + READERS_SPIN_MS;
    for (;;) {
      if (
        this.#level < PENDING &&
        libc.setLock(this.#fd, F_WRLCK, PENDING_BYTE, 1)
      ) {
        this.#level = PENDING;
      }
      if (
        this.#level === PENDING &&
        libc.setLock(this.#fd, F_WRLCK, SHARED_FIRST, SHARED_SIZE)
      ) {
        this.#level = EXCLUSIVE;
        return OK;
      }
      if (performance.now() >= until) return this.#refuse(false);
    }
  }

  /** Refuses a lock; `turn`: the caller waits for the turn, else pauses. */
  #refuse(turn: boolean): number {
    this.#refusedTurn = turn;
    return BUSY;
  }

  unlock(target: number): number {
    if (this.#level <= target) {
      if (target === NONE) this.#dropGrant();
      return OK;
    }
    const libc = this.#libc;
    if (target === SHARED) {
      if (
        this.#level === EXCLUSIVE &&
        !libc.setLock(this.#fd, F_RDLCK, SHARED_FIRST, SHARED_SIZE)
      ) {
        throw new VfsError(
          "Could not downgrade the EXCLUSIVE lock to SHARED",
          IOERR_RDLOCK,
        );
      }
      libc.setLock(this.#fd, F_UNLCK, PENDING_BYTE, 1);
    } else {
      libc.setLock(this.#fd, F_UNLCK, 0, 0);
    }
    if (this.#turn === "bypassed") {
      libc.setLock(this.#waitFd, F_UNLCK, RESERVED_BYTE, 1);
      this.#turn = "none";
    } else if (this.#turn === "held") {
      if (this.#keepsTurn()) {
        libc.setLock(this.#waitFd, F_UNLCK, RESERVED_BYTE, 1);
        this.#turn = "kept";
        const timer = setTimeout(() => this.#endKeptTurn(), 0);
        Deno.unrefTimer(timer as unknown as number);
        this.#grantTimer = timer;
      } else {
        this.#releaseTurn();
      }
    } else {
      this.#dropGrant();
    }
    this.#level = target;
    return OK;
  }

  /**
   * Whether some connection or process holds RESERVED or more, as
   * unixCheckReservedLock asks: this connection's own level, else the
   * kernel whether any other owner holds a lock on RESERVED (the second
   * description holds this connection's). After a crash the kernel has
   * dropped the dead writer's lock, so its hot journal is seen.
   */
  checkReserved(): boolean {
    if (this.#level > SHARED) return true;
    return this.#libc.conflicts(this.#waitFd, F_WRLCK, RESERVED_BYTE, 1);
  }

  /**
   * Lets every lock go; returns whether the second descriptor is free to be
   * given back now (otherwise a wait in flight gives it back on return).
   */
  close(): boolean {
    this.#closed = true;
    this.#closing.resolve();
    clearTimeout(this.#grantTimer);
    if (this.#turn === "kept") watchdog!.end(this.#slot!);
    if (this.#slot !== undefined) watchdog!.freeSlot(this.#slot);
    this.#turn = "none";
    this.#level = NONE;
    this.#libc.setLock(this.#fd, F_UNLCK, 0, 0);
    this.#libc.setLock(this.#waitFd, F_UNLCK, 0, 0);
    return this.#call === undefined;
  }
}

/**
 * The main database file: I/O through its own descriptor (pread, pwrite,
 * fdatasync), with SQLite's locks on it.
 */
class DatabaseFile implements OpenFile {
  readonly path: string;
  readonly #libc: Libc;
  readonly #fd: number;
  readonly #locks: LockSet;
  readonly #id: FileId;
  readonly #inode: Inode;
  readonly #writable: boolean;
  #shm: SharedMemory | undefined;

  constructor(
    libc: Libc,
    path: string,
    fds: readonly [number, number],
    writable: boolean,
  ) {
    this.#libc = libc;
    this.path = path;
    const [fd] = fds;
    this.#fd = fd;
    this.#writable = writable;
    this.#id = libc.fileId(fd);
    const key = inodeKey(this.#id);
    let inode = inodes.get(key);
    if (inode === undefined) {
      inode = {
        key,
        connections: 0,
        idle: [],
        lateWaits: 0,
        idleShm: [],
      };
      inodes.set(key, inode);
    }
    inode.connections++;
    this.#inode = inode;
    // A wait that returns after its connection closed parks the descriptor
    // for the next connection, or the next last close, to take.
    this.#locks = new LockSet(libc, fds, writable, (released) => {
      inode.lateWaits--;
      inode.idle.push({ fd: released, writable });
    });
  }

  lockLevel(): number {
    return this.#locks.level;
  }

  busyWait(timeoutMs: number): Promise<void> {
    return this.#locks.wait(timeoutMs);
  }

  /**
   * Whether the path no longer names this file (renamed, deleted or
   * replaced), as os_unix.c's fileHasMoved: SQLite then fails writes with
   * SQLITE_READONLY_DBMOVED rather than commit to a file nobody will open.
   */
  hasMoved(): boolean {
    const id = this.#libc.pathId(this.path);
    return id === undefined || id.dev !== this.#id.dev ||
      id.ino !== this.#id.ino;
  }

  read(into: Uint8Array, offset: number): number {
    return this.#libc.read(this.#fd, into, offset);
  }

  write(from: Uint8Array, offset: number): void {
    this.#libc.write(this.#fd, from, offset);
  }

  truncate(size: number): void {
    this.#libc.truncate(this.#fd, size);
  }

  sync(): void {
    // fdatasync also flushes the file size, which is all SQLite needs; on
    // Linux os_unix uses it for every sync flag.
    this.#libc.sync(this.#fd);
  }

  size(): number {
    return this.#libc.size(this.#fd);
  }

  lock(level: number): number {
    return this.#locks.lock(level);
  }

  unlock(level: number): number {
    return this.#locks.unlock(level);
  }

  checkReserved(): boolean {
    return this.#locks.checkReserved();
  }

  /**
   * The connection's WAL index, opened (and its dead-man switch taken) on
   * SQLite's first use, and again after SQLite let it go.
   */
  sharedMemory(wasm: Sqlite3Static["wasm"]): SharedMemory {
    try {
      this.#shm ??= new SharedMemory(this.#libc, wasm, this.path, this.#inode);
    } catch (error) {
      if (error instanceof VfsError) throw error;
      throw new VfsError(
        `Cannot open the WAL index ${this.path}-shm: ${
          error instanceof Error ? error.message : String(error)
        }`,
        IOERR_SHMOPEN,
        { cause: error },
      );
    }
    return this.#shm;
  }

  /** Whether SQLite has the WAL index open (the file is in WAL mode). */
  get sharesMemory(): boolean {
    return this.#shm !== undefined;
  }

  /** Unmaps the WAL index and lets its locks go (xShmUnmap). */
  closeSharedMemory(deleteFile: boolean): void {
    const shm = this.#shm;
    this.#shm = undefined;
    shm?.close(deleteFile);
  }

  close(): void {
    // SQLite unmaps before it closes; this is for a close it never reached.
    this.closeSharedMemory(false);
    const waitFdFree = this.#locks.close();
    const inode = this.#inode;
    inode.connections--;
    if (inode.connections === 0) {
      for (const { fd } of inode.idle.splice(0)) this.#libc.close(fd);
      for (const fd of inode.idleShm.splice(0)) this.#libc.close(fd);
    }
    releaseDescriptor(this.#libc, inode, this.#fd, this.#writable);
    if (waitFdFree) {
      releaseDescriptor(this.#libc, inode, this.#locks.waitFd, this.#writable);
    } else {
      inode.lateWaits++;
    }
    if (
      inode.connections === 0 && inode.idle.length === 0 &&
      inode.lateWaits === 0
    ) {
      inodes.delete(inode.key);
    }
  }
}

/**
 * A connection's view of SQLite's WAL index, kept as os_unix.c keeps it so
 * that native SQLite shares it: the `<db>-shm` file in the regions SQLite
 * asks for by number, mapped into memory; SQLite's WAL locks on bytes 120
 * to 127 of that file; and the dead-man switch, a read lock on byte 128
 * that every user holds, so the first user after all have gone (no one
 * holds it) starts the file over.
 *
 * SQLite reads and writes the index through pointers into WASM memory, so
 * each region is mapped into the WASM memory itself (`mmap` with MAP_FIXED
 * over page-aligned heap pages): every process sees each write at once, as
 * native SQLite's do. That holds while the memory never moves, which V8
 * ensures on 64-bit hosts (it reserves the whole 32-bit address space and
 * grows in place); every map and lock checks it all the same. The index
 * also relies on xShmBarrier to order its writes: a call out of WASM keeps
 * the compiler from moving loads and stores across it, and x86-64 keeps
 * stores in order, so this is x86-64 only.
 *
 * Each connection has a descriptor of its own, so its locks are open file
 * description locks of its own: connections of this process exclude each
 * other as other processes' do, without os_unix's in-process bookkeeping.
 */
class SharedMemory {
  readonly #libc: Libc;
  readonly #wasm: Sqlite3Static["wasm"];
  readonly #path: string;
  readonly #database: string;
  readonly #inode: Inode;
  readonly #fd: number;
  readonly #base: bigint;
  /** The mapped regions: the heap allocation, and where the mapping starts. */
  readonly #regions: { readonly allocation: number; readonly at: number }[] =
    [];
  #regionSize = 0;

  constructor(
    libc: Libc,
    wasm: Sqlite3Static["wasm"],
    database: string,
    inode: Inode,
  ) {
    if (Deno.build.arch !== "x86_64") {
      throw new VfsError(
        `Cannot use WAL on ${database}: the Deno file VFS shares the WAL index only on x86-64, whose stores stay in order (this is ${Deno.build.arch}); a file already in WAL mode opens here through node:sqlite (openNodeSqlite), or after it is switched to a rollback journal mode`,
        IOERR_SHMOPEN,
      );
    }
    this.#libc = libc;
    this.#wasm = wasm;
    this.#path = `${database}-shm`;
    this.#database = database;
    this.#inode = inode;
    this.#base = memoryBase(wasm);
    this.#fd = this.#open();
    try {
      this.#takeDeadManSwitch();
    } catch (error) {
      this.#release(false);
      throw error;
    }
  }

  /**
   * An idle descriptor of the file the path names now, else a new one. Idle
   * ones of a file deleted since (by its last user, in any process) are
   * closed: one would cut this connection off from everyone else's index,
   * and closing it drops no lock on the file in use.
   */
  #open(): number {
    const libc = this.#libc;
    const now = libc.pathId(this.#path);
    const idle = this.#inode.idleShm;
    let reused: number | undefined;
    for (const fd of idle.splice(0)) {
      const id = libc.fileId(fd);
      const current = now !== undefined && id.dev === now.dev &&
        id.ino === now.ino;
      if (!current) libc.close(fd);
      else if (reused === undefined) reused = fd;
      else idle.push(fd);
    }
    if (reused !== undefined) return reused;
    // Never through a link, as os_unix: one planted by a user who may
    // write the directory would have this process write (and give away)
    // another file.
    requirePermission(this.#path, true);
    const db = statIfPresent(this.#database);
    const fd = libc.open(this.#path, {
      write: true,
      create: true,
      createNew: false,
      noFollow: true,
      permissions: permissionBits(db),
    });
    try {
      // Empty: just created (os_unix's test too).
      if (libc.size(fd) === 0) takeDatabaseMode(libc, fd, db);
    } catch (error) {
      libc.close(fd);
      throw error;
    }
    return fd;
  }

  /**
   * As unixLockSharedMemory: a read lock on the dead-man switch when others
   * hold one; when no one holds any, this is the first user since all let
   * go, and what the file holds may be a crashed writer's, so it is cut
   * (under a write lock on the switch) before SQLite rebuilds it from the
   * WAL. Someone else cutting it now refuses the connection (BUSY).
   */
  #takeDeadManSwitch(): void {
    const libc = this.#libc;
    const holder = libc.conflictingLock(this.#fd, F_WRLCK, SHM_DMS, 1);
    const busy = () =>
      new VfsError(`${this.#path} is being reset by another user`, BUSY);
    if (holder === F_WRLCK) throw busy();
    if (holder === F_UNLCK) {
      if (!libc.setLock(this.#fd, F_WRLCK, SHM_DMS, 1)) throw busy();
      libc.truncate(this.#fd, 3);
    }
    if (!libc.setLock(this.#fd, F_RDLCK, SHM_DMS, 1)) throw busy();
  }

  /**
   * The WASM address of region `region` of `size` bytes, mapping it and
   * those before it; with `extend`, growing the file to hold it, else 0
   * when the file does not (as xShmMap is specified).
   */
  map(region: number, size: number, extend: boolean): number {
    this.#checkBase();
    if (this.#regionSize !== 0 && size !== this.#regionSize) {
      throw new VfsError(
        `WAL index regions of ${size} bytes after ${this.#regionSize}`,
        IOERR_SHMMAP,
      );
    }
    this.#regionSize = size;
    if (region < this.#regions.length) return this.#regions[region]!.at;
    const libc = this.#libc;
    const needed = (region + 1) * size;
    const fileSize = libc.size(this.#fd);
    if (fileSize < needed) {
      if (!extend) return 0;
      // As os_unix: a byte at the end of every new page makes the file
      // system allocate it now, so a full disk fails here rather than
      // raise SIGBUS when SQLite writes through the mapping.
      for (
        let page = Math.floor(fileSize / PAGE);
        page < needed / PAGE;
        page++
      ) {
        libc.write(this.#fd, ZERO_BYTE, page * PAGE + PAGE - 1);
      }
    }
    while (this.#regions.length <= region) {
      const allocation = Number(this.#wasm.alloc(size + PAGE));
      const at = Math.ceil(allocation / PAGE) * PAGE;
      try {
        libc.mapShared(
          this.#base + BigInt(at),
          size,
          this.#fd,
          this.#regions.length * size,
        );
      } catch (error) {
        this.#wasm.dealloc(allocation);
        throw error;
      }
      this.#regions.push({ allocation, at });
    }
    return this.#regions[region]!.at;
  }

  /** Takes or lets go SQLite's WAL locks `offset` to `offset + n - 1`. */
  lock(offset: number, n: number, flags: number): number {
    this.#checkBase();
    const start = SHM_BASE + offset;
    if ((flags & SHM_UNLOCK) !== 0) {
      this.#libc.setLock(this.#fd, F_UNLCK, start, n);
      return OK;
    }
    const type = (flags & SHM_SHARED) !== 0 ? F_RDLCK : F_WRLCK;
    return this.#libc.setLock(this.#fd, type, start, n) ? OK : BUSY;
  }

  /** Unmaps every region and lets the locks go; deletes the file if asked. */
  close(deleteFile: boolean): void {
    for (const { allocation, at } of this.#regions.splice(0)) {
      // The heap's own memory goes back before the allocator reuses it.
      this.#libc.mapPrivate(this.#base + BigInt(at), this.#regionSize);
      this.#wasm.dealloc(allocation);
    }
    this.#release(deleteFile);
  }

  #release(deleteFile: boolean): void {
    this.#libc.setLock(this.#fd, F_UNLCK, 0, 0);
    if (deleteFile) {
      // SQLite asks only with the database locked EXCLUSIVE: no one else
      // has the file open to lose locks by this close.
      removeIfPresent(this.#path);
      this.#libc.close(this.#fd);
    } else {
      // Parked, not closed (see Inode).
      this.#inode.idleShm.push(this.#fd);
    }
  }

  #checkBase(): void {
    if (memoryBase(this.#wasm) !== this.#base) {
      throw new VfsError(
        `The WASM memory moved, and with it ${this.#path}'s mapping`,
        IOERR_SHMMAP,
      );
    }
  }
}

/** The host address of WASM address 0. */
function memoryBase(wasm: Sqlite3Static["wasm"]): bigint {
  return Deno.UnsafePointer.value(
    Deno.UnsafePointer.of(wasm.heap8u().buffer as ArrayBuffer),
  );
}

/**
 * Opens the main database's two descriptors (reusing idle ones of the same
 * file), read-only when SQLite may fall back to it. Returns them and
 * whether they are writable.
 */
function openDatabaseDescriptors(
  libc: Libc,
  path: string,
  writable: boolean,
  create: boolean,
  createNew: boolean,
): [readonly [number, number], boolean] {
  const opened: number[] = [];
  try {
    for (let i = 0; i < 2; i++) {
      let fd = takeIdle(libc, path, writable);
      if (fd === undefined) {
        try {
          fd = libc.open(path, {
            write: writable,
            create: create && i === 0,
            createNew: createNew && i === 0,
          });
        } catch (error) {
          // Like os_unix: a database we may not write opens read-only.
          if (
            i === 0 && writable && error instanceof LibcError &&
            (error.code === "EACCES" || error.code === "EROFS")
          ) {
            return openDatabaseDescriptors(libc, path, false, false, false);
          }
          throw error;
        }
      }
      opened.push(fd);
    }
  } catch (error) {
    for (const fd of opened) libc.close(fd);
    throw error;
  }
  return [opened as unknown as [number, number], writable];
}

/**
 * Refuses a database that a process of the previous release is using: it
 * locked through `<db>-*.lock` sidecar files, which this release's locks do
 * not see. Such a process holds a sidecar lock while in a transaction.
 */
function refuseSidecarLocks(libc: Libc, path: string): void {
  for (const kind of ["pending", "reserved", "shared", "waiting"]) {
    const sidecar = `${path}-${kind}.lock`;
    if (libc.stat(sidecar) === undefined) continue;
    using file = Deno.openSync(sidecar, { read: true });
    if (!file.tryLockSync(true)) {
      throw new VfsError(
        `Cannot open ${path}: a process of an earlier leased-outbox release (locking through ${sidecar}) is using it, and its locks and this release's do not exclude each other; stop it first`,
        CANTOPEN,
      );
    }
    file.unlockSync();
  }
}

/**
 * A journal, WAL or other file on disk beside the database (nothing locks
 * it), through libc: opened never through a symbolic link and created with
 * the database's permission bits, as os_unix.c does.
 */
class DiskFile implements OpenFile {
  readonly path: string;
  readonly #libc: Libc;
  readonly #fd: number;
  readonly #deleteOnClose: boolean;
  #syncDirectory: boolean;

  /** Whether this is a WAL file (SQLITE_OPEN_WAL). */
  readonly wal: boolean;
  /** Whether this is a rollback journal (SQLITE_OPEN_MAIN_JOURNAL). */
  readonly journal: boolean;

  constructor(
    libc: Libc,
    path: string,
    fd: number,
    deleteOnClose: boolean,
    syncDirectory: boolean,
    wal: boolean,
    journal: boolean,
  ) {
    this.path = path;
    this.wal = wal;
    this.journal = journal;
    this.#libc = libc;
    this.#fd = fd;
    this.#deleteOnClose = deleteOnClose;
    this.#syncDirectory = syncDirectory;
  }

  lockLevel(): number {
    return NONE;
  }

  read(into: Uint8Array, offset: number): number {
    return this.#libc.read(this.#fd, into, offset);
  }

  write(from: Uint8Array, offset: number): void {
    this.#libc.write(this.#fd, from, offset);
  }

  truncate(size: number): void {
    this.#libc.truncate(this.#fd, size);
  }

  sync(): void {
    // fdatasync also flushes the file size, which is all SQLite needs; on
    // Linux os_unix uses it for every sync flag.
    this.#libc.sync(this.#fd);
    if (this.#syncDirectory) {
      // A journal created by this open survives power loss only once its
      // directory entry is on disk (os_unix's UNIXFILE_DIRSYNC).
      syncDirectory(dirname(this.path));
      this.#syncDirectory = false;
    }
  }

  size(): number {
    return this.#libc.size(this.#fd);
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
    try {
      this.#libc.close(this.#fd);
    } finally {
      if (this.#deleteOnClose) removeIfPresent(this.path);
    }
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

/**
 * Asks Deno's permissions before libc opens the database, which Deno would
 * not check: reading, and writing when SQLite asks to.
 */
function requirePermission(path: string, write: boolean): void {
  for (const name of write ? ["read", "write"] as const : ["read"] as const) {
    if (!permitted(path, name === "write")) {
      throw new Deno.errors.NotCapable(
        `Requires ${name} access to "${path}", run again with the --allow-${name} flag`,
      );
    }
  }
}

/** Whether Deno's permissions allow reading (`write`: writing) `path`. */
function permitted(path: string, write: boolean): boolean {
  return Deno.permissions.querySync({ name: write ? "write" : "read", path })
    .state === "granted";
}

/**
 * Gives a journal, WAL file or WAL index this process created (open as
 * `fd`) the permission bits of the database file (its `stat`, if it could
 * be read), whatever the umask, and as root its owner and group, as
 * os_unix.c does: whoever may write the database may then write these too
 * (a group-shared file stays shared). Through the descriptor, never the
 * path. As in os_unix, a failure is not the database's (e.g. a chown to an
 * owner that a user namespace does not map), so nothing here throws.
 */
function takeDatabaseMode(
  libc: Libc,
  fd: number,
  db: Deno.FileInfo | undefined,
): void {
  const permissions = permissionBits(db);
  if (permissions !== undefined) libc.chmod(fd, permissions);
  if (db?.uid != null && db.gid != null && libc.isRoot()) {
    libc.chown(fd, db.uid, db.gid);
  }
}

/** A file's permission bits, from its `stat`, if known. */
function permissionBits(file: Deno.FileInfo | undefined): number | undefined {
  return file?.mode == null ? undefined : file.mode & 0o777;
}

/** `path`'s `stat`, or undefined when it cannot be read. */
function statIfPresent(path: string): Deno.FileInfo | undefined {
  try {
    return Deno.statSync(path);
  } catch {
    return undefined;
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
 * share one journal.
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
  // Each database path's open connections, and how many of them Deno's
  // permissions let read and write its journal and WAL file when they
  // opened. In rollback mode SQLite opens the journal at every write
  // transaction (and deletes it, in DELETE mode), and asking Deno again
  // each time cost more than the open: while every open connection to the
  // database had that permission, the journal's opens and deletes do not
  // ask again, and the permission lasts as long as they do, as the
  // database's own does. A connection opened without it (after a
  // revocation, or read-only) has every journal open ask.
  const connections = new Map<string, { open: number; granted: number }>();
  const granted = new Set<DatabaseFile>();
  // Whether the journal or WAL file `path` of a database may be opened (or
  // deleted) without asking Deno's permissions (see `connections`).
  const sidecarGranted = (path: string): boolean => {
    const suffix = /-(journal|wal)$/.exec(path)?.[0];
    const entry = suffix === undefined
      ? undefined
      : connections.get(path.slice(0, -suffix.length));
    return entry !== undefined && entry.granted === entry.open;
  };
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
  const databaseOf = (pFile: WasmPointer): DatabaseFile => {
    const file = fileOf(pFile);
    if (!(file instanceof DatabaseFile)) {
      throw new VfsError(`${file.path} has no WAL index`, IOERR);
    }
    return file;
  };
  // Heap views detach when memory grows, so take a fresh one on every call.
  const heap = (pointer: WasmPointer, length: number): Uint8Array =>
    wasm.heap8u().subarray(Number(pointer), Number(pointer) + length);

  // Each xWrite writes its bytes before it returns, so a failure fails the
  // call that made it, within the SQLite call (the step) that needs it, and
  // nothing is left for a later call to write: an earlier design held runs
  // of contiguous writes in JS, and their later failures reached another
  // connection's call, or a call whose error SQLite ignores (an unlock, a
  // close), after the transaction had gone on (or, in WAL mode, after the
  // index had told other processes the bytes were there).
  //
  // Two exceptions, each a fixed sequence of writes that SQLite makes from
  // one function with no other call between, so the last write of it
  // writes them all, and its error fails the whole as the first's would:
  // - a WAL frame: a 24-byte header, then its page (wal.c's
  //   walWriteOneFrame);
  // - a rollback journal record: the 4-byte page number, the page, the
  //   4-byte checksum (pager.c's pagerAddPageToRollbackJournal).
  // A WAL sequence starts only at a header written where the last call (a
  // write to that file) ended: so not at the headers SQLite rewrites at a
  // commit, which follow a read of their frame. Every 4-byte write to a
  // rollback journal is followed by another write from the same function
  // (a record's page; in a super-journal pointer, the name, then the
  // checksum and the magic), so any starts one: the first record after a
  // lock change too. Should a sequence ever break off, the next call
  // writes what is held first, in the same step.
  let held: { file: DiskFile; offset: number; length: number } | undefined;
  const pieces = new Uint8Array(WAL_FRAME_HEADER + MAX_PAGE_SIZE + 4);
  // Where the last call ended when it was an xWrite, else undefined.
  let wrote: { file: OpenFile; end: number } | undefined;
  // Writes out what is held, if anything.
  const writeHeld = (): void => {
    const sequence = held;
    if (sequence === undefined) return;
    held = undefined;
    sequence.file.write(
      pieces.subarray(0, sequence.length),
      sequence.offset,
    );
  };
  // For the first line of every method that touches files.
  const flushed = (): number => {
    wrote = undefined;
    try {
      writeHeld();
      return OK;
    } catch (error) {
      return fail(error, IOERR_WRITE);
    }
  };

  // Opens (creating if need be) a journal or WAL file and tells whether
  // this call created it, which decides the directory fsync: in one system
  // call when the file is where it was last time (there in TRUNCATE and
  // PERSIST mode, deleted in DELETE mode), in two when that guess is wrong.
  // A new one gets the database's permission bits from the start (no
  // moment at the umask's, when another user could open it).
  const openJournal = (
    libc: Libc,
    path: string,
    database: string | undefined,
  ): [number, boolean] => {
    for (let attempt = 0;; attempt++) {
      if (seen.get(path) !== false) {
        try {
          const fd = libc.open(path, {
            write: true,
            create: false,
            createNew: false,
            noFollow: true,
          });
          seen.set(path, true);
          return [fd, false];
        } catch (error) {
          if (
            !(error instanceof LibcError && error.code === "ENOENT") ||
            attempt > 2
          ) {
            throw error;
          }
        }
      }
      const db = database === undefined ? undefined : statIfPresent(database);
      try {
        const fd = libc.open(path, {
          write: true,
          create: true,
          createNew: true,
          noFollow: true,
          permissions: permissionBits(db),
        });
        seen.set(path, true);
        takeDatabaseMode(libc, fd, db);
        return [fd, true];
      } catch (error) {
        if (
          !(error instanceof LibcError && error.code === "EEXIST") ||
          attempt > 2
        ) {
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
      if (file instanceof DatabaseFile) {
        const entry = connections.get(file.path)!;
        entry.open--;
        if (granted.delete(file)) entry.granted--;
        if (entry.open === 0) connections.delete(file.path);
      }
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
      const last = wrote;
      wrote = undefined;
      try {
        const file = fileOf(pFile);
        const at = Number(offset);
        const from = heap(pSource, amount);
        const sequence = held;
        if (
          sequence !== undefined && sequence.file === file &&
          at === sequence.offset + sequence.length &&
          sequence.length + amount <= pieces.length &&
          (sequence.file.wal || sequence.length === 4
            ? amount >= 512 // the page
            : amount === 4) // the checksum
        ) {
          pieces.set(from, sequence.length);
          sequence.length += amount;
          if (sequence.file.wal || amount === 4) writeHeld();
        } else {
          writeHeld();
          if (
            file instanceof DiskFile &&
            (file.wal
              ? amount === WAL_FRAME_HEADER && last?.file === file &&
                last.end === at
              : file.journal && amount === 4)
          ) {
            pieces.set(from, 0);
            held = { file, offset: at, length: amount };
          } else {
            file.write(from, at);
          }
        }
        wrote = { file, end: at + amount };
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
    xFileControl(pFile: WasmPointer, op: number, pArg: WasmPointer): number {
      if (op !== FCNTL_HAS_MOVED) return NOTFOUND;
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const file = fileOf(pFile);
        wasm.poke32(
          pArg,
          file instanceof DatabaseFile && file.hasMoved() ? 1 : 0,
        );
        return OK;
      } catch (error) {
        return fail(error, IOERR_FSTAT);
      }
    },
    xShmMap(
      pFile: WasmPointer,
      region: number,
      size: number,
      extend: number,
      pp: WasmPointer,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        const shm = databaseOf(pFile).sharedMemory(wasm);
        wasm.pokePtr(pp, shm.map(region, size, extend !== 0));
        return OK;
      } catch (error) {
        wasm.pokePtr(pp, 0);
        return fail(error, IOERR_SHMMAP);
      }
    },
    xShmLock(
      pFile: WasmPointer,
      offset: number,
      n: number,
      flags: number,
    ): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        return databaseOf(pFile).sharedMemory(wasm).lock(offset, n, flags);
      } catch (error) {
        return fail(error, IOERR_SHMLOCK);
      }
    },
    xShmBarrier(): void {
      // The call itself orders memory (see SharedMemory); no I/O waits here,
      // between whose two copies of the index header readers wait. Nothing
      // held reaches here (a sequence ends with its last write); were
      // anything held, it would still reach the file before what this orders.
      flushed();
    },
    xShmUnmap(pFile: WasmPointer, deleteFile: number): number {
      const flushRc = flushed();
      if (flushRc !== OK) return flushRc;
      try {
        databaseOf(pFile).closeSharedMemory(deleteFile !== 0);
        return OK;
      } catch (error) {
        return fail(error, IOERR_SHMMAP);
      }
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
          if ((flags & OPEN_MAIN_DB) !== 0) {
            const libc = loadLibc(name);
            requirePermission(name, writable);
            refuseSidecarLocks(libc, name);
            const [fds, opened] = openDatabaseDescriptors(
              libc,
              name,
              writable,
              create,
              create && (flags & OPEN_EXCLUSIVE) !== 0,
            );
            if (writable && !opened) {
              outFlags = (flags & ~(OPEN_READWRITE | OPEN_CREATE)) |
                OPEN_READONLY;
            }
            const database = new DatabaseFile(libc, name, fds, opened);
            const entry = connections.get(name) ?? { open: 0, granted: 0 };
            connections.set(name, entry);
            entry.open++;
            if (
              opened &&
              [`${name}-journal`, `${name}-wal`].every((path) =>
                permitted(path, false) && permitted(path, true)
              )
            ) {
              granted.add(database);
              entry.granted++;
            }
            file = database;
          } else {
            const libc = loadLibc(name);
            // libc's open asks Deno for nothing: ask as for the database.
            if (!sidecarGranted(name)) requirePermission(name, writable);
            let fd: number;
            let created = false;
            if (create && isJournal && (flags & OPEN_EXCLUSIVE) === 0) {
              // A WAL file or rollback journal takes its database's mode.
              const suffix = (flags & OPEN_WAL) !== 0
                ? "-wal"
                : (flags & OPEN_MAIN_JOURNAL) !== 0
                ? "-journal"
                : undefined;
              [fd, created] = openJournal(
                libc,
                name,
                suffix !== undefined && name.endsWith(suffix)
                  ? name.slice(0, -suffix.length)
                  : undefined,
              );
            } else {
              const createNew = create && (flags & OPEN_EXCLUSIVE) !== 0;
              fd = libc.open(name, {
                write: writable,
                create,
                createNew,
                noFollow: true,
              });
              // A super-journal, created here (O_EXCL), must reach the
              // directory before the journals that name it are relied on.
              created = createNew && isJournal;
            }
            file = new DiskFile(
              libc,
              name,
              fd,
              (flags & OPEN_DELETEONCLOSE) !== 0,
              created,
              (flags & OPEN_WAL) !== 0,
              (flags & OPEN_MAIN_JOURNAL) !== 0,
            );
          }
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
        if (!sidecarGranted(path)) requirePermission(path, true);
        if (!loadLibc(path).unlink(path)) {
          return fail(
            new VfsError(`${path} is not there to delete`, IOERR_DELETE_NOENT),
            IOERR_DELETE_NOENT,
          );
        }
      } catch (error) {
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
          // as a possible hot journal on every read. One stat(2) through
          // libc: Deno.statSync cost three times as much, a failing one an
          // exception besides.
          const info = loadLibc(path).stat(path);
          result = info !== undefined && (!info.regular || info.size > 0);
          seen.set(path, info !== undefined);
        } else {
          // access(2), as os_unix: opening the path to find out, then
          // closing it, would drop this process's native SQLite locks on it.
          result = loadLibc(path).accessible(path, flags === ACCESS_READWRITE);
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
    return file instanceof DatabaseFile
      ? file.busyWait(timeoutMs)
      : pause(timeoutMs);
  };
  return { io, vfs, takeLastError, busyWait };
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4));
