/**
 * The files the Deno file VFS opens for SQLite: the main database (its
 * descriptors, locks and WAL index), journals and WAL files on disk, and
 * nameless temporary files in memory.
 *
 * @module
 */
import type { Sqlite3Static } from "@sqlite.org/sqlite-wasm";
import { dirname } from "node:path";
import { type FileId, type Libc, LibcError } from "./libc.ts";
import {
  checkParked,
  connect,
  disconnect,
  type Inode,
  parkOrClose,
  releaseDescriptor,
  takeIdle,
} from "./inodes.ts";
import { LockSet } from "./ofd_locks.ts";
import { PosixLockSet } from "./posix_locks.ts";
import { SharedMemory } from "./shared_memory.ts";
import { removeIfPresent, syncDirectory } from "./file_access.ts";
import {
  CANTOPEN,
  IOERR_SHMOPEN,
  NONE,
  OK,
  RESERVED,
  SHARED,
  VfsError,
} from "./vfs_codes.ts";
import {
  audit,
  auditing,
  checkLocks,
  databaseLocks,
  type ExpectedLock,
  unaudit,
} from "./lock_audit.ts";

/** The operations SQLite calls on one open file. */
export interface OpenFile {
  readonly path: string;
  lockLevel(): number;
  read(into: Uint8Array, offset: number): number;
  write(from: Uint8Array, offset: number): void;
  truncate(size: number): void;
  /** `full`: SQLite asked for SQLITE_SYNC_FULL (`PRAGMA fullfsync`). */
  sync(full: boolean): void;
  size(): number;
  lock(level: number): number;
  unlock(level: number): number;
  checkReserved(): boolean;
  close(): void;
}

/**
 * One connection's SQLite locks on the database file: open file description
 * locks ({@linkcode LockSet}) on Linux, classic POSIX locks
 * ({@linkcode PosixLockSet}) on macOS and the BSDs.
 */
interface DatabaseLocks {
  readonly level: number;
  /** Waits, after a refusal, until the lock may be free (timeoutMs at most). */
  wait(timeoutMs: number): Promise<void>;
  lock(target: number): number;
  unlock(target: number): number;
  checkReserved(): boolean;
  /** Lets go of every lock; whether the last descriptor is free now. */
  close(): boolean;
}

/**
 * The main database file: I/O through its own descriptor (pread, pwrite,
 * fdatasync), with SQLite's locks on it.
 */
export class DatabaseFile implements OpenFile {
  readonly path: string;
  readonly #libc: Libc;
  readonly #fd: number;
  /** The open file description locks' second descriptor (see LockSet). */
  readonly #waitFd: number | undefined;
  readonly #locks: DatabaseLocks;
  readonly #id: FileId;
  readonly #inode: Inode;
  readonly #writable: boolean;
  #shm: SharedMemory | undefined;
  /**
   * Whether SQLite took RESERVED in this transaction (it may go from SHARED
   * to EXCLUSIVE without it), for the lock audit.
   */
  #reserved = false;

  constructor(
    libc: Libc,
    path: string,
    fds: readonly number[],
    writable: boolean,
  ) {
    this.#libc = libc;
    this.path = path;
    const [fd, waitFd] = fds as [number, number | undefined];
    this.#fd = fd;
    this.#waitFd = waitFd;
    this.#writable = writable;
    this.#id = libc.fileId(fd);
    const inode = connect(libc, this.#id);
    this.#inode = inode;
    // A wait that returns after its connection closed gives the descriptor
    // back then (parked, or closed where that drops no lock).
    this.#locks = waitFd === undefined
      ? new PosixLockSet(libc, fd, inode.processLocks)
      : new LockSet(libc, [fd, waitFd], writable, (released) => {
        inode.lateWaits--;
        releaseDescriptor(inode, released, writable);
      });
    audit(this);
  }

  /** The locks this connection believes it holds, for the lock audit. */
  expectedLocks(): ExpectedLock[] {
    const locks = databaseLocks(this.#id, this.#locks.level, this.#reserved);
    if (this.#shm !== undefined) locks.push(...this.#shm.expectedLocks());
    return locks;
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
    if (auditing()) checkLocks(this.#libc, `writing ${this.path}`);
    this.#libc.write(this.#fd, from, offset);
  }

  truncate(size: number): void {
    if (auditing()) checkLocks(this.#libc, `truncating ${this.path}`);
    this.#libc.truncate(this.#fd, size);
  }

  sync(full: boolean): void {
    if (auditing()) checkLocks(this.#libc, `syncing ${this.path}`);
    this.#libc.sync(this.#fd, full);
  }

  size(): number {
    return this.#libc.size(this.#fd);
  }

  lock(level: number): number {
    const rc = this.#locks.lock(level);
    if (level === RESERVED && rc === OK) this.#reserved = true;
    return rc;
  }

  unlock(level: number): number {
    if (level <= SHARED) this.#reserved = false;
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
    unaudit(this);
    const waitFdFree = this.#locks.close();
    const waitFd = this.#waitFd;
    const fds = [this.#fd];
    if (waitFd !== undefined && waitFdFree) fds.push(waitFd);
    else if (waitFd !== undefined) this.#inode.lateWaits++;
    disconnect(this.#inode, fds, this.#writable);
  }
}

/**
 * Opens the main database's descriptors (reusing idle ones of the same
 * file), read-only when SQLite may fall back to it: two for open file
 * description locks (see LockSet), one for classic POSIX locks. Returns them
 * and whether they are writable.
 */
export function openDatabaseDescriptors(
  libc: Libc,
  path: string,
  writable: boolean,
  create: boolean,
  createNew: boolean,
): [readonly number[], boolean] {
  const opened: number[] = [];
  const count = libc.lockStyle === "ofd" ? 2 : 1;
  try {
    for (let i = 0; i < count; i++) {
      let fd = takeIdle(libc, path, writable);
      if (fd === undefined) {
        checkParked(libc, path);
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
    // Closing one would drop the process's classic locks on the file.
    for (const fd of opened) parkOrClose(libc, fd, writable);
    throw error;
  }
  return [opened, writable];
}

/**
 * Refuses a database that a process of the previous release is using: it
 * locked through `<db>-*.lock` sidecar files, which this release's locks do
 * not see. Such a process holds a sidecar lock while in a transaction.
 */
export function refuseSidecarLocks(libc: Libc, path: string): void {
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
export class DiskFile implements OpenFile {
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
    if (auditing()) checkLocks(this.#libc, `writing ${this.path}`);
    this.#libc.write(this.#fd, from, offset);
  }

  truncate(size: number): void {
    if (auditing()) checkLocks(this.#libc, `truncating ${this.path}`);
    this.#libc.truncate(this.#fd, size);
  }

  sync(full: boolean): void {
    if (auditing()) checkLocks(this.#libc, `syncing ${this.path}`);
    this.#libc.sync(this.#fd, full);
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
export class MemoryFile implements OpenFile {
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
