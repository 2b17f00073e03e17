/**
 * The platform table of the Deno file VFS (`deno/platform.ts`): struct
 * flock's layouts, encoded and decoded against hand-laid bytes; the lock
 * style each system gets; what a full sync calls; the refusals; and, on the
 * system running the tests, the table against the kernel.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  decodeFlock,
  encodeFlock,
  type Flock,
  locksFor,
  platformFor,
  syncCall,
} from "../deno/platform.ts";
import { loadLibc, symbolsOf } from "../deno/libc.ts";

/** The bytes of a struct flock laid out by hand, little-endian. */
function bytes(
  size: number,
  fields: [offset: number, width: 2 | 4 | 8, value: number][],
): Uint8Array {
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  for (const [offset, width, value] of fields) {
    if (width === 2) view.setInt16(offset, value, true);
    else if (width === 4) view.setInt32(offset, value, true);
    else view.setBigInt64(offset, BigInt(value), true);
  }
  return out;
}

const FLOCK: Flock = {
  type: 3,
  whence: 0,
  start: 0x40000002,
  len: 510,
  pid: 4242,
};

/** Encodes FLOCK into garbage-filled memory, and decodes it back. */
function roundTrip(os: string, arch: string): [Uint8Array, Flock] {
  const { flock } = platformFor(os, arch);
  const memory = new Uint8Array(flock.size).fill(0xee);
  const view = new DataView(memory.buffer);
  encodeFlock(flock, view, FLOCK);
  return [memory, decodeFlock(flock, view)];
}

for (const arch of ["x86_64", "aarch64"]) {
  Deno.test(`struct flock on Linux ${arch} is l_type, l_whence, l_start, l_len, l_pid (32 bytes), and decodes as encoded`, () => {
    const [memory, decoded] = roundTrip("linux", arch);
    assert.deepEqual(
      memory,
      bytes(32, [[0, 2, 3], [2, 2, 0], [8, 8, 0x40000002], [16, 8, 510], [
        24,
        4,
        4242,
      ]]),
    );
    assert.deepEqual(decoded, FLOCK);
  });

  Deno.test(`struct flock on macOS ${arch} is l_start, l_len, l_pid, l_type, l_whence (24 bytes), and decodes as encoded`, () => {
    const [memory, decoded] = roundTrip("darwin", arch);
    assert.deepEqual(
      memory,
      bytes(24, [[0, 8, 0x40000002], [8, 8, 510], [16, 4, 4242], [20, 2, 3], [
        22,
        2,
        0,
      ]]),
    );
    assert.deepEqual(decoded, FLOCK);
  });
}

Deno.test("struct flock on FreeBSD adds l_sysid (zero) after the BSD fields, 32 bytes; OpenBSD's and NetBSD's are macOS's", () => {
  const [memory, decoded] = roundTrip("freebsd", "x86_64");
  assert.deepEqual(
    memory,
    bytes(32, [[0, 8, 0x40000002], [8, 8, 510], [16, 4, 4242], [20, 2, 3], [
      22,
      2,
      0,
    ], [24, 4, 0]]),
  );
  assert.deepEqual(decoded, FLOCK);
  for (const os of ["openbsd", "netbsd"]) {
    assert.deepEqual(roundTrip(os, "x86_64"), roundTrip("darwin", "x86_64"));
  }
});

Deno.test("the table gives each system its headers' lock commands, lock types, errno values and library", () => {
  const linux = platformFor("linux", "x86_64");
  assert.deepEqual(
    [linux.fcntl, linux.lockTypes, linux.library],
    [
      {
        F_GETLK: 5,
        F_SETLK: 6,
        F_SETLKW: 7,
        F_OFD_GETLK: 36,
        F_OFD_SETLK: 37,
        F_OFD_SETLKW: 38,
      },
      { F_RDLCK: 0, F_WRLCK: 1, F_UNLCK: 2 },
      "libc.so.6",
    ],
  );
  const mac = platformFor("darwin", "aarch64");
  assert.deepEqual(
    [mac.fcntl, mac.lockTypes, mac.library],
    [
      { F_GETLK: 7, F_SETLK: 8, F_SETLKW: 9, F_FULLFSYNC: 51 },
      { F_RDLCK: 1, F_WRLCK: 3, F_UNLCK: 2 },
      "libSystem.B.dylib",
    ],
  );
  const freebsd = platformFor("freebsd", "x86_64");
  assert.deepEqual(
    [freebsd.fcntl, freebsd.library],
    [{ F_GETLK: 11, F_SETLK: 12, F_SETLKW: 13 }, "libc.so.7"],
  );
  for (const platform of [linux, mac, freebsd]) {
    assert.equal(platform.errno.EINTR, 4);
    assert.equal(platform.errno.EACCES, 13);
  }
  assert.deepEqual(
    [linux.errno.EAGAIN, mac.errno.EAGAIN, freebsd.errno.EAGAIN],
    [11, 35, 35],
  );
  assert.deepEqual(
    [mac.open.O_CREAT, mac.open.O_EXCL, mac.open.O_CLOEXEC],
    [0x200, 0x800, 0x1000000],
  );
  // x86_64 macOS keeps the 32-bit-inode struct stat under the plain names.
  assert.deepEqual(
    [
      platformFor("darwin", "x86_64").symbols.fstat,
      mac.symbols.fstat,
    ],
    ["fstat$INODE64", "fstat"],
  );
});

Deno.test("Linux gets open file description locks, macOS and the BSDs classic POSIX locks, and LEASED_OUTBOX_VFS_LOCKS=posix forces the classic ones", () => {
  const linux = platformFor("linux", "x86_64");
  assert.equal(locksFor(linux, undefined), "ofd");
  assert.equal(locksFor(linux, ""), "ofd");
  assert.equal(locksFor(linux, "posix"), "posix");
  for (const os of ["darwin", "freebsd", "openbsd", "netbsd"]) {
    assert.equal(locksFor(platformFor(os, "x86_64"), undefined), "posix", os);
  }
  assert.throws(
    () => locksFor(linux, "ofd"),
    new Error(
      'LEASED_OUTBOX_VFS_LOCKS must be "posix" or unset: current value is "ofd"',
    ),
  );
});

Deno.test("on Apple's arm64 the variadic argument of open and fcntl follows six padding arguments, so that it goes on the stack as a variadic one does; elsewhere it follows the named ones", () => {
  const apple = symbolsOf(platformFor("darwin", "aarch64"));
  assert.deepEqual(apple.fcntl.parameters, [
    "i32",
    "i32",
    ...Array(6).fill("i64"),
    "buffer",
  ]);
  assert.deepEqual(apple.open.parameters, [
    "buffer",
    "i32",
    ...Array(6).fill("i64"),
    "i64",
  ]);
  for (const [os, arch] of [["darwin", "x86_64"], ["linux", "aarch64"]]) {
    const symbols = symbolsOf(platformFor(os!, arch!));
    assert.deepEqual(symbols.fcntl.parameters, ["i32", "i32", "buffer"]);
    assert.deepEqual(symbols.open.parameters, ["buffer", "i32", "i64"]);
  }
});

Deno.test("Windows is refused with an error naming openNodeSqlite", () => {
  assert.throws(
    () => platformFor("windows", "x86_64"),
    /Windows does not have: on Windows, open the database with openNodeSqlite/,
  );
  assert.throws(() => platformFor("aix", "ppc64"), /openNodeSqlite/);
});

Deno.test("a full sync (PRAGMA fullfsync) is F_FULLFSYNC on macOS and the plain sync elsewhere", () => {
  const mac = platformFor("darwin", "aarch64");
  assert.equal(syncCall(mac, true), "F_FULLFSYNC");
  assert.equal(syncCall(mac, false), "fsync");
  const linux = platformFor("linux", "x86_64");
  assert.equal(syncCall(linux, true), "fdatasync");
  assert.equal(syncCall(linux, false), "fdatasync");
  assert.equal(syncCall(platformFor("freebsd", "x86_64"), true), "fsync");
});

Deno.test("on this system, the table's struct stat layout reads what Deno.statSync reads", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vfs_platform_" });
  try {
    const path = join(dir, "f.db");
    await Deno.writeFile(path, new Uint8Array(12345));
    const libc = loadLibc(path);
    const info = Deno.statSync(path);
    assert.deepEqual(libc.pathId(path), {
      dev: BigInt(info.dev),
      ino: BigInt(info.ino!),
    });
    assert.deepEqual(libc.stat(path), { regular: true, size: 12345 });
    assert.deepEqual(libc.stat(dir), {
      regular: false,
      size: Deno.statSync(dir).size,
    });
    assert.equal(libc.stat(join(dir, "absent")), undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
