/**
 * Event ids without AUTOINCREMENT (schema version 9): an id is never reused,
 * even after purge() deleted the highest ids, on a fresh file (no
 * `sqlite_sequence` written at each insert) and on a file upgraded from
 * version 8 (which keeps its AUTOINCREMENT declaration); a foreign insert
 * that would reuse an id is refused.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { type Outbox, Outbox as OutboxClass } from "../mod.ts";
import { driverTest } from "./helpers.ts";
import { SQLITE_DRIVERS } from "./drivers.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

/** Enqueues `n` events one at a time, claims and acknowledges them all. */
async function doneEvents(outbox: Outbox, n: number): Promise<number[]> {
  const ids = [];
  for (let i = 0; i < n; i++) ids.push((await outbox.enqueue({ i })).eventId);
  const leases = await outbox.claim({ max: n });
  assert.deepEqual(await outbox.acknowledge(leases), leases.map(() => true));
  return ids;
}

/**
 * Purges every event, then checks that batch and single enqueues take ids
 * above every id handed out before: a batch right after the purge starts
 * above the floor (a skipped element leaves its id unused); once an event
 * is above it, ids follow the highest one, a skipped element taking none,
 * as in a lone enqueue.
 */
async function neverReused(outbox: Outbox, highest: number): Promise<void> {
  assert.equal(await outbox.purge({ olderThanMs: 0 }), 3);
  const ids = async (events: { payload: unknown; dedupKey?: string }[]) =>
    (await outbox.enqueueBatch(events)).map((r) => [r.eventId, r.deduplicated]);
  assert.deepEqual(
    await ids([
      { payload: 1, dedupKey: "k" },
      { payload: 2, dedupKey: "k" },
      { payload: 3 },
    ]),
    [[highest + 1, false], [highest + 1, true], [highest + 3, false]],
  );
  assert.equal((await outbox.enqueue({ after: "batch" })).eventId, highest + 4);
  assert.deepEqual(
    await ids([{ payload: 5, dedupKey: "k" }, { payload: 6 }]),
    [[highest + 1, true], [highest + 5, false]],
  );
}

for (const driver of SQLITE_DRIVERS) {
  driverTest(
    driver,
    "a fresh file declares the event id without AUTOINCREMENT, and never reuses an id after purge() deleted the highest ones",
    async ({ clock, open, raw }) => {
      const [a] = await open();
      assert.doesNotMatch(
        String(
          (await raw.query(
            "SELECT sql FROM sqlite_schema WHERE name = 'outbox_events'",
          ))[0]?.["sql"],
        ),
        /AUTOINCREMENT/,
      );
      assert.deepEqual(await doneEvents(a!, 3), [1, 2, 3]);
      assert.deepEqual(
        await raw.query(
          "SELECT count(*) AS n FROM sqlite_schema WHERE name = 'sqlite_sequence'",
        ),
        [{ n: 0 }],
      );
      assert.deepEqual(await raw.query("SELECT seq FROM outbox_id_floor"), [
        { seq: 0 },
      ]);
      clock.advance(1);
      await neverReused(a!, 3);
      assert.deepEqual(await raw.query("SELECT seq FROM outbox_id_floor"), [
        { seq: 3 },
      ]);
    },
  );

  driverTest(
    driver,
    "an insert of other SQL that would take a deleted event's id is refused, naming outbox_id_floor; one above it is kept",
    async ({ clock, open, raw }) => {
      const [a] = await open();
      await doneEvents(a!, 3);
      clock.advance(1);
      assert.equal(await a!.purge({ olderThanMs: 0 }), 3);
      const insert = (columns: string, values: string) =>
        raw.run(
          `INSERT INTO outbox_events (${columns}queue, state, payload, due_at, max_attempts, created_at, updated_at)
          VALUES (${values}'default', 'pending', 'null', 0, 5, 0, 0)`,
        );
      await assert.rejects(() => insert("", ""), /outbox_id_floor/);
      await assert.rejects(() => insert("id, ", "2, "), /outbox_id_floor/);
      await insert("id, ", "9, ");
      assert.deepEqual(
        await raw.query(
          "SELECT id, identity IS NOT NULL AS named FROM outbox_events",
        ),
        [{ id: 9, named: 1 }],
      );
      assert.equal((await a!.enqueue({})).eventId, 10);
    },
  );
}

Deno.test("a version 8 file keeps AUTOINCREMENT when upgraded, its floor starts at its sqlite_sequence, and ids deleted before the upgrade are never reused", async () => {
  const dir = await Deno.makeTempDir({ prefix: "id_floor_" });
  try {
    const path = join(dir, "v8.db");
    const db = new DatabaseSync(path);
    db.exec(
      await Deno.readTextFile(
        new URL("./fixtures/schema_v8.sql", import.meta.url),
      ),
    );
    for (let n = 1; n <= 5; n++) {
      db.exec(
        `INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts, created_at, updated_at)
        VALUES ('default', 'pending', '${n}', 0, 5, ${n}, ${n})`,
      );
    }
    // Deleted by a release before version 9: only sqlite_sequence knows.
    db.exec("DELETE FROM outbox_events WHERE id >= 4");
    db.close();

    await using driver = await openSqliteWasm(path);
    let now = 1_000;
    await using outbox = await OutboxClass.open(driver, { now: () => now });
    assert.deepEqual(
      await driver.query("SELECT max(version) AS v FROM outbox_schema"),
      [{ v: 9 }],
    );
    assert.match(
      String(
        (await driver.query(
          "SELECT sql FROM sqlite_schema WHERE name = 'outbox_events'",
        ))[0]?.["sql"],
      ),
      /AUTOINCREMENT/,
    );
    assert.deepEqual(await driver.query("SELECT seq FROM outbox_id_floor"), [
      { seq: 5 },
    ]);
    assert.equal((await outbox.enqueue({ n: 6 })).eventId, 6);
    const leases = await outbox.claim({ max: 10 });
    assert.deepEqual(leases.map((l) => l.eventId), [1, 2, 3, 6]);
    await outbox.acknowledge(leases);
    now += 1;
    assert.equal(await outbox.purge({ olderThanMs: 0 }), 4);
    assert.deepEqual(await driver.query("SELECT seq FROM outbox_id_floor"), [
      { seq: 6 },
    ]);
    assert.deepEqual(
      (await outbox.enqueueBatch([{ payload: 7 }, { payload: 8 }])).map((r) =>
        r.eventId
      ),
      [7, 8],
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * Pages each of 20 lone enqueues wrote, one commit each: the WAL's frames
 * after the commit (`wal_checkpoint(PASSIVE)` answers them), emptied again
 * by a TRUNCATE checkpoint.
 */
async function pagesPerEnqueue(path: string): Promise<number[]> {
  await using driver = await openSqliteWasm(path, { journalMode: "wal" });
  await using outbox = await OutboxClass.open(driver);
  await driver.exec("PRAGMA wal_autocheckpoint = 0");
  const pages = async () => {
    const [row] = await driver.query("PRAGMA wal_checkpoint(PASSIVE)");
    await driver.query("PRAGMA wal_checkpoint(TRUNCATE)");
    return Number(row?.["log"]);
  };
  await pages();
  const written = [];
  for (let i = 0; i < 20; i++) {
    await outbox.enqueue({ i });
    written.push(await pages());
  }
  return written;
}

Deno.test("a lone enqueue's commit writes 4 pages on a fresh file (the row, its identity, claim and state index entries), 5 on an upgraded one, which keeps sqlite_sequence", async () => {
  const dir = await Deno.makeTempDir({ prefix: "id_floor_pages_" });
  try {
    assert.deepEqual(
      await pagesPerEnqueue(join(dir, "fresh.db")),
      Array(20).fill(4),
    );
    const db = new DatabaseSync(join(dir, "v8.db"));
    db.exec(
      await Deno.readTextFile(
        new URL("./fixtures/schema_v8.sql", import.meta.url),
      ),
    );
    db.close();
    assert.deepEqual(
      await pagesPerEnqueue(join(dir, "v8.db")),
      Array(20).fill(5),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
