/**
 * SQLite's locks on the database file as classic POSIX locks (`F_SETLK`),
 * for macOS and the BSDs, which have no open file description locks (and
 * for tests on Linux, with `LEASED_OUTBOX_VFS_LOCKS=posix`).
 *
 * Classic locks belong to the process, not to a descriptor: two connections
 * of one process never conflict in the kernel, and closing any descriptor
 * of the file drops all of the process's locks on it. So, as os_unix.c
 * does:
 * - the process's lock on each file is kept once, per inode
 *   ({@linkcode ProcessLocks}, os_unix's `unixInodeInfo`), and each
 *   connection's ({@linkcode PosixLockSet}, its `unixFile`) is judged
 *   against it before the kernel is asked: a connection of this process in
 *   the way refuses the lock (SQLITE_BUSY) as another process would;
 * - the kernel's lock changes only when the process's does: SHARED is
 *   counted, and only the last connection to let go of it unlocks;
 * - descriptors are never closed while the process holds locks on the
 *   file: `deno/inodes.ts` keeps a closed connection's descriptors until
 *   the process's last connection to the file closes (which is stricter
 *   than os_unix's pending-close list, closed when no lock is held), and
 *   past it while classic locks not the VFS's remain (native SQLite's, or
 *   a Worker's VFS's, as far as `/proc/self/fdinfo` or the node:sqlite
 *   driver tell).
 *
 * The bytes, their order and the conversions are `deno/ofd_locks.ts`'s
 * (os_unix's `unixLock` and `unixUnlock`), on one descriptor; there is no
 * kernel wait and no writers' turn (a kernel wait would not see this
 * process's own locks): a refused connection polls, as native SQLite's busy
 * handler does. Polling alone lets a process that commits and begins again
 * at once keep RESERVED from writers that poll for it, so a process with a
 * writer refused RESERVED says so (a read lock on QUEUE_BYTE, which another
 * process's F_GETLK sees), and a writer that let RESERVED go less than
 * YIELD_MS ago lets such a waiter of another process in first.
 *
 * @module
 */
import { F_RDLCK, F_UNLCK, F_WRLCK, type Libc } from "./libc.ts";
import {
  BUSY,
  EXCLUSIVE,
  IOERR_RDLOCK,
  NONE,
  OK,
  pause,
  PENDING,
  PENDING_BYTE,
  QUEUE_BYTE,
  READERS_SPIN_MS,
  RESERVED,
  RESERVED_BYTE,
  SHARED,
  SHARED_FIRST,
  SHARED_SIZE,
  VfsError,
} from "./vfs_codes.ts";

// How long after a connection of this process let RESERVED go its
// process's writers let a writer of another process that waits for it in
// first (the waiter polls every PAUSE_MS, later on a busy machine).
export const YIELD_MS = 20;
// A writer refused RESERVED stays queued this long after its last refusal:
// one that stopped retrying (its caller gave up) then no longer holds the
// other processes' writers back.
const QUEUED_MS = 100;

/**
 * The process's lock on one database file, shared by all of its
 * connections to it (os_unix's `unixInodeInfo`: `eFileLock`, `nShared`).
 */
export class ProcessLocks {
  /** The strongest lock a connection of the process holds. */
  level = NONE;
  /** Connections of the process that hold SHARED or more. */
  shared = 0;
  /** Writers of the process refused RESERVED, still retrying. */
  queued = 0;
  /** When a connection of the process last let RESERVED go. */
  releasedAt = -Infinity;
}

/** One connection's lock on the database file, over the process's. */
export class PosixLockSet {
  #level = NONE;
  /** Whether this connection is queued for RESERVED (see ProcessLocks). */
  #queued = false;
  /** Ends the queueing of a writer that stopped retrying. */
  #queuedTimer: ReturnType<typeof setTimeout> | undefined;
  readonly #libc: Libc;
  readonly #fd: number;
  readonly #process: ProcessLocks;

  constructor(libc: Libc, fd: number, process: ProcessLocks) {
    this.#libc = libc;
    this.#fd = fd;
    this.#process = process;
  }

  get level(): number {
    return this.#level;
  }

  /** A refused connection polls: there is no kernel wait to join. */
  wait(timeoutMs: number): Promise<void> {
    return pause(timeoutMs);
  }

  lock(target: number): number {
    if (this.#level >= target) return OK;
    const process = this.#process;
    const libc = this.#libc;
    // Another connection of this process holds a lock that excludes this
    // one (PENDING or more, or any write lock for a writer).
    if (
      this.#level !== process.level &&
      (process.level >= PENDING || target > SHARED)
    ) {
      return BUSY;
    }
    if (target === SHARED) {
      // The process reads already: count this connection in.
      if (process.level === SHARED || process.level === RESERVED) {
        this.#level = SHARED;
        process.shared++;
        return OK;
      }
      // As unixLock: a read lock on PENDING first, so no reader slips in
      // while a writer holds PENDING to wait for readers to leave.
      if (!libc.setLock(this.#fd, F_RDLCK, PENDING_BYTE, 1)) return BUSY;
      const shared = libc.setLock(this.#fd, F_RDLCK, SHARED_FIRST, SHARED_SIZE);
      libc.setLock(this.#fd, F_UNLCK, PENDING_BYTE, 1);
      if (!shared) return BUSY;
      this.#level = SHARED;
      process.level = SHARED;
      process.shared = 1;
      return OK;
    }
    if (target === RESERVED) {
      // Just let go by this process while another one's writer waits: its
      // turn first.
      if (
        performance.now() - process.releasedAt < YIELD_MS &&
        libc.conflicts(this.#fd, F_WRLCK, QUEUE_BYTE, 1)
      ) {
        return this.#queue();
      }
      if (!libc.setLock(this.#fd, F_WRLCK, RESERVED_BYTE, 1)) {
        return this.#queue();
      }
      this.#unqueue();
      this.#level = RESERVED;
      process.level = RESERVED;
      return OK;
    }
    // EXCLUSIVE: a write lock on PENDING (kept when the next step fails, so
    // no new reader gets in), then the SHARED range from read to write in
    // one fcntl. Readers of this process are in the way until they let go
    // (they cannot while this runs); other processes' readers leave within
    // a statement, so this tries again for a moment, as the OFD path does.
    const until = performance.now() + READERS_SPIN_MS;
    for (;;) {
      if (
        this.#level < PENDING &&
        libc.setLock(this.#fd, F_WRLCK, PENDING_BYTE, 1)
      ) {
        this.#level = PENDING;
        process.level = PENDING;
      }
      if (this.#level === PENDING && process.shared > 1) return BUSY;
      if (
        this.#level === PENDING &&
        libc.setLock(this.#fd, F_WRLCK, SHARED_FIRST, SHARED_SIZE)
      ) {
        this.#level = EXCLUSIVE;
        process.level = EXCLUSIVE;
        return OK;
      }
      if (performance.now() >= until) return BUSY;
    }
  }

  unlock(target: number): number {
    if (this.#level <= target) return OK;
    const process = this.#process;
    const libc = this.#libc;
    if (this.#level > SHARED) {
      if (
        target === SHARED &&
        !libc.setLock(this.#fd, F_RDLCK, SHARED_FIRST, SHARED_SIZE)
      ) {
        throw new VfsError(
          "Could not downgrade the EXCLUSIVE lock to SHARED",
          IOERR_RDLOCK,
        );
      }
      // PENDING and RESERVED, in one call.
      libc.setLock(this.#fd, F_UNLCK, PENDING_BYTE, 2);
      process.level = SHARED;
      process.releasedAt = performance.now();
    }
    this.#level = target;
    if (target === NONE && --process.shared === 0) {
      // The process's last reader: the kernel's locks go, as os_unix's
      // whole-file unlock, but for QUEUE_BYTE (the process's waiters').
      process.level = NONE;
      libc.setLock(this.#fd, F_UNLCK, PENDING_BYTE, QUEUE_BYTE - PENDING_BYTE);
    }
    return OK;
  }

  /**
   * Refuses RESERVED, and queues this writer (the process's read lock on
   * QUEUE_BYTE) until it gets RESERVED, closes, or stops retrying.
   */
  #queue(): number {
    clearTimeout(this.#queuedTimer);
    this.#queuedTimer = setTimeout(() => this.#unqueue(), QUEUED_MS);
    Deno.unrefTimer(this.#queuedTimer as unknown as number);
    if (this.#queued) return BUSY;
    this.#queued = true;
    if (this.#process.queued++ === 0) {
      this.#libc.setLock(this.#fd, F_RDLCK, QUEUE_BYTE, 1);
    }
    return BUSY;
  }

  #unqueue(): void {
    clearTimeout(this.#queuedTimer);
    if (!this.#queued) return;
    this.#queued = false;
    if (--this.#process.queued === 0) {
      this.#libc.setLock(this.#fd, F_UNLCK, QUEUE_BYTE, 1);
    }
  }

  /**
   * Whether some connection or process holds RESERVED or more, as
   * unixCheckReservedLock asks: the process's own level (the kernel does
   * not report a process's own locks to it), else the kernel whether
   * another process holds a lock on RESERVED.
   */
  checkReserved(): boolean {
    if (this.#process.level > SHARED) return true;
    return this.#libc.conflicts(this.#fd, F_WRLCK, RESERVED_BYTE, 1);
  }

  /** Lets go of this connection's lock; its descriptor is free at once. */
  close(): boolean {
    this.unlock(NONE);
    this.#unqueue();
    return true;
  }
}
