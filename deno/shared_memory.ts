/**
 * WAL's shared memory for the Deno file VFS: the `<db>-shm` file mapped
 * into WASM memory, with os_unix.c's locks on it.
 *
 * @module
 */
import type { Sqlite3Static } from "@sqlite.org/sqlite-wasm";
import { F_RDLCK, F_UNLCK, F_WRLCK, type FileId, type Libc } from "./libc.ts";
import { type ExpectedLock, walIndexLocks } from "./lock_audit.ts";
import { closeShmUnlessLocked, type Inode, releaseShm } from "./inodes.ts";
import {
  permissionBits,
  removeIfPresent,
  requirePermission,
  statIfPresent,
  takeDatabaseMode,
} from "./file_access.ts";
import {
  BUSY,
  IOERR_SHMMAP,
  IOERR_SHMOPEN,
  OK,
  SHM_BASE,
  SHM_DMS,
  SHM_EXCLUSIVE,
  SHM_SHARED,
  SHM_UNLOCK,
  VfsError,
} from "./vfs_codes.ts";

const PAGE = 4096;
const ZERO_BYTE = new Uint8Array(1);

/**
 * A connection's view of SQLite's WAL index, kept as os_unix.c keeps it so
 * that native SQLite shares it: the `<db>-shm` file in the regions SQLite
 * asks for by number, mapped into memory; SQLite's WAL locks on bytes 120
 * to 127 of that file; and the dead-man switch, a read lock on byte 128
 * that every user holds, so the first user after all have gone (no one
 * holds it) starts the file over (see {@linkcode ShmFile}).
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
 */
export class SharedMemory {
  readonly #libc: Libc;
  readonly #wasm: Sqlite3Static["wasm"];
  readonly #path: string;
  readonly #file: ShmFile;
  readonly #base: bigint;
  /**
   * The WASM memory's buffer last found at `#base`: the same buffer object
   * keeps its address (growing the memory detaches it for a new one), so
   * only a new one needs the address read again, a call into FFI that was
   * 6% of an enqueue's time when made at every lock.
   */
  #buffer: ArrayBufferLike;
  /** The mapped regions: the heap allocation, and where the mapping starts. */
  readonly #regions: { readonly allocation: number; readonly at: number }[] =
    [];
  #regionSize = 0;
  /** The WAL locks this connection holds, one bit per lock. */
  readonly #held: Held = { shared: 0, exclusive: 0 };
  /** The `-shm` file's device and inode, for the lock audit. */
  #fileId: FileId | undefined;

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
    this.#buffer = wasm.heap8u().buffer;
    this.#base = memoryBase(this.#buffer);
    this.#file = ShmFile.open(libc, database, inode);
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
    const fileSize = libc.size(this.#file.fd);
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
        libc.write(this.#file.fd, ZERO_BYTE, page * PAGE + PAGE - 1);
      }
    }
    while (this.#regions.length <= region) {
      const allocation = Number(this.#wasm.alloc(size + PAGE));
      const at = Math.ceil(allocation / PAGE) * PAGE;
      try {
        libc.mapShared(
          this.#base + BigInt(at),
          size,
          this.#file.fd,
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

  /**
   * The locks on `<db>-shm` this connection holds, for the lock audit
   * (deno/lock_audit.ts).
   */
  expectedLocks(): ExpectedLock[] {
    this.#fileId ??= this.#libc.fileId(this.#file.fd);
    return walIndexLocks(
      this.#fileId,
      this.#held.shared,
      this.#held.exclusive,
    );
  }

  /** Takes or lets go SQLite's WAL locks `offset` to `offset + n - 1`. */
  lock(offset: number, n: number, flags: number): number {
    this.#checkBase();
    return this.#file.lock(this.#held, offset, n, flags);
  }

  /** Unmaps every region and lets the locks go; deletes the file if asked. */
  close(deleteFile: boolean): void {
    for (const { allocation, at } of this.#regions.splice(0)) {
      // The heap's own memory goes back before the allocator reuses it.
      this.#libc.mapPrivate(this.#base + BigInt(at), this.#regionSize);
      this.#wasm.dealloc(allocation);
    }
    this.#file.leave(this.#held, deleteFile);
  }

  #checkBase(): void {
    const buffer = this.#wasm.heap8u().buffer;
    if (buffer === this.#buffer) return;
    if (memoryBase(buffer) !== this.#base) {
      throw new VfsError(
        `The WASM memory moved, and with it ${this.#path}'s mapping`,
        IOERR_SHMMAP,
      );
    }
    this.#buffer = buffer;
  }
}

/** One connection's WAL locks, one bit per lock (os_unix's unixShm). */
interface Held {
  shared: number;
  exclusive: number;
}

/**
 * The `<db>-shm` file open in this process: its descriptor, its dead-man
 * switch, and SQLite's WAL locks on it.
 *
 * With open file description locks, each connection has one of its own:
 * its locks are its description's, and connections of this process exclude
 * each other as other processes' do. With classic POSIX locks, which belong
 * to the process, the process's connections to one database share one (as
 * os_unix.c's unixShmNode), which counts who holds each lock: a connection
 * of this process in the way refuses a lock (SQLITE_BUSY) before the
 * kernel is asked, the kernel's lock is taken by the first holder and let
 * go by the last, and the descriptor is let go (and the file deleted, when
 * SQLite asks) only by the last connection to unmap.
 */
class ShmFile {
  readonly fd: number;
  readonly #libc: Libc;
  readonly #path: string;
  readonly #database: string;
  readonly #inode: Inode;
  /** Connections using it (one, with open file description locks). */
  #users = 0;
  /**
   * Classic locks: for each WAL lock, how many connections hold it shared,
   * or -1 when one holds it exclusive (os_unix's aLock).
   */
  readonly #holders = new Int32Array(8);

  /** The connection's file: the process's one with classic locks. */
  static open(libc: Libc, database: string, inode: Inode): ShmFile {
    const shared = libc.lockStyle === "posix";
    let file = shared ? processFiles.get(inode.key) : undefined;
    if (file === undefined) {
      file = new ShmFile(libc, database, inode);
      if (shared) processFiles.set(inode.key, file);
    }
    file.#users++;
    return file;
  }

  private constructor(libc: Libc, database: string, inode: Inode) {
    this.#libc = libc;
    this.#path = `${database}-shm`;
    this.#database = database;
    this.#inode = inode;
    this.fd = this.#open();
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
   * closed (or parked while the process holds locks on that file): one
   * would cut this connection off from everyone else's index, and closing
   * it drops no lock on the file in use.
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
      if (!current) closeShmUnlessLocked(this.#inode, fd);
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
      closeShmUnlessLocked(this.#inode, fd);
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
    const holder = libc.conflictingLock(this.fd, F_WRLCK, SHM_DMS, 1);
    const busy = () =>
      new VfsError(`${this.#path} is being reset by another user`, BUSY);
    if (holder === F_WRLCK) throw busy();
    if (holder === F_UNLCK) {
      if (!libc.setLock(this.fd, F_WRLCK, SHM_DMS, 1)) throw busy();
      libc.truncate(this.fd, 3);
    }
    if (!libc.setLock(this.fd, F_RDLCK, SHM_DMS, 1)) throw busy();
  }

  /**
   * Takes or lets go SQLite's WAL locks `offset` to `offset + n - 1` for a
   * connection that holds `held`, as os_unix.c's unixShmLock.
   */
  lock(held: Held, offset: number, n: number, flags: number): number {
    const libc = this.#libc;
    const start = SHM_BASE + offset;
    if (libc.lockStyle === "ofd") {
      if ((flags & SHM_UNLOCK) !== 0) {
        libc.setLock(this.fd, F_UNLCK, start, n);
        return OK;
      }
      const type = (flags & SHM_SHARED) !== 0 ? F_RDLCK : F_WRLCK;
      return libc.setLock(this.fd, type, start, n) ? OK : BUSY;
    }
    const mask = (1 << (offset + n)) - (1 << offset);
    const holders = this.#holders;
    if ((flags & SHM_UNLOCK) !== 0) {
      if (((held.shared | held.exclusive) & mask) === 0) return OK;
      // Other connections of this process still read under it.
      if ((flags & SHM_SHARED) !== 0 && holders[offset]! > 1) {
        holders[offset]!--;
        held.shared &= ~mask;
        return OK;
      }
      libc.setLock(this.fd, F_UNLCK, start, n);
      holders.fill(0, offset, offset + n);
      held.shared &= ~mask;
      held.exclusive &= ~mask;
      return OK;
    }
    if ((flags & SHM_SHARED) !== 0) {
      if ((held.shared & mask) !== 0) return OK;
      if (holders[offset]! < 0) return BUSY;
      if (
        holders[offset] === 0 && !libc.setLock(this.fd, F_RDLCK, start, n)
      ) {
        return BUSY;
      }
      holders[offset]!++;
      held.shared |= mask;
      return OK;
    }
    for (let i = offset; i < offset + n; i++) {
      if (holders[i] !== 0) return BUSY;
    }
    if (!libc.setLock(this.fd, F_WRLCK, start, n)) return BUSY;
    holders.fill(-1, offset, offset + n);
    held.exclusive |= mask;
    return OK;
  }

  /**
   * A connection lets go of the file and of the locks it holds; the last
   * user lets go of the descriptor (deleting the file if asked).
   */
  leave(held: Held, deleteFile: boolean): void {
    if (this.#libc.lockStyle === "posix") {
      for (let i = 0; i < 8; i++) {
        const bit = 1 << i;
        if ((held.exclusive & bit) !== 0) {
          this.lock(held, i, 1, SHM_UNLOCK | SHM_EXCLUSIVE);
        } else if ((held.shared & bit) !== 0) {
          this.lock(held, i, 1, SHM_UNLOCK | SHM_SHARED);
        }
      }
    }
    if (--this.#users > 0) return;
    processFiles.delete(this.#inode.key);
    this.#release(deleteFile);
  }

  #release(deleteFile: boolean): void {
    this.#libc.setLock(this.fd, F_UNLCK, 0, 0);
    if (deleteFile) {
      // SQLite asks only with the database locked EXCLUSIVE: no one else
      // has the file open to lose locks by this close.
      removeIfPresent(this.#path);
      closeShmUnlessLocked(this.#inode, this.fd);
    } else {
      // Kept for the next connection, or parked (see deno/inodes.ts).
      releaseShm(this.#inode, this.fd);
    }
  }
}

/** With classic locks: the process's `-shm` file of each database inode. */
const processFiles = new Map<string, ShmFile>();

/** The host address of the WASM memory's `buffer`: WASM address 0. */
function memoryBase(buffer: ArrayBufferLike): bigint {
  return Deno.UnsafePointer.value(
    Deno.UnsafePointer.of(buffer as ArrayBuffer),
  );
}
