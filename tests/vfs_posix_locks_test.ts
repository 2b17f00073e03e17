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
import { PosixLockSet, ProcessLocks, YIELD_MS } from "../deno/posix_locks.ts";
import {
  BUSY,
  EXCLUSIVE,
  NONE,
  OK,
  PENDING,
  QUEUE_BYTE,
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

/**
 * Runs `fn` while another process holds a read lock on `byte` of `path`, as
 * a process whose writer waits for RESERVED holds QUEUE_BYTE.
 */
async function whileLockedElsewhere(
  path: string,
  byte: number,
  fn: () => Promise<void> | void,
): Promise<void> {
  const libcUrl = new URL("../deno/libc.ts", import.meta.url).href;
  const platformUrl = new URL("../deno/platform.ts", import.meta.url).href;
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "eval",
      `import { bindLibc } from ${JSON.stringify(libcUrl)};
       import { platformFor } from ${JSON.stringify(platformUrl)};
       const libc = bindLibc(platformFor(Deno.build.os, Deno.build.arch), "posix");
       const fd = libc.open(${
        JSON.stringify(path)
      }, { write: true, create: false, createNew: false });
       if (!libc.setLock(fd, 0, ${byte}, 1)) throw new Error("not locked");
       console.log("locked");
       for await (const _ of Deno.stdin.readable) break;`,
    ],
    stdin: "piped",
    stdout: "piped",
  }).spawn();
  const reader = child.stdout.getReader();
  try {
    const { value } = await reader.read();
    assert.equal(new TextDecoder().decode(value).trim(), "locked");
    await fn();
  } finally {
    reader.releaseLock();
    await child.stdin.close();
    await child.stdout.cancel();
    await child.status;
  }
}

Deno.test("classic locks: a writer that let RESERVED go just now lets a waiting writer of another process in first, and takes RESERVED once that one has had its chance", async () => {
  await withConnections(1, async ([a], path) => {
    assert.equal(a!.lock(SHARED), OK);
    assert.equal(a!.lock(RESERVED), OK);
    assert.equal(a!.unlock(SHARED), OK);
    // No one waits: the writer begins again at once.
    assert.equal(a!.lock(RESERVED), OK);
    await whileLockedElsewhere(path, QUEUE_BYTE, async () => {
      assert.equal(a!.unlock(SHARED), OK);
      const released = performance.now();
      const refused = a!.lock(RESERVED);
      // (Unless this process was held up past the yield between the calls.)
      if (performance.now() - released < YIELD_MS) assert.equal(refused, BUSY);
      await new Promise((resolve) => setTimeout(resolve, YIELD_MS + 5));
      assert.equal(a!.lock(RESERVED), OK);
    });
    assert.equal(a!.unlock(NONE), OK);
    assert.deepEqual(locksOn(path), []);
  });
});

Deno.test("classic locks: a writer refused RESERVED by another process queues its process (a read lock on QUEUE_BYTE) until it gets RESERVED", async () => {
  await withConnections(1, async ([a], path) => {
    assert.equal(a!.lock(SHARED), OK);
    await whileLockedElsewhere(path, 0x40000001, () => {
      // The other process's read lock on RESERVED stands for a writer's.
      assert.equal(a!.lock(RESERVED), BUSY);
      assert.ok(locksOn(path).includes("READ 1073742337 1073742337"));
    });
    assert.equal(a!.lock(RESERVED), OK);
    assert.deepEqual(
      locksOn(path).filter((lock) => lock.includes("1073742337")),
      [],
    );
    assert.equal(a!.close(), true);
  });
});
