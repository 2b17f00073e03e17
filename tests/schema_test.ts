/** The schema as applied, and the core's query plans against it. */
import assert from "node:assert/strict";
import { Outbox, SCHEMA_SQL, SCHEMA_VERSION } from "../mod.ts";
import { SQL, UPGRADES } from "../dialects/sqlite.ts";
import { ADMIN_SQL } from "../admin.ts";
import {
  loadSqlite3,
  openSqliteWasm,
  SqliteWasmDriver,
} from "../drivers/sqlite_wasm.ts";
import { ManualClock } from "./helpers.ts";
import { DatabaseSync } from "node:sqlite";
import { join } from "node:path";
import { openSqliteWasm as openSqliteFile } from "../deno/sqlite_wasm.ts";

Deno.test("the schema the code applies is exactly schema.sql", async () => {
  const file = await Deno.readTextFile(
    new URL("../schema.sql", import.meta.url),
  );
  assert.equal(SCHEMA_SQL, file);
});

Deno.test("the claim query uses the claim index with no temp B-tree sort", async () => {
  await using driver = await openSqliteWasm(":memory:");
  await using _outbox = await Outbox.open(driver);
  const plan = await driver.query(`EXPLAIN QUERY PLAN ${SQL.candidates}`, [
    "default",
    0,
    1,
  ]);
  const details = plan.map((row) => String(row["detail"]));
  assert.ok(
    details.some((d) =>
      // Version 7's index leads with priority: the walk is in claim order
      // (priority DESC, due_at, id), due_at checked in the index.
      /SEARCH e USING INDEX outbox_events_claim \(queue=\?\)/.test(d)
    ),
    details.join("\n"),
  );
  assert.ok(
    !details.some((d) => d.includes("TEMP B-TREE")),
    details.join("\n"),
  );
  assert.ok(
    details.some((d) =>
      /SEARCH p USING (COVERING )?INDEX outbox_events_ordering/.test(d)
    ),
    details.join("\n"),
  );
  assert.ok(
    details.some((d) =>
      /SEARCH k USING COVERING INDEX outbox_events_concurrency \(queue=\? AND concurrency_key=\? AND due_at>\?\)/
        .test(d)
    ),
    details.join("\n"),
  );
});

Deno.test("nextDue seeks the claim index once per priority in use, never sorting the queue's events", async () => {
  await using driver = await openSqliteWasm(":memory:");
  await using _outbox = await Outbox.open(driver);
  const plan = await driver.query(`EXPLAIN QUERY PLAN ${ADMIN_SQL.nextDue}`, [
    "default",
    0,
  ]);
  const details = plan.map((row) => String(row["detail"]));
  assert.deepEqual(
    details.filter((d) => /outbox_events|TEMP B-TREE/.test(d)),
    [
      "SEARCH outbox_events USING INDEX outbox_events_claim (queue=?)",
      "SEARCH outbox_events USING INDEX outbox_events_claim (queue=? AND priority<?)",
      "SEARCH outbox_events USING INDEX outbox_events_claim (queue=? AND priority=? AND due_at>?)",
    ],
  );
});

Deno.test("10,000 done rows ahead of one pending row are not in the claim index", async () => {
  await using driver = await openSqliteWasm(":memory:");
  const clock = new ManualClock();
  await using outbox = await Outbox.open(driver, { now: clock.now });
  await outbox.transaction(async (tx) => {
    for (let i = 0; i < 10_000; i++) await tx.enqueue(i);
  });
  await outbox.acknowledge(await outbox.claim({ max: 10_000 }));
  const { eventId } = await outbox.enqueue("last");
  const [indexed] = await driver.query(
    `SELECT count(*) AS n FROM outbox_events INDEXED BY outbox_events_claim
     WHERE queue = 'default' AND state IN ('pending', 'leased') AND due_at <= 0`,
  );
  assert.equal(indexed?.["n"], 1);
  const [all] = await driver.query("SELECT count(*) AS n FROM outbox_events");
  assert.equal(all?.["n"], 10_001);
  assert.equal((await outbox.claim())?.eventId, eventId);
});

Deno.test("the batch statements look each event up by its id, never scanning the events", async () => {
  await using driver = await openSqliteWasm(":memory:");
  await using _outbox = await Outbox.open(driver);
  const plans = {
    claim: [0, 0, "{}"],
    acknowledgeAll: [0, "{}"],
    ledgerAll: [0, "[]"],
    writeUnwritten: ["[]"],
    expire: [0, "[]"],
  } as const;
  for (const [name, params] of Object.entries(plans)) {
    const sql = SQL[name as keyof typeof plans];
    const details = (await driver.query(`EXPLAIN QUERY PLAN ${sql}`, params))
      .map((row) => String(row["detail"]));
    assert.ok(
      details.some((d) =>
        /SEARCH (e|outbox_events)( EXISTS)? USING INTEGER PRIMARY KEY/.test(d)
      ),
      `${name}:\n${details.join("\n")}`,
    );
    assert.ok(
      !details.some((d) => /SCAN (e|outbox_events)\b/.test(d)),
      `${name}:\n${details.join("\n")}`,
    );
  }
});

Deno.test("claims and acknowledgements never make SQLite recompile a statement", async () => {
  const sqlite3 = await loadSqlite3();
  const db = new sqlite3.oo1.DB(":memory:");
  await using outbox = await Outbox.open(new SqliteWasmDriver(sqlite3, db));
  for (let i = 0; i < 20; i++) await outbox.enqueue(i);
  for (let i = 0; i < 5; i++) {
    await outbox.acknowledge((await outbox.claim())!);
    const leases = await outbox.claim({ max: 2 });
    await outbox.acknowledge([...leases, leases[0]!]);
  }
  const recompiled = [];
  for (
    let statement = sqlite3.capi.sqlite3_next_stmt(db.pointer!, 0);
    statement;
    statement = sqlite3.capi.sqlite3_next_stmt(db.pointer!, statement)
  ) {
    // SQLITE_STMTSTATUS_REPREPARE: a recompile on every run costs more than
    // the run (a bound parameter the planner compared with a constant).
    if (sqlite3.capi.sqlite3_stmt_status(statement, 5, 0) > 1) {
      recompiled.push(sqlite3.capi.sqlite3_sql(statement));
    }
  }
  assert.deepEqual(recompiled, []);
});

Deno.test("UPGRADES holds one step from each version below SCHEMA_VERSION, so every older database reaches the current one", () => {
  assert.deepEqual(
    [...UPGRADES.keys()].sort((a, b) => a - b),
    Array.from({ length: SCHEMA_VERSION - 1 }, (_, i) => i + 1),
  );
});

Deno.test("a version 3 file upgraded in place has the same columns, indexes and views as a fresh one", async () => {
  const dir = await Deno.makeTempDir({ prefix: "schema_upgrade_" });
  const shape = async (path: string) => {
    await using driver = await openSqliteFile(path);
    await using _outbox = await Outbox.open(driver);
    const columns = await driver.query(
      "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_xinfo('outbox_events')",
    );
    const objects = await driver.query(
      "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE type IN ('index', 'view') ORDER BY name",
    );
    const indexed = [];
    for (const { name } of objects) {
      indexed.push(
        await driver.query(
          "SELECT seqno, name, desc, key FROM pragma_index_xinfo(?)",
          [String(name)],
        ),
      );
    }
    return { columns, objects, indexed };
  };
  try {
    const upgraded = join(dir, "upgraded.db");
    const v3 = new DatabaseSync(upgraded);
    v3.exec(
      await Deno.readTextFile(
        new URL("./fixtures/schema_v3.sql", import.meta.url),
      ),
    );
    v3.exec(
      "INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts, created_at, updated_at) VALUES ('default', 'pending', '1', 0, 5, 7, 7)",
    );
    v3.close();
    assert.deepEqual(await shape(upgraded), await shape(join(dir, "fresh.db")));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
