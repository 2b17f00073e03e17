/**
 * The VFS's last close of a file while this process holds classic POSIX
 * locks on it by other means than the VFS (taken here through libc), under
 * either kind of the VFS's own locks (also run by `test:vfs-posix`): it
 * parks its descriptors until those locks are gone (deno/inodes.ts). The
 * cases with node:sqlite, which need open file description locks, are in
 * tests/vfs_parked_descriptors_test.ts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { MAX_PARKED, parkedDescriptors } from "../deno/inodes.ts";
import { SqliteError } from "../errors.ts";
import { bindLibc, F_RDLCK } from "../deno/libc.ts";
import { platformFor } from "../deno/platform.ts";
import {
  ClassicLockHolder,
  classicLocksOn,
  descriptorsOn,
  FOREIGN_BYTE,
  passBy,
} from "./fixtures/vfs_locks.ts";
import { tempDir } from "./helpers.ts";

Deno.test("a classic lock the process holds on the file by other means survives the VFS's last close, and its descriptors close once the lock is gone", async () => {
  await using tmp = await tempDir("vfs_parked_");
  const dir = Deno.realPathSync(tmp.path);
  const path = join(dir, "locked.db");
  {
    await using db = await openSqliteWasm(path);
    await db.exec("CREATE TABLE t (x)");
  }
  assert.equal(descriptorsOn(path), 0);
  const lock = `READ ${FOREIGN_BYTE} ${FOREIGN_BYTE}`;
  {
    using holder = new ClassicLockHolder();
    holder.lock(path);
    await passBy(path);
    assert.deepEqual(classicLocksOn(path), [lock]);
    assert.ok(descriptorsOn(path) > 1);
    // The next connection takes the parked descriptors.
    const parked = descriptorsOn(path);
    await passBy(path);
    assert.equal(descriptorsOn(path), parked);
    assert.deepEqual(classicLocksOn(path), [lock]);
  }
  assert.deepEqual(classicLocksOn(path), []);
  await passBy(join(dir, "locked.db"));
  assert.equal(descriptorsOn(path), 0);
  assert.equal(parkedDescriptors(), 0);
});

Deno.test("a classic lock of the process behind another owner's lock on the file, which the kernel's lock test finds first, is found in the process's fdinfo and kept", async () => {
  await using tmp = await tempDir("vfs_parked_");
  const dir = Deno.realPathSync(tmp.path);
  const path = join(dir, "hidden.db");
  {
    await using db = await openSqliteWasm(path);
    await db.exec("CREATE TABLE t (x)");
  }
  // An open file description's lock first: the kernel keeps each owner's
  // locks in the order the owners came, and its test reports the first.
  const ofd = bindLibc(platformFor(Deno.build.os, Deno.build.arch), "ofd");
  const other = ofd.open(path, {
    write: false,
    create: false,
    createNew: false,
  });
  try {
    assert.ok(ofd.setLock(other, F_RDLCK, FOREIGN_BYTE - 1, 1));
    using holder = new ClassicLockHolder();
    holder.lock(path);
    await passBy(path);
    assert.deepEqual(classicLocksOn(path), [
      `READ ${FOREIGN_BYTE} ${FOREIGN_BYTE}`,
    ]);
    assert.ok(descriptorsOn(path) > 2);
  } finally {
    ofd.close(other);
  }
  await passBy(path);
  assert.equal(descriptorsOn(path), 0);
});

Deno.test(`with ${MAX_PARKED} descriptors parked, a connection to another file is refused, and opens once the locks are gone`, async () => {
  await using tmp = await tempDir("vfs_parked_");
  const dir = Deno.realPathSync(tmp.path);
  const paths: string[] = [];
  const next = join(dir, "next.db");
  {
    using holder = new ClassicLockHolder();
    while (parkedDescriptors() < MAX_PARKED) {
      const path = join(dir, `${paths.length}.db`);
      paths.push(path);
      // An empty file: SQLite reads it as an empty database.
      Deno.writeFileSync(path, new Uint8Array());
      holder.lock(path);
      const passerby = await openSqliteWasm(path);
      await passerby.query("SELECT 1");
      await passerby.close();
    }
    const held = paths.map(classicLocksOn);
    await assert.rejects(openSqliteWasm(next), (error: unknown) => {
      assert.ok(error instanceof SqliteError, String(error));
      assert.equal(error.code, 14);
      assert.match(
        error.message,
        /descriptors of other database files stay open in this process/,
      );
      return true;
    });
    assert.deepEqual(paths.map(classicLocksOn), held);
    // A file with parked descriptors opens through them.
    const parked = await openSqliteWasm(paths[0]!);
    await parked.close();
    assert.deepEqual(paths.map(classicLocksOn), held);
  }
  await using db = await openSqliteWasm(next);
  assert.equal(parkedDescriptors(), 0);
  await db.exec("CREATE TABLE t (x)");
});
