/**
 * The lock audit, for tests on Linux: with `LEASED_OUTBOX_VFS_AUDIT=1`, each
 * write, truncate and sync the VFS does first checks that the kernel holds
 * every lock each open connection of this process believes it holds (its
 * SQLite lock level on the database file, its WAL locks and the dead-man
 * switch on `<db>-shm`), as `/proc/self/fdinfo` lists them (see
 * `deno/proc_locks.ts`). A lock the kernel let
 * go behind the VFS's back (classic POSIX locks go with any close of the
 * file in the process) fails the write with `SQLITE_IOERR_LOCK`, naming the
 * lock, before a byte is written without it.
 *
 * What the kernel lists for this process's descriptors is exactly its own
 * locks, in one read per descriptor: classic ones, and its open file
 * descriptions' (which carry no process id, -1, in `/proc/locks`, where
 * another process's lock on the same bytes hid a dropped one; here no
 * other process's lock is listed). Each expected lock is looked for among
 * all this process's locks on its file, not its connection's descriptor's
 * alone (with classic locks they are the process's, merged, set through any
 * of its descriptors), so a lock one connection dropped is not seen while
 * another connection of this process holds the same bytes alike (two
 * connections' SHARED).
 *
 * @module
 */
import {
  IOERR_LOCK,
  PENDING,
  PENDING_BYTE,
  RESERVED,
  RESERVED_BYTE,
  SHARED,
  SHARED_FIRST,
  SHARED_SIZE,
  SHM_BASE,
  SHM_DMS,
  VfsError,
} from "./vfs_codes.ts";
import type { FileId, Libc } from "./libc.ts";
import { type KernelLock, type OwnLocks, ownLocks } from "./proc_locks.ts";

/** The environment variable that turns the audit on (tests only). */
export const AUDIT_VARIABLE = "LEASED_OUTBOX_VFS_AUDIT";

/** A lock the kernel must hold: on the file `file`, bytes `first`–`last`. */
export interface ExpectedLock {
  readonly file: FileId;
  readonly write: boolean;
  readonly first: number;
  readonly last: number;
  /** What SQLite calls it, for the error. */
  readonly name: string;
}

/** One connection's view: the locks it believes it holds, and its path. */
export interface AuditedConnection {
  readonly path: string;
  expectedLocks(): ExpectedLock[];
}

let enabled: boolean | undefined;
const connections = new Set<AuditedConnection>();

/**
 * Whether the audit is on: `LEASED_OUTBOX_VFS_AUDIT=1` where `--allow-env`
 * grants it, on Linux (which has `/proc/self/fdinfo`). Read once.
 */
export function auditing(): boolean {
  if (enabled === undefined) {
    const permission = Deno.permissions.querySync({
      name: "env",
      variable: AUDIT_VARIABLE,
    });
    enabled = Deno.build.os === "linux" && permission.state === "granted" &&
      Deno.env.get(AUDIT_VARIABLE) === "1";
  }
  return enabled;
}

/** Adds a connection to the audit, while it is open. */
export function audit(connection: AuditedConnection): void {
  if (auditing()) connections.add(connection);
}

/** Takes a closed connection out of the audit. */
export function unaudit(connection: AuditedConnection): void {
  connections.delete(connection);
}

/**
 * Checks every audited connection's locks against what
 * `/proc/self/fdinfo` lists for this process's descriptors of its files.
 *
 * @param libc Reads `/proc/self` (Deno asks for every permission to).
 * @param doing What is about to happen, for the error.
 * @throws {VfsError} (`SQLITE_IOERR_LOCK`) naming the connection, the lock
 *   and the bytes, when the kernel does not hold one.
 */
export function checkLocks(libc: Libc, doing: string): void {
  if (connections.size === 0) return;
  const missing = missingLocks(ownLocks(libc));
  if (missing === undefined) return;
  const [connection, lock] = missing;
  throw new VfsError(
    `Lock audit, before ${doing}: ${connection.path} believes it holds ${lock.name} (a ${
      lock.write ? "write" : "read"
    } lock on bytes ${lock.first}-${lock.last}), which the kernel does not hold for this process`,
    IOERR_LOCK,
  );
}

/** The first audited connection's expected lock that `own` lacks. */
function missingLocks(
  own: OwnLocks,
): [AuditedConnection, ExpectedLock] | undefined {
  for (const connection of connections) {
    for (const lock of connection.expectedLocks()) {
      if (!isHeld(own.on(lock.file), lock)) return [connection, lock];
    }
  }
  return undefined;
}

/** Whether a lock in `held` covers `lock` (a write lock covers a read). */
function isHeld(held: readonly KernelLock[], lock: ExpectedLock): boolean {
  return held.some((k) =>
    k.first <= lock.first && k.last >= lock.last && (k.write || !lock.write)
  );
}

/**
 * The locks a connection at SQLite lock level `level` holds on `file`;
 * `reserved`: whether it took RESERVED on the way (SQLite may go from
 * SHARED to EXCLUSIVE through PENDING without it, as os_unix.c allows).
 */
export function databaseLocks(
  file: FileId,
  level: number,
  reserved: boolean,
): ExpectedLock[] {
  const locks: ExpectedLock[] = [];
  const sharedLast = SHARED_FIRST + SHARED_SIZE - 1;
  if (level > PENDING) {
    locks.push({
      file,
      write: true,
      first: SHARED_FIRST,
      last: sharedLast,
      name: "EXCLUSIVE",
    });
  } else if (level >= SHARED) {
    locks.push({
      file,
      write: false,
      first: SHARED_FIRST,
      last: sharedLast,
      name: "SHARED",
    });
  }
  if (reserved && level >= RESERVED) {
    locks.push({
      file,
      write: true,
      first: RESERVED_BYTE,
      last: RESERVED_BYTE,
      name: "RESERVED",
    });
  }
  if (level >= PENDING) {
    locks.push({
      file,
      write: true,
      first: PENDING_BYTE,
      last: PENDING_BYTE,
      name: "PENDING",
    });
  }
  return locks;
}

/** The WAL locks `shared` and `exclusive` (one bit each) and the switch. */
export function walIndexLocks(
  file: FileId,
  shared: number,
  exclusive: number,
): ExpectedLock[] {
  const locks: ExpectedLock[] = [{
    file,
    write: false,
    first: SHM_DMS,
    last: SHM_DMS,
    name: "the WAL index's dead-man switch",
  }];
  for (let i = 0; i < 8; i++) {
    const bit = 1 << i;
    if (((shared | exclusive) & bit) === 0) continue;
    const write = (exclusive & bit) !== 0;
    locks.push({
      file,
      write,
      first: SHM_BASE + i,
      last: SHM_BASE + i,
      name: `WAL lock ${i} (${write ? "exclusive" : "shared"})`,
    });
  }
  return locks;
}
