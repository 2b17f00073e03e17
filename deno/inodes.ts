/**
 * The database files this process has open, by inode, and their idle
 * descriptors.
 *
 * @module
 */
import type { FileId, Libc } from "./libc.ts";
import type { ProcessLocks } from "./posix_locks.ts";

/**
 * A database file's descriptors in this process. Closing any descriptor of
 * a file drops every classic POSIX lock this process holds on it, and the
 * VFS holds those on macOS and the BSDs (see `deno/posix_locks.ts`), native
 * SQLite in the process (node:sqlite) everywhere: so, like os_unix.c's
 * unused-descriptor list, a closed connection's descriptors stay open (and
 * are reused by the next connection) until the process's last connection
 * to the file closes; one whose kernel wait was still in flight then stays
 * open until the next last close, or the process's exit, rather than close
 * whenever the kernel happens to answer the wait.
 */
export interface Inode {
  readonly key: string;
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

export function inodeKey(id: FileId): string {
  return `${id.dev}:${id.ino}`;
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
 * Gives back a descriptor of the file just opened: parked when a
 * connection of this process has the file open (closing it would drop the
 * process's classic POSIX locks on the file, node:sqlite's too), else closed.
 */
export function parkOrClose(libc: Libc, fd: number, writable: boolean): void {
  const inode = inodes.get(inodeKey(libc.fileId(fd)));
  if (inode === undefined) libc.close(fd);
  else releaseDescriptor(libc, inode, fd, writable);
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
