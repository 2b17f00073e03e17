/**
 * A database renamed or deleted under an open connection: SQLite's pager
 * asks the VFS whether the file moved (SQLITE_FCNTL_HAS_MOVED) before each
 * write transaction's journal, and fails the write with
 * SQLITE_READONLY_DBMOVED, as native SQLite does; nothing reported committed
 * is lost.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseMovedError, Outbox } from "../mod.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

function isMoved(error: unknown): boolean {
  assert.ok(error instanceof DatabaseMovedError, String(error));
  assert.equal(error.code, 1032);
  assert.match(error.message, /renamed, deleted or replaced/);
  return true;
}

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_moved_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("after a rename, writes through the old name fail with SQLITE_READONLY_DBMOVED and every reported commit is in the renamed file", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "outbox.db");
    const renamed = join(dir, "renamed.db");
    await using outbox = await Outbox.open(await openSqliteWasm(path));
    for (let i = 0; i < 5; i++) await outbox.enqueue({ i });
    await Deno.rename(path, renamed);
    await assert.rejects(outbox.enqueue({ i: 5 }), isMoved);
    // Reads still work: the open file is the same.
    assert.equal((await outbox.stats()).pending, 5);
    await using again = await Outbox.open(await openSqliteWasm(renamed));
    await again.enqueue({ i: 6 });
    assert.equal((await again.stats()).pending, 6);
  });
});

Deno.test("after the file is deleted, writes fail with SQLITE_READONLY_DBMOVED instead of reporting commits that nobody can read", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "outbox.db");
    const copy = join(dir, "copy.db");
    await using outbox = await Outbox.open(await openSqliteWasm(path));
    await outbox.enqueue({ before: true });
    await Deno.copyFile(path, copy);
    await Deno.remove(path);
    for (let i = 0; i < 5; i++) {
      await assert.rejects(outbox.enqueue({ i }), isMoved);
    }
    // A new file at the old name is not the open one either.
    await Deno.copyFile(copy, path);
    await assert.rejects(outbox.enqueue({ i: 5 }), isMoved);
    await using fresh = await Outbox.open(await openSqliteWasm(path));
    assert.equal((await fresh.stats()).pending, 1);
  });
});

Deno.test("node:sqlite's own SQLITE_READONLY_DBMOVED after a rename is the same typed error", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "outbox.db");
    await using outbox = await Outbox.open(
      await openNodeSqlite(path, { journalMode: "truncate" }),
    );
    await outbox.enqueue({ i: 0 });
    await Deno.rename(path, join(dir, "renamed.db"));
    await assert.rejects(outbox.enqueue({ i: 1 }), isMoved);
  });
});
