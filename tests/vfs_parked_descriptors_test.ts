/**
 * The VFS's last close of a file while the process holds classic POSIX
 * locks on it that are not the VFS's (deno/inodes.ts): closing any
 * descriptor of the file would drop them, so the VFS parks its descriptors
 * until the locks are gone. The node:sqlite cases need Linux's open file
 * description locks (with classic ones the process's locks are one, see
 * tests/vfs_same_process_test.ts) and are ignored under classic locks, so
 * `test:vfs-posix` leaves this file out; the cases with a lock taken
 * through libc, which run under both, are in tests/vfs_parked_classic_test.ts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { parkedDescriptors } from "../deno/inodes.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { Outbox } from "../mod.ts";
import {
  classicLocks,
  classicLocksOn,
  descriptorsOn,
  nativeSql,
  passBy,
} from "./fixtures/vfs_locks.ts";
import { tempDir } from "./helpers.ts";

const test = classicLocks() ? Deno.test.ignore : Deno.test;
const MODES = ["truncate", "wal"] as const;
const RESERVED = "WRITE 1073741825 1073741825";
const SHARED = "READ 1073741826 1073742335";
const WAL_WRITE_LOCK = "WRITE 120 120";

/** Another process's write transaction: refused, or what it said. */
function otherWriter(path: string, value: number): string {
  const { code, stderr } = nativeSql(
    path,
    `BEGIN IMMEDIATE; INSERT INTO t VALUES (${value}); COMMIT;`,
  );
  return code === 0 ? "committed" : stderr;
}

/** The process's classic locks on the database and its -shm. */
function classicLocksOnFiles(path: string): Record<string, string[]> {
  const locks: Record<string, string[]> = { db: classicLocksOn(path) };
  try {
    locks["shm"] = classicLocksOn(`${path}-shm`);
  } catch {
    // No -shm: a rollback journal mode.
  }
  return locks;
}

for (const mode of MODES) {
  test(`an openNodeSqlite outbox's transaction keeps its locks when the process's only WASM connection to the file closes (${mode}): another process is refused before and after, and its row committed later is kept`, async () => {
    await using tmp = await tempDir("vfs_parked_");
    const path = join(Deno.realPathSync(tmp.path), "outbox.db");
    await using outbox = await Outbox.open(
      await openNodeSqlite(path, { journalMode: mode }),
    );
    await outbox.transaction((tx) => tx.run("CREATE TABLE t (x INTEGER)"));
    await outbox.transaction(async (tx) => {
      await tx.run("INSERT INTO t VALUES (1)");
      await tx.enqueue({ row: 1 });
      assert.match(otherWriter(path, 98), /database is locked/);
      const before = classicLocksOnFiles(path);
      assert.ok(
        mode === "wal"
          ? before["shm"]!.includes(WAL_WRITE_LOCK)
          : before["db"]!.includes(RESERVED),
        JSON.stringify(before),
      );
      await passBy(path);
      assert.deepEqual(classicLocksOnFiles(path), before);
      assert.match(otherWriter(path, 99), /database is locked/);
    });
    assert.equal(otherWriter(path, 100), "committed");
    const rows = await outbox.transaction((tx) =>
      tx.query("SELECT x FROM t ORDER BY x")
    );
    assert.deepEqual(rows.map((row) => Number(row["x"])), [1, 100]);
    assert.deepEqual(
      nativeSql(
        path,
        "SELECT count(*) FROM outbox_events; PRAGMA integrity_check;",
      ).stdout.split("\n"),
      ["1", "ok"],
    );
  });

  test(`an application's own DatabaseSync in a write transaction keeps its locks when the process's only WASM connection to the file closes (${mode})`, async () => {
    await using tmp = await tempDir("vfs_parked_");
    const path = join(Deno.realPathSync(tmp.path), "app.db");
    const native = new DatabaseSync(path);
    try {
      native.exec(
        `PRAGMA journal_mode=${mode}; CREATE TABLE t (x); INSERT INTO t VALUES (0);`,
      );
      native.exec("BEGIN IMMEDIATE; INSERT INTO t VALUES (1);");
      assert.match(otherWriter(path, 98), /database is locked/);
      const before = classicLocksOnFiles(path);
      assert.ok(before["db"]!.includes(SHARED), JSON.stringify(before));
      await passBy(path);
      assert.deepEqual(classicLocksOnFiles(path), before);
      assert.match(otherWriter(path, 99), /database is locked/);
      native.exec("COMMIT");
      assert.equal(otherWriter(path, 100), "committed");
      assert.deepEqual(
        native.prepare("SELECT x FROM t ORDER BY x").all().map((row) => row.x),
        [0, 1, 100],
      );
      assert.deepEqual({ ...native.prepare("PRAGMA integrity_check").get() }, {
        integrity_check: "ok",
      });
    } finally {
      native.close();
    }
  });
}

test("the descriptors parked for an openNodeSqlite connection's locks are closed when it closes (WAL: the database's and the -shm's)", async () => {
  await using tmp = await tempDir("vfs_parked_");
  const path = join(Deno.realPathSync(tmp.path), "leak.db");
  const driver = await openNodeSqlite(path, { journalMode: "wal" });
  await driver.exec("CREATE TABLE t (x)");
  const native = {
    db: descriptorsOn(path),
    shm: descriptorsOn(`${path}-shm`),
  };
  await driver.exec("BEGIN IMMEDIATE; INSERT INTO t VALUES (1)");
  await passBy(path);
  assert.ok(descriptorsOn(path) > native.db);
  assert.ok(descriptorsOn(`${path}-shm`) > native.shm);
  await driver.exec("COMMIT");
  await driver.close();
  assert.deepEqual(
    { db: descriptorsOn(path), shm: descriptorsOn(`${path}-shm`) },
    { db: 0, shm: 0 },
  );
  assert.equal(parkedDescriptors(), 0);
});

test("the descriptors parked for an application's DatabaseSync are closed at the VFS's next open once it closed", async () => {
  await using tmp = await tempDir("vfs_parked_");
  const dir = Deno.realPathSync(tmp.path);
  const path = join(dir, "app.db");
  const native = new DatabaseSync(path);
  native.exec("CREATE TABLE t (x); BEGIN IMMEDIATE; INSERT INTO t VALUES (1)");
  await passBy(path);
  assert.ok(descriptorsOn(path) > 1);
  native.exec("COMMIT");
  native.close();
  // Nothing tells the VFS: its next open of any file looks again.
  assert.ok(descriptorsOn(path) > 0);
  await using other = await openSqliteWasm(join(dir, "other.db"));
  assert.equal(descriptorsOn(path), 0);
  assert.equal(parkedDescriptors(), 0);
  await other.exec("CREATE TABLE t (x)");
});
