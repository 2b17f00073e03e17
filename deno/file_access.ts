/**
 * Paths and permissions for the Deno file VFS: Deno's permission checks
 * before libc opens a file, the database's mode for the files beside it,
 * canonical paths, and directory syncs.
 *
 * @module
 */
import { basename, dirname, join, resolve } from "node:path";
import type { Libc } from "./libc.ts";

export function syncDirectory(path: string): void {
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
export function requirePermission(path: string, write: boolean): void {
  for (const name of write ? ["read", "write"] as const : ["read"] as const) {
    if (!permitted(path, name === "write")) {
      throw new Deno.errors.NotCapable(
        `Requires ${name} access to "${path}", run again with the --allow-${name} flag`,
      );
    }
  }
}

/** Whether Deno's permissions allow reading (`write`: writing) `path`. */
export function permitted(path: string, write: boolean): boolean {
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
export function takeDatabaseMode(
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
export function permissionBits(
  file: Deno.FileInfo | undefined,
): number | undefined {
  return file?.mode == null ? undefined : file.mode & 0o777;
}

/** `path`'s `stat`, or undefined when it cannot be read. */
export function statIfPresent(path: string): Deno.FileInfo | undefined {
  try {
    return Deno.statSync(path);
  } catch {
    return undefined;
  }
}

export function removeIfPresent(path: string): void {
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
export function canonicalPath(name: string): string {
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
