/**
 * WAL by default where it is safe: a new file gets WAL with synchronous
 * FULL on both SQLite drivers, and an existing file keeps its mode (a WAL
 * file stays in WAL, a rollback-journal file keeps a rollback journal).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import type { Driver } from "../driver.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { tempDir } from "./helpers.ts";

const DRIVERS: ReadonlyArray<
  readonly [string, (path: string) => Promise<Driver & AsyncDisposable>]
> = [
  ["the WASM file driver", (path) => openSqliteWasm(path)],
  ["node:sqlite", (path) => openNodeSqlite(path)],
];

async function modes(driver: Driver) {
  const [journal] = await driver.query("PRAGMA journal_mode");
  const [synchronous] = await driver.query("PRAGMA synchronous");
  return [journal?.["journal_mode"], synchronous?.["synchronous"]];
}

/** The WASM driver's VFS shares a WAL index on x86-64 only. */
const WAL = Deno.build.arch === "x86_64" ? "wal" : "truncate";

for (const [name, open] of DRIVERS) {
  Deno.test(`on ${name}, a new file opened with the defaults is in WAL mode with synchronous FULL, and stays in WAL when reopened`, async () => {
    await using tmp = await tempDir("wal_default_");
    const path = join(tmp.path, "new.db");
    {
      await using db = await open(path);
      assert.deepEqual(await modes(db), [
        name === "node:sqlite" ? "wal" : WAL,
        2,
      ]);
      await db.exec("CREATE TABLE t(x)");
    }
    await using again = await open(path);
    assert.deepEqual(await modes(again), [
      name === "node:sqlite" ? "wal" : WAL,
      2,
    ]);
  });

  Deno.test(`on ${name}, an existing file in a rollback-journal mode keeps a rollback journal with the defaults`, async () => {
    await using tmp = await tempDir("wal_default_");
    const path = join(tmp.path, "old.db");
    const native = new DatabaseSync(path);
    native.exec("PRAGMA journal_mode = delete; CREATE TABLE t(x)");
    native.close();
    {
      await using db = await open(path);
      // Each driver's rollback journal: WASM's "truncate", SQLite's "delete".
      assert.deepEqual(await modes(db), [
        name === "node:sqlite" ? "delete" : "truncate",
        2,
      ]);
      await db.run("INSERT INTO t VALUES (1)");
    }
    // Nothing switched the file to WAL (a WAL file's header says 2).
    const header = (await Deno.readFile(path)).subarray(18, 20);
    assert.deepEqual([...header], [1, 1]);
  });
}

Deno.test("an empty file opened read-only with the defaults opens with a rollback journal and stays empty", async () => {
  await using tmp = await tempDir("wal_default_");
  const path = join(tmp.path, "empty.db");
  await Deno.writeFile(path, new Uint8Array());
  {
    await using db = await openSqliteWasm(new URL(`file://${path}?mode=ro`));
    assert.deepEqual(await modes(db), ["truncate", 2]);
  }
  {
    await using db = await openNodeSqlite(path, { readOnly: true });
    assert.deepEqual(await modes(db), ["delete", 2]);
  }
  assert.equal((await Deno.stat(path)).size, 0);
});
