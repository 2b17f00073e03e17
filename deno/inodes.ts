/**
 * The database files this process has open, by inode, and their idle and
 * parked descriptors.
 *
 * Closing any descriptor of a file drops every classic POSIX lock this
 * process holds on it: the VFS's own on macOS and the BSDs (see
 * `deno/posix_locks.ts`), and native SQLite's (node:sqlite, the
 * application's own `DatabaseSync`) everywhere. Native SQLite locks the
 * database file and its `-shm`, never its journal or WAL file, so the VFS
 * closes a descriptor of those two only when no such lock is held, as
 * os_unix.c keeps a descriptor on its inode's unused list while the process
 * holds locks on the file:
 * - while a connection of this VFS has the file open, a closed connection's
 *   descriptors stay open (idle), and the next connection takes them;
 * - when the last one closes, a descriptor is closed only if the process
 *   holds no classic lock on its file (on Linux, as a lock test with an open
 *   file description finds them, or its descriptors' `/proc/self/fdinfo`
 *   lists them, see `deno/proc_locks.ts`), and no connection of the
 *   `node:sqlite` driver has the file open (`drivers/node_sqlite_files.ts`,
 *   all there is to go by where `/proc` is not); else it is parked, until a later open
 *   of the file takes it, or a later look finds the locks gone: at each
 *   open and close of a database by the VFS while any is parked, and when a
 *   `node:sqlite` driver's connection closes.
 *
 * @module
 */
import type { FileId, Libc } from "./libc.ts";
import { ProcessLocks } from "./posix_locks.ts";
import { classicLocks } from "./proc_locks.ts";
import { CANTOPEN, VfsError } from "./vfs_codes.ts";
import {
  nodeSqliteHasOpenFile,
  whenNodeSqliteCloses,
} from "../drivers/node_sqlite_files.ts";

/** A database file's descriptors in this process. */
export interface Inode {
  readonly key: string;
  readonly id: FileId;
  /** What the descriptors are closed through. */
  readonly libc: Libc;
  connections: number;
  readonly idle: { readonly fd: number; readonly writable: boolean }[];
  /** Closed connections whose kernel wait is still in flight. */
  lateWaits: number;
  /** Descriptors of `<db>-shm` closed connections let go, unlocked. */
  readonly idleShm: number[];
  /** The process's classic POSIX lock on the file (unused with OFD locks). */
  readonly processLocks: ProcessLocks;
}

export const inodes = new Map<string, Inode>();

/**
 * Parked descriptors (those of files no connection of the VFS has open)
 * past which the VFS opens no new descriptor of another file: each stays
 * open while native SQLite in the process holds locks on its file, and a
 * later open of the same file takes it, so only files locked at once, each
 * by few connections, park any. Past it, something holds locks on many
 * files without end, and opening more would only park more.
 */
export const MAX_PARKED = 64;

export function inodeKey(id: FileId): string {
  return `${id.dev}:${id.ino}`;
}

/** The file's state, made on first use, counting in a connection. */
export function connect(libc: Libc, id: FileId): Inode {
  const inode = inodeOf(libc, id);
  inode.connections++;
  if (parkedDescriptors() > 0) sweep(libc);
  return inode;
}

/**
 * A connection closed, giving back the descriptors `fds` (which hold no
 * lock of its own now): the last one's, and the parked ones, are closed
 * where that drops no lock of the process's.
 */
export function disconnect(
  inode: Inode,
  fds: readonly number[],
  writable: boolean,
): void {
  inode.connections--;
  for (const fd of fds) inode.idle.push({ fd, writable });
  if (inode.connections === 0) sweep(inode.libc);
}

/** Takes an idle descriptor of the file at `path`, when there is one. */
export function takeIdle(
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
export function releaseDescriptor(
  inode: Inode,
  fd: number,
  writable: boolean,
): void {
  inode.idle.push({ fd, writable });
  if (inode.connections === 0) sweep(inode.libc);
}

/** Gives back a descriptor of the database's `<db>-shm`, unlocked. */
export function releaseShm(inode: Inode, fd: number): void {
  inode.idleShm.push(fd);
  if (inode.connections === 0) sweep(inode.libc);
}

/**
 * Closes a descriptor of a `<db>-shm` no connection uses any more (deleted,
 * or another file now at its path), or parks it while the process holds
 * classic locks on that file.
 */
export function closeShmUnlessLocked(inode: Inode, fd: number): void {
  if (lockedBy(inode.libc)(fd, inode)) {
    inode.idleShm.push(fd);
  } else {
    inode.libc.close(fd);
  }
}

/**
 * Gives back a descriptor of a file just opened, no connection made:
 * parked while a connection of the VFS, or a classic lock of the process,
 * holds the file, else closed.
 */
export function parkOrClose(libc: Libc, fd: number, writable: boolean): void {
  releaseDescriptor(inodeOf(libc, libc.fileId(fd)), fd, writable);
}

/**
 * Refuses a new descriptor for a connection to `path` while
 * {@linkcode MAX_PARKED} descriptors stay parked after a look at the locks.
 *
 * @throws {VfsError} (`SQLITE_CANTOPEN`) saying why.
 */
export function checkParked(libc: Libc, path: string): void {
  if (parkedDescriptors() < MAX_PARKED) return;
  sweep(libc);
  const parked = parkedDescriptors();
  if (parked < MAX_PARKED) return;
  throw new VfsError(
    `Cannot open ${path}: ${parked} descriptors of other database files stay open in this process, which holds classic POSIX locks on those files (native SQLite: node:sqlite, a DatabaseSync) that closing them would drop; close those connections first`,
    CANTOPEN,
  );
}

/**
 * Whether a connection of the VFS in this process has the file `path`
 * names open, without loading libc when none has any file open.
 */
export function vfsHasOpen(path: string, libc: () => Libc): boolean {
  if (inodes.size === 0) return false;
  const id = libc().pathId(path);
  return id !== undefined &&
    (inodes.get(inodeKey(id))?.connections ?? 0) > 0;
}

/** Descriptors kept open for files no connection of the VFS has open. */
export function parkedDescriptors(): number {
  let parked = 0;
  for (const inode of inodes.values()) {
    if (inode.connections > 0) continue;
    parked += inode.idle.length + inode.idleShm.length;
  }
  return parked;
}

function inodeOf(libc: Libc, id: FileId): Inode {
  const key = inodeKey(id);
  let inode = inodes.get(key);
  if (inode === undefined) {
    inode = {
      key,
      id,
      libc,
      connections: 0,
      idle: [],
      lateWaits: 0,
      idleShm: [],
      processLocks: new ProcessLocks(),
    };
    inodes.set(key, inode);
  }
  return inode;
}

/**
 * Closes the descriptors of files no connection of the VFS has open whose
 * file the process holds no classic lock on, one look at the locks for all.
 */
function sweep(libc: Libc): void {
  let locked: ((fd: number, inode: Inode) => boolean) | undefined;
  for (const inode of inodes.values()) {
    if (inode.connections > 0) continue;
    if (inode.idle.length > 0 || inode.idleShm.length > 0) {
      locked ??= lockedBy(libc);
      const close = inode.libc;
      if (inode.idle.length > 0 && !locked(inode.idle[0]!.fd, inode)) {
        for (const { fd } of inode.idle.splice(0)) close.close(fd);
      }
      for (const fd of inode.idleShm.splice(0)) {
        if (locked(fd, inode)) inode.idleShm.push(fd);
        else close.close(fd);
      }
    }
    if (
      inode.idle.length === 0 && inode.idleShm.length === 0 &&
      inode.lateWaits === 0
    ) {
      inodes.delete(inode.key);
    }
  }
}

/**
 * Whether the process holds classic locks on the file of `fd` (the database
 * of `inode`, or its `-shm`) that closing `fd` would drop. The VFS's own
 * classic locks on it are gone by then: its connections let theirs go
 * before they give their descriptors back. So, in order:
 * - a connection of the `node:sqlite` driver has the database open: yes
 *   (where nothing else can be asked, macOS and the BSDs, all there is);
 * - no one but `fd`'s own description holds a lock on the file, as an open
 *   file description's lock test (F_OFD_GETLK) finds, which sees this
 *   process's classic locks too: no;
 * - the lock it finds is a classic one of this process: yes;
 * - else another process's lock, or an open file description's, may hide
 *   one of this process's (and with classic locks there is no such test):
 *   the `lock:` lines of this process's descriptors of the file in
 *   `/proc/self/fdinfo` (`deno/proc_locks.ts`), exactly the locks it holds
 *   there; its descriptors listed and asked for their file once a sweep.
 */
function lockedBy(libc: Libc): (fd: number, inode: Inode) => boolean {
  let classic: ((file: FileId) => boolean) | undefined | null = null;
  return (fd, inode) => {
    if (nodeSqliteHasOpenFile(inode.id)) return true;
    const holder = libc.lockHolder(fd);
    if (holder === undefined) return false;
    if (holder === Deno.pid) return true;
    try {
      if (classic === null) classic = classicLocks(libc);
      return classic?.(libc.fileId(fd)) === true;
    } catch {
      // Not read (no descriptor left for it): kept, and looked at again.
      return true;
    }
  };
}

// A node:sqlite connection's close lets its locks go: what they kept
// parked may close now.
whenNodeSqliteCloses(() => {
  for (const inode of inodes.values()) {
    if (inode.connections === 0) return sweep(inode.libc);
  }
});
