/**
 * A database renamed or deleted under an open connection: SQLite's pager
 * asks the VFS whether the file moved (SQLITE_FCNTL_HAS_MOVED) before each
 * write transaction's journal, and fails the write with
 * SQLITE_READONLY_DBMOVED, as native SQLite does; nothing reported committed
 * is lost. In WAL mode, which the pager does not check, the VFS and the
 * node:sqlite driver do.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseMovedError, type Driver, Outbox } from "../mod.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { OutboxReader } from "../reader.ts";

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
    await using outbox = await Outbox.open(
      await openSqliteWasm(path, { journalMode: "truncate" }),
    );
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
    await using outbox = await Outbox.open(
      await openSqliteWasm(path, { journalMode: "truncate" }),
    );
    await outbox.enqueue({ before: true });
    await Deno.copyFile(path, copy);
    await Deno.remove(path);
    for (let i = 0; i < 5; i++) {
      await assert.rejects(outbox.enqueue({ i }), isMoved);
    }
    // A new file at the old name is not the open one either.
    await Deno.copyFile(copy, path);
    await assert.rejects(outbox.enqueue({ i: 5 }), isMoved);
    await using fresh = await Outbox.open(
      await openSqliteWasm(path, { journalMode: "truncate" }),
    );
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

/**
 * In WAL mode the pager never asks whether the file moved: the VFS checks
 * when a write transaction takes the WAL's write lock, and node:sqlite's
 * driver before each COMMIT.
 */
const WAL_DRIVERS = [
  [
    "the WASM file driver",
    (path: string) => openSqliteWasm(path, { journalMode: "wal" }),
  ],
  [
    "node:sqlite",
    (path: string) => openNodeSqlite(path, { journalMode: "wal" }),
  ],
] as const;

for (const [name, open] of WAL_DRIVERS) {
  Deno.test(`in WAL mode on ${name}, after a rename, enqueue and acknowledge fail with DatabaseMovedError and every reported commit is in the renamed file`, async () => {
    await withDir(async (dir) => {
      const path = join(dir, "outbox.db");
      const renamed = join(dir, "renamed.db");
      {
        await using outbox = await Outbox.open(await open(path));
        for (let i = 0; i < 5; i++) await outbox.enqueue({ i });
        const lease = await outbox.claim();
        assert.ok(lease !== null);
        await Deno.rename(path, renamed);
        await assert.rejects(outbox.enqueue({ i: 5 }), isMoved);
        await assert.rejects(outbox.acknowledge(lease), isMoved);
      }
      // SQLite does not checkpoint a moved file at close: the commits made
      // before the rename are in its WAL, which keeps the old name.
      await Deno.rename(`${path}-wal`, `${renamed}-wal`);
      await Deno.remove(`${path}-shm`);
      await using again = await Outbox.open(await open(renamed));
      const stats = await again.stats();
      assert.deepEqual([stats.pending, stats.leased, stats.done], [4, 1, 0]);
    });
  });

  Deno.test(`in WAL mode on ${name}, after the file is deleted, enqueues fail with DatabaseMovedError instead of reporting commits that nobody can read`, async () => {
    await withDir(async (dir) => {
      const path = join(dir, "outbox.db");
      await using outbox = await Outbox.open(await open(path));
      await outbox.enqueue({ before: true });
      await Deno.remove(path);
      for (let i = 0; i < 3; i++) {
        await assert.rejects(outbox.enqueue({ i }), isMoved);
      }
      await assert.rejects(outbox.claim(), isMoved);
    });
  });

  Deno.test(`in WAL mode on ${name}, after another file replaces it, writes fail with DatabaseMovedError`, async () => {
    await withDir(async (dir) => {
      const path = join(dir, "outbox.db");
      const other = join(dir, "other.db");
      {
        await using replacement = await Outbox.open(
          await open(other),
        );
        await replacement.enqueue({ replacement: true });
      }
      {
        await using outbox = await Outbox.open(await open(path));
        await outbox.enqueue({ before: true });
        await Deno.rename(other, path);
        await assert.rejects(outbox.enqueue({ after: true }), isMoved);
      }
      // The old connection's WAL keeps the path's name: it must go before
      // the new file is opened (see docs/wal.md).
      await Deno.remove(`${path}-wal`);
      await Deno.remove(`${path}-shm`);
      await using fresh = await Outbox.open(await open(path));
      assert.deepEqual((await fresh.claim())?.payload, { replacement: true });
      assert.equal(await fresh.claim(), null);
    });
  });
}

/**
 * Every read of an `Outbox` but `nextDueInMs` runs in a `BEGIN IMMEDIATE`
 * transaction; `OutboxReader`'s in a deferred one.
 */
const OUTBOX_READS = {
  stats: (outbox: Outbox) => outbox.stats(),
  queues: (outbox: Outbox) => outbox.queues(),
  list: (outbox: Outbox) => outbox.list({ state: "pending" }),
  explain: (outbox: Outbox) => outbox.explain(1),
  deadLetters: (outbox: Outbox) => outbox.deadLetters(),
  eventIdByDedupKey: (outbox: Outbox) =>
    outbox.eventIdByDedupKey(undefined, "k"),
  "transaction(SELECT)": (outbox: Outbox) =>
    outbox.transaction((tx) => tx.query("SELECT count(*) FROM outbox_events")),
};

/** What each read answers after a rename: "ok" or the error's name. */
async function readsAfterRename(
  open: (path: string) => Promise<Driver>,
): Promise<Record<string, string>> {
  const answers: Record<string, string> = {};
  await withDir(async (dir) => {
    const path = join(dir, "outbox.db");
    await using outbox = await Outbox.open(await open(path));
    await outbox.enqueue({ n: 1 });
    await using reader = await OutboxReader.open(await open(path));
    await Deno.rename(path, join(dir, "renamed.db"));
    const answer = (read: Promise<unknown>) =>
      read.then(() => "ok", (error) => {
        isMoved(error);
        return "moved";
      });
    for (const [name, read] of Object.entries(OUTBOX_READS)) {
      answers[name] = await answer(read(outbox));
    }
    answers.nextDueInMs = await answer(outbox.nextDueInMs());
    answers["reader.list"] = await answer(reader.list({ state: "pending" }));
    answers["reader.explain"] = await answer(reader.explain(1));
  });
  return answers;
}

const everyOutboxRead = (answer: string) =>
  Object.fromEntries(Object.keys(OUTBOX_READS).map((name) => [name, answer]));

Deno.test("after a rename, on the WASM file driver in truncate mode, every read goes on", async () => {
  assert.deepEqual(
    await readsAfterRename((path) =>
      openSqliteWasm(path, { journalMode: "truncate" })
    ),
    {
      ...everyOutboxRead("ok"),
      nextDueInMs: "ok",
      "reader.list": "ok",
      "reader.explain": "ok",
    },
  );
});

Deno.test("after a rename, on the WASM file driver in WAL mode, every Outbox read but nextDueInMs fails with DatabaseMovedError (it takes the WAL's write lock), and OutboxReader's reads go on", async () => {
  assert.deepEqual(
    await readsAfterRename((path) =>
      openSqliteWasm(path, { journalMode: "wal" })
    ),
    {
      ...everyOutboxRead("moved"),
      nextDueInMs: "ok",
      "reader.list": "ok",
      "reader.explain": "ok",
    },
  );
});

for (const journalMode of ["truncate", "wal"] as const) {
  Deno.test(`after a rename, on node:sqlite in ${journalMode} mode, every read in a transaction fails with DatabaseMovedError (the driver checks before each COMMIT), and nextDueInMs goes on`, async () => {
    assert.deepEqual(
      await readsAfterRename((path) => openNodeSqlite(path, { journalMode })),
      {
        ...everyOutboxRead("moved"),
        nextDueInMs: "ok",
        "reader.list": "moved",
        "reader.explain": "moved",
      },
    );
  });
}

for (const [name, open] of WAL_DRIVERS) {
  Deno.test(`in WAL mode on ${name}, commits not yet checkpointed when the file was renamed stay in the old name's -wal: the file opened at its new name has none of them`, async () => {
    await withDir(async (dir) => {
      const path = join(dir, "outbox.db");
      const renamed = join(dir, "renamed.db");
      {
        await using outbox = await Outbox.open(await open(path));
        for (let i = 0; i < 3; i++) await outbox.enqueue({ i });
        await Deno.rename(path, renamed);
      }
      assert.ok((await Deno.stat(`${path}-wal`)).size > 0);
      {
        // The schema was in that WAL too: this is a new, empty outbox.
        await using again = await Outbox.open(await open(renamed));
        assert.equal((await again.stats()).pending, 0);
      }
    });
  });
}
