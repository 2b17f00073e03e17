/**
 * The numbers the Deno file VFS's modules share: SQLite's lock levels,
 * result codes and flags (sqlite3.h), os_unix.c's lock bytes in the database
 * and `-shm` files, the VFS's error carrying a result code, and the pause
 * of a connection that polls for a lock.
 *
 * @module
 */

// SQLite's lock levels (sqlite3.h SQLITE_LOCK_*).
export const NONE = 0;
export const SHARED = 1;
export const RESERVED = 2;
export const PENDING = 3;
export const EXCLUSIVE = 4;

// Result codes, spelled out so the hot paths do not look them up.
export const OK = 0;
export const BUSY = 5;
export const IOERR = 10;
export const FULL = 13;
export const CANTOPEN = 14;
export const NOTFOUND = 12;
export const IOERR_READ = IOERR | (1 << 8);
export const IOERR_SHORT_READ = IOERR | (2 << 8);
export const IOERR_WRITE = IOERR | (3 << 8);
export const IOERR_FSYNC = IOERR | (4 << 8);
export const IOERR_DIR_FSYNC = IOERR | (5 << 8);
export const IOERR_TRUNCATE = IOERR | (6 << 8);
export const IOERR_FSTAT = IOERR | (7 << 8);
export const IOERR_UNLOCK = IOERR | (8 << 8);
export const IOERR_RDLOCK = IOERR | (9 << 8);
export const IOERR_DELETE = IOERR | (10 << 8);
export const IOERR_ACCESS = IOERR | (13 << 8);
export const IOERR_CHECKRESERVEDLOCK = IOERR | (14 << 8);
export const IOERR_LOCK = IOERR | (15 << 8);
export const IOERR_CLOSE = IOERR | (16 << 8);
export const IOERR_DELETE_NOENT = IOERR | (23 << 8);
export const IOERR_SHMOPEN = IOERR | (18 << 8);
export const IOERR_SHMLOCK = IOERR | (20 << 8);
export const IOERR_SHMMAP = IOERR | (21 << 8);

// xOpen flags (sqlite3.h SQLITE_OPEN_*).
export const OPEN_READONLY = 0x1;
export const OPEN_READWRITE = 0x2;
export const OPEN_CREATE = 0x4;
export const OPEN_DELETEONCLOSE = 0x8;
export const OPEN_EXCLUSIVE = 0x10;
export const OPEN_MAIN_DB = 0x100;
export const OPEN_MAIN_JOURNAL = 0x800;
export const OPEN_SUPER_JOURNAL = 0x4000;
export const OPEN_WAL = 0x80000;

// xSync's flags (sqlite3.h SQLITE_SYNC_*): the low bits are NORMAL (2) or
// FULL (3), to which DATAONLY (0x10) may be added.
export const SYNC_FULL = 3;

export const ACCESS_EXISTS = 0;
export const ACCESS_READWRITE = 1;
export const IOCAP_POWERSAFE_OVERWRITE = 0x1000;

// xShmLock's flags, and where os_unix puts the WAL locks and the dead-man
// switch in the -shm file ((22 + SQLITE_SHM_NLOCK) * 4, then 8 locks).
export const SHM_UNLOCK = 1;
export const SHM_SHARED = 4;
export const SHM_EXCLUSIVE = 8;
// WAL_WRITE_LOCK (wal.c): the slot a writer locks exclusively for its
// whole write transaction.
export const SHM_WRITE_LOCK = 0;
export const SHM_BASE = 120;
export const SHM_DMS = SHM_BASE + 8;

// os_unix.c's lock bytes: one page-sized range past 1 GiB that SQLite never
// reads or writes, so native SQLite and this VFS lock the same bytes.
export const PENDING_BYTE = 0x40000000;
export const RESERVED_BYTE = PENDING_BYTE + 1;
export const SHARED_FIRST = PENDING_BYTE + 2;
export const SHARED_SIZE = 510;
// The writer's turn among this VFS's connections: a write lock on the byte
// after the SHARED range, held with RESERVED. Native SQLite never locks it,
// so the kernel can hand it to a waiting connection without telling anyone
// that RESERVED is held (see LockSet). In the same page SQLite never reads
// or writes at page sizes of 1 KiB and up; at 512 a lock is still only a
// lock, and SQLite's I/O ignores it.
export const TURN_BYTE = SHARED_FIRST + SHARED_SIZE;
// A read lock on the next byte, held by a connection while its wait for the
// turn is in flight (or, with classic locks, by a process while a writer of
// it is refused RESERVED): a writer that finds it locked keeps its turn (or
// lets the waiter in first).
export const QUEUE_BYTE = TURN_BYTE + 1;

// SQLITE_FCNTL_HAS_MOVED (sqlite3.h).
export const FCNTL_HAS_MOVED = 20;
// SQLITE_READONLY_DBMOVED (sqlite3.h): SQLITE_READONLY | (4 << 8).
export const READONLY_DBMOVED = 8 | (4 << 8);

// The pause when readers are in a writer's way, or the lock that refused is
// unknown (not this VFS's database, or an error outside the lock calls).
export const PAUSE_MS = 1;

// How long a writer keeps trying to get readers out of its way (PENDING,
// then EXCLUSIVE) before it reports SQLITE_BUSY: readers hold SHARED for
// one statement and, once PENDING is held, no new one gets in.
export const READERS_SPIN_MS = 2;

/** A VFS failure that carries the SQLite result code to report. */
export class VfsError extends Error {
  readonly code: number;
  constructor(message: string, code: number, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
  }
}

export function errorCode(error: unknown, fallback: number): number {
  if (error instanceof VfsError) return error.code;
  const code = (error as { code?: unknown } | null)?.code;
  if (code === "ENOSPC" || code === "EDQUOT") return FULL;
  return fallback;
}

/** Waits `PAUSE_MS`, or `timeoutMs` if that is shorter. */
export function pause(timeoutMs: number): Promise<void> {
  return new Promise((resolve) =>
    setTimeout(resolve, Math.min(timeoutMs, PAUSE_MS))
  );
}
