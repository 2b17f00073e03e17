/**
 * The classic POSIX lock path of the Deno file VFS (`deno/posix_locks.ts`,
 * the default on macOS and the BSDs), here on Linux through a libc binding
 * of its own: os_unix.c's per-inode bookkeeping among the connections of
 * one process, which the kernel does not tell apart, and the exclusion of
 * other processes, which it does.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { bindLibc, type Libc } from "../deno/libc.ts";
import { platformFor } from "../deno/platform.ts";
import { PosixLockSet, ProcessLocks } from "../deno/posix_locks.ts";
import {
  BUSY,
  EXCLUSIVE,
  NONE,
  OK,
  PENDING,
  RESERVED,
  SHARED,
} from "../deno/vfs_codes.ts";
import { lockKindsOn, locksOn, nativeSql } from "./fixtures/vfs_locks.ts";

const libc: Libc = bindLibc(
  platformFor(Deno.build.os, Deno.build.arch),
  "posix",
);

/** `count` connections of this process to one new file, sharing its ProcessLocks. */
async function withConnections(
  count: number,
  fn: (connections: PosixLockSet[], path: string) => Promise<void> | void,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_posix_locks_" });
  const path = join(dir, "p.db");
  const process = new ProcessLocks();
  const fds = Array.from(
    { length: count },
    (_, i) =>
      libc.open(path, { write: true, create: i === 0, createNew: false }),
  );
  try {
    await fn(fds.map((fd) => new PosixLockSet(libc, fd, process)), path);
  } finally {
    for (const fd of fds) libc.close(fd);
    await Deno.remove(dir, { recursive: true });
  }
}

/** Whether the sqlite3 CLI, another process, may take RESERVED on the file. */
function nativeCanWrite(path: string): boolean {
  return nativeSql(path, "BEGIN IMMEDIATE; ROLLBACK;").code === 0;
}

const SHARED_RANGE = "READ 1073741826 1073742335";

Deno.test("classic locks: the process's readers share one kernel read lock, which goes with the last of them", async () => {
  await withConnections(2, ([a, b], path) => {
    assert.equal(a!.lock(SHARED), OK);
    assert.equal(b!.lock(SHARED), OK);
    assert.deepEqual(locksOn(path), [SHARED_RANGE]);
    assert.deepEqual(lockKindsOn(path), ["POSIX"]);
    assert.equal(a!.unlock(NONE), OK);
    assert.deepEqual(locksOn(path), [SHARED_RANGE], "b still reads");
    assert.equal(b!.unlock(NONE), OK);
    assert.deepEqual(locksOn(path), []);
  });
});

Deno.test("classic locks: a writer of the process refuses another's RESERVED, readers of the process keep it from EXCLUSIVE, and its PENDING refuses new readers of the process", async () => {
  await withConnections(3, ([a, b, c]) => {
    assert.equal(a!.lock(SHARED), OK);
    assert.equal(b!.lock(SHARED), OK);
    assert.equal(a!.lock(RESERVED), OK);
    assert.equal(b!.lock(RESERVED), BUSY);
    assert.equal(b!.level, SHARED);
    assert.equal(c!.lock(SHARED), OK, "readers come in beside RESERVED");
    assert.equal(c!.unlock(NONE), OK);
    // b reads: a stops at PENDING, which keeps new readers out.
    assert.equal(a!.lock(EXCLUSIVE), BUSY);
    assert.equal(a!.level, PENDING);
    assert.equal(c!.lock(SHARED), BUSY);
    assert.equal(b!.unlock(NONE), OK);
    assert.equal(a!.lock(EXCLUSIVE), OK);
    assert.equal(c!.lock(SHARED), BUSY);
    assert.equal(a!.unlock(SHARED), OK);
    assert.equal(c!.lock(SHARED), OK);
    // a reads on, which keeps no writer out, as in another process.
    assert.equal(c!.lock(RESERVED), OK);
    assert.equal(a!.lock(RESERVED), BUSY);
  });
});

Deno.test("classic locks: checkReserved sees a RESERVED of this process, which the kernel does not report to it", async () => {
  await withConnections(2, ([a, b]) => {
    assert.equal(a!.lock(SHARED), OK);
    assert.equal(b!.lock(SHARED), OK);
    assert.equal(b!.checkReserved(), false);
    assert.equal(a!.lock(RESERVED), OK);
    assert.equal(
      libc.conflicts(0, 1, 0x40000001, 1),
      false,
      "the kernel reports no lock of this process",
    );
    assert.equal(b!.checkReserved(), true);
    assert.equal(a!.unlock(SHARED), OK);
    assert.equal(b!.checkReserved(), false);
  });
});

Deno.test("classic locks: the process's RESERVED and EXCLUSIVE exclude a native writer in another process, and the locks are the same bytes as os_unix.c's", async () => {
  await withConnections(1, ([a], path) => {
    assert.equal(a!.lock(SHARED), OK);
    assert.equal(nativeCanWrite(path), true);
    assert.equal(a!.lock(RESERVED), OK);
    assert.deepEqual(locksOn(path), [
      SHARED_RANGE,
      "WRITE 1073741825 1073741825",
    ]);
    assert.equal(nativeCanWrite(path), false);
    assert.equal(a!.lock(EXCLUSIVE), OK);
    // One owner's adjacent write locks are one range to the kernel.
    assert.deepEqual(locksOn(path), ["WRITE 1073741824 1073742335"]);
    assert.equal(a!.unlock(SHARED), OK);
    assert.deepEqual(locksOn(path), [SHARED_RANGE]);
    assert.equal(nativeCanWrite(path), true);
    assert.equal(a!.close(), true);
    assert.deepEqual(locksOn(path), []);
  });
});
