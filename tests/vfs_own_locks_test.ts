/**
 * This process's byte-range locks as deno/proc_locks.ts reads them, from
 * the `lock:` lines of its own descriptors' `/proc/self/fdinfo`: exact
 * while other processes' locks churn `/proc/locks` (which the readers read
 * before, and which then misses or repeats a held lock now and then), and
 * none of another process's locks on the same file.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { bindLibc, F_RDLCK, F_WRLCK, type Libc } from "../deno/libc.ts";
import { platformFor } from "../deno/platform.ts";
import {
  classicLocks,
  type KernelLock,
  ownLocks,
  procLocksFile,
} from "../deno/proc_locks.ts";
import { startLockChurn } from "./fixtures/vfs_locks.ts";
import { tempDir } from "./helpers.ts";

const linux = Deno.build.os === "linux";
const platform = platformFor(Deno.build.os, Deno.build.arch);
const MODE = { write: true, create: false, createNew: false } as const;

/** An open file description lock on byte 10 and a classic one on 20-24. */
function holdTwoLocks(libc: { ofd: Libc; posix: Libc }, path: string) {
  const ofdFd = libc.ofd.open(path, MODE);
  const posixFd = libc.posix.open(path, MODE);
  assert.ok(libc.ofd.setLock(ofdFd, F_WRLCK, 10, 1));
  assert.ok(libc.posix.setLock(posixFd, F_RDLCK, 20, 5));
  return {
    id: libc.ofd.fileId(ofdFd),
    [Symbol.dispose]() {
      libc.ofd.close(ofdFd);
      libc.posix.close(posixFd);
    },
  };
}

/**
 * Runs `fn` while this process holds {@linkcode holdTwoLocks}'s two locks on
 * a file of a fresh directory and two other processes' 160 locks, 80 of
 * them churning, make `/proc/locks` longer than a page (`startLockChurn`,
 * its files in the same directory).
 */
async function underChurn(
  fn: (
    context: {
      held: ReturnType<typeof holdTwoLocks>;
      libc: { ofd: Libc; posix: Libc };
      dir: string;
    },
  ) => Promise<void> | void,
): Promise<void> {
  await using tmp = await tempDir("vfs_own_locks_");
  const path = join(tmp.path, "f");
  Deno.writeFileSync(path, new Uint8Array(1));
  const libc = {
    ofd: bindLibc(platform, "ofd"),
    posix: bindLibc(platform, "posix"),
  };
  using held = holdTwoLocks(libc, path);
  await using _churn = await startLockChurn(tmp.path);
  await fn({ held, libc, dir: tmp.path });
}

/** A lock as a line: "<OFD|POSIX> <READ|WRITE> <first> <last>". */
function line(lock: KernelLock): string {
  return `${lock.classic ? "POSIX" : "OFD"} ${
    lock.write ? "WRITE" : "READ"
  } ${lock.first} ${lock.last}`;
}

const HELD = ["OFD WRITE 10 10", "POSIX READ 20 24"];

Deno.test({
  name:
    "this process's locks read from its descriptors' fdinfo are exact in each of 1,000 looks while two other processes' 160 locks, 80 of them churning, make /proc/locks longer than a page and shift it between its pages; a classic lock is found every time",
  ignore: !linux,
  fn: () =>
    underChurn(({ held, libc }) => {
      assert.ok(Deno.readTextFileSync("/proc/locks").length > 4096);
      const wrong: string[] = [];
      let classicFound = 0;
      for (let look = 0; look < 1000; look++) {
        const locks = ownLocks(libc.ofd).on(held.id).map(line).sort();
        if (locks.join() !== HELD.join()) wrong.push(`${look}: ${locks}`);
        if (classicLocks(libc.ofd)!(held.id)) classicFound++;
      }
      assert.deepEqual(wrong, []);
      assert.equal(classicFound, 1000);
    }),
});

Deno.test({
  name:
    "/proc/locks, which the readers read before, misses or repeats locks held all along under the same churn (this process's two, and the 80 the churn's first locker holds): within 20,000 whole reads at least once (one read in a hundred for this process's two here, one in seven to two for all 82)",
  ignore: !linux,
  fn: () =>
    underChurn(({ held, dir }) => {
      // Where the locks sit in the listing (and so whether a shift before a
      // page's end moves them) depends on the processor each was taken on:
      // the holder's 80 lines, beside this process's two, make a shifted
      // line likelier on any machine.
      const files = new Set([
        procLocksFile(held.id),
        ...Array.from({ length: 80 }, (_, i) => {
          const { dev, ino } = Deno.statSync(join(dir, `h${i}`));
          return procLocksFile({ dev: BigInt(dev), ino: BigInt(ino!) });
        }),
      ]);
      let listed = 82;
      let reads = 0;
      while (listed === 82 && reads < 20_000) {
        reads++;
        listed = Deno.readTextFileSync("/proc/locks").split("\n")
          .filter((text) => files.has(text.trim().split(/\s+/)[5]!)).length;
      }
      assert.notEqual(listed, 82, `${reads} reads listed each lock once`);
    }),
});

Deno.test({
  name:
    "another process's locks on the same file, an open file description lock and a classic one, are not this process's: /proc/locks lists the three on the file, the fdinfo of this process's descriptors its one, and no classic lock of this process is found where it holds none",
  ignore: !linux,
  fn: async () => {
    await using tmp = await tempDir("vfs_own_locks_");
    const path = join(tmp.path, "f");
    Deno.writeFileSync(path, new Uint8Array(1));
    const libcUrl = new URL("../deno/libc.ts", import.meta.url).href;
    const platformUrl = new URL("../deno/platform.ts", import.meta.url).href;
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "eval",
        `import { bindLibc, F_RDLCK, F_WRLCK } from ${JSON.stringify(libcUrl)};
import { platformFor } from ${JSON.stringify(platformUrl)};
const platform = platformFor(Deno.build.os, Deno.build.arch);
const mode = { write: true, create: false, createNew: false };
const ofd = bindLibc(platform, "ofd");
const posix = bindLibc(platform, "posix");
if (!ofd.setLock(ofd.open(${
          JSON.stringify(path)
        }, mode), F_WRLCK, 30, 1)) throw 1;
if (!posix.setLock(posix.open(${
          JSON.stringify(path)
        }, mode), F_RDLCK, 10, 1)) throw 2;
console.log("ready");
for await (const _ of Deno.stdin.readable);`,
      ],
      stdin: "piped",
      stdout: "piped",
    }).spawn();
    try {
      const reader = child.stdout.getReader();
      assert.equal(
        new TextDecoder().decode((await reader.read()).value).trim(),
        "ready",
      );
      reader.releaseLock();
      const libc = bindLibc(platform, "ofd");
      const fd = libc.open(path, MODE);
      try {
        // A read lock on 20 (not conflicting with the child's classic
        // read lock on 10, nor its write lock on 30).
        assert.ok(libc.setLock(fd, F_RDLCK, 20, 1));
        const id = libc.fileId(fd);
        const file = ` ${procLocksFile(id)} `;
        assert.equal(
          Deno.readTextFileSync("/proc/locks").split("\n")
            .filter((text) => text.includes(file)).length,
          3,
        );
        assert.deepEqual(ownLocks(libc).on(id).map(line), ["OFD READ 20 20"]);
        assert.equal(classicLocks(libc)!(id), false);
      } finally {
        libc.close(fd);
      }
    } finally {
      await child.stdin.close();
      assert.equal((await child.status).code, 0);
      await child.stdout.cancel();
    }
  },
});

Deno.test({
  name:
    "with 3,000 descriptors open (/proc/self/fd read in more than one getdents64 call), a classic lock set through the last of them is found, and none once it is closed",
  ignore: !linux,
  fn: async () => {
    await using tmp = await tempDir("vfs_own_locks_");
    const path = join(tmp.path, "f");
    const other = join(tmp.path, "other");
    Deno.writeFileSync(path, new Uint8Array(1));
    Deno.writeFileSync(other, new Uint8Array(1));
    const files = Array.from({ length: 3000 }, () => Deno.openSync(other));
    try {
      const posix = bindLibc(platform, "posix");
      const fd = posix.open(path, MODE);
      assert.ok(fd > 3000);
      assert.ok(posix.setLock(fd, F_RDLCK, 20, 1));
      const id = posix.fileId(fd);
      assert.deepEqual(ownLocks(posix).on(id).map(line), ["POSIX READ 20 20"]);
      assert.equal(classicLocks(posix)!(id), true);
      posix.close(fd);
      assert.equal(classicLocks(posix)!(id), false);
    } finally {
      for (const file of files) file.close();
    }
  },
});
