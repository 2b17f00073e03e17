/**
 * A database file shared by the Deno file VFS and node:sqlite in the same
 * process. This needs Linux's open file description locks, which exclude
 * the process's own classic POSIX locks (node:sqlite's): with classic locks
 * (macOS, the BSDs, or `LEASED_OUTBOX_VFS_LOCKS=posix`), the process's
 * locks are one, as two copies of SQLite in one process
 * (https://sqlite.org/howtocorrupt.html, 2.2.1), so these tests are ignored
 * there and `deno task test:vfs-posix` leaves this file out.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { Outbox } from "../mod.ts";
import { classicLocks, nativeSql } from "./fixtures/vfs_locks.ts";
import { tempDir } from "./helpers.ts";

const test = classicLocks() ? Deno.test.ignore : Deno.test;

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  await using tmp = await tempDir("vfs_same_process_");
  await fn(tmp.path);
}

/** As {@linkcode nativeSql}, which must succeed; returns its output. */
function sqlite3Ok(path: string, sql: string): string {
  const { code, stdout, stderr } = nativeSql(path, sql);
  assert.equal(code, 0, stderr);
  return stdout;
}

test("closing a WASM connection while another stays open keeps node:sqlite's POSIX locks in the same process", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "mixed.db");
    await using keeper = await openSqliteWasm(path);
    await keeper.exec("CREATE TABLE t(x)");
    const native = new DatabaseSync(path);
    try {
      native.exec("BEGIN IMMEDIATE; INSERT INTO t VALUES (1)");
      const passerby = await openSqliteWasm(path);
      await passerby.query("SELECT count(*) FROM t");
      await passerby.close();
      // Another process still finds node:sqlite's RESERVED lock.
      const output = nativeSql(path, "BEGIN IMMEDIATE; COMMIT;");
      assert.notEqual(output.code, 0);
      assert.match(output.stderr, /database is locked/);
      native.exec("COMMIT");
    } finally {
      native.close();
    }
    assert.deepEqual(await keeper.query("SELECT count(*) AS n FROM t"), [{
      n: 1,
    }]);
  });
});

test("WAL with native SQLite: node:sqlite here and sqlite3 in another process read and write one WAL file with WASM connections, and a WASM close keeps node:sqlite's WAL lock", async () => {
  await using tmp = await tempDir("vfs_wal_");
  const dir = tmp.path;
  const path = join(dir, "mixed_wal.db");
  await using wasm = await openSqliteWasm(path, { journalMode: "wal" });
  await wasm.exec("CREATE TABLE t(x INTEGER) STRICT");
  const native = new DatabaseSync(path);
  try {
    for (let i = 0; i < 20; i++) {
      await wasm.run("INSERT INTO t VALUES (?)", [i]);
      native.prepare("INSERT INTO t VALUES (?)").run(100 + i);
      sqlite3Ok(path, `INSERT INTO t VALUES (${200 + i})`);
    }
    const expected = 190 + 20 * 100 + 190 + 20 * 200 + 190;
    assert.deepEqual(await wasm.query("SELECT sum(x) AS s FROM t"), [{
      s: expected,
    }]);
    assert.deepEqual(
      { ...native.prepare("SELECT sum(x) AS s FROM t").get() },
      { s: expected },
    );
    // node:sqlite holds WAL's write lock, a POSIX lock on -shm; closing a
    // WASM connection must not close a -shm descriptor (that would drop it).
    native.exec("BEGIN IMMEDIATE; INSERT INTO t VALUES (1000)");
    const passerby = await openSqliteWasm(path, { journalMode: "wal" });
    assert.deepEqual(await passerby.query("SELECT count(*) AS n FROM t"), [{
      n: 60,
    }]);
    await passerby.close();
    const locked = nativeSql(path, "BEGIN IMMEDIATE; COMMIT;");
    assert.notEqual(locked.code, 0);
    assert.match(locked.stderr, /database is locked/);
    native.exec("COMMIT");
  } finally {
    native.close();
  }
  assert.deepEqual(await wasm.query("SELECT count(*) AS n FROM t"), [{
    n: 61,
  }]);
  assert.deepEqual(await wasm.query("PRAGMA integrity_check"), [{
    integrity_check: "ok",
  }]);
});

test("with default options, an outbox on the WASM driver and one on node:sqlite (whose default is WAL) share a file, in either order", async () => {
  await using tmp = await tempDir("vfs_wal_");
  for (const first of ["node", "wasm"] as const) {
    const path = join(tmp.path, `${first}_first.db`);
    const open = (driver: "node" | "wasm") =>
      driver === "node" ? openNodeSqlite(path) : openSqliteWasm(path);
    await using a = await Outbox.open(await open(first));
    await a.enqueue({ from: first });
    await using b = await Outbox.open(
      await open(first === "node" ? "wasm" : "node"),
    );
    await b.enqueue({ from: "second" });
    const lease = await b.claim();
    assert.deepEqual(lease?.payload, { from: first });
    await b.acknowledge(lease!);
    assert.deepEqual((await a.claim())?.payload, { from: "second" });
    // The WAL's size (in WAL mode) is wal_growth_test.ts's.
    const { wal: _, ...counts } = await a.stats();
    assert.deepEqual(counts, {
      pending: 0,
      leased: 1,
      done: 1,
      dead: 0,
      oldestPendingAgeMs: 0,
    });
  }
});
