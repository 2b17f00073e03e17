/** The schema as applied, and the core's query plans against it. */
import assert from "node:assert/strict";
import {
  type Driver,
  type Lease,
  Outbox,
  POSTGRES_SCHEMA_VERSION,
  SCHEMA_SQL,
  SCHEMA_VERSION,
  SQLITE_SCHEMA_VERSION,
} from "../mod.ts";
import { POSTGRES } from "../dialects/postgres.ts";
import { SQL, UPGRADES } from "../dialects/sqlite.ts";
import { ADMIN_SQL } from "../dialects/sqlite/admin.ts";
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
      /SEARCH o USING COVERING INDEX outbox_events_ordering_leased \(queue=\? AND ordering_key=\? AND due_at>\?\)/
        .test(d)
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
    return await shapeOf(driver);
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

/** The columns, indexes and views of a database's outbox schema. */
async function shapeOf(driver: Driver) {
  const columns = await driver.query(
    "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_xinfo('outbox_events')",
  );
  const objects = await driver.query(
    "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE type IN ('index', 'view', 'trigger') ORDER BY name",
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
}

/**
 * Writes a database of an older schema `version` at `path`, from its
 * fixture, holding one event in every state: pending, leased (a live lease
 * of an older release's worker), done and dead, with the ledger entries
 * that version kept (rows up to version 2; the row's claim and done times
 * from version 3 on).
 */
async function olderDatabase(path: string, version: number): Promise<void> {
  const db = new DatabaseSync(path);
  try {
    db.exec(
      await Deno.readTextFile(
        new URL(`./fixtures/schema_v${version}.sql`, import.meta.url),
      ),
    );
    const identity = version >= 4;
    const claimedAt = version >= 3;
    const insert = (
      n: number,
      state: string,
      extra: Record<string, string | number | null>,
    ) => {
      const columns: Record<string, string | number | null> = {
        queue: "default",
        state,
        payload: JSON.stringify({ n }),
        due_at: 0,
        max_attempts: 5,
        created_at: 10 * n,
        updated_at: 10 * n,
        ...(identity
          ? { identity: `0190a8b0-0000-7000-8000-00000000000${n}` }
          : {}),
        ...extra,
      };
      const names = Object.keys(columns);
      db.prepare(
        `INSERT INTO outbox_events (${names.join(", ")}) VALUES (${
          names.map(() => "?").join(", ")
        })`,
      ).run(...Object.values(columns));
    };
    const token = "a".repeat(32);
    insert(1, "pending", {});
    insert(2, "leased", {
      fence: 1,
      attempt: 1,
      token,
      lease_until: 9e12,
      due_at: 9e12,
      ...(claimedAt ? { claimed_at: 25 } : {}),
    });
    insert(3, "done", {
      fence: 1,
      attempt: 1,
      token,
      done_at: 36,
      ...(claimedAt ? { claimed_at: 35 } : {}),
    });
    insert(4, "dead", {
      fence: 1,
      attempt: 5,
      last_error: "receiver down",
      done_at: 46,
    });
    if (!claimedAt) {
      db.exec(
        `INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until)
         VALUES (2, 1, 'claimed', 25, '${token}', 9000000000000),
           (3, 1, 'claimed', 35, '${token}', 9000000000000),
           (3, 1, 'acknowledged', 36, '${token}', NULL)`,
      );
    }
    db.exec(
      "INSERT INTO outbox_attempts (event_id, fence, kind, at, detail) VALUES (4, 1, 'dead', 46, 'receiver down')",
    );
  } finally {
    db.close();
  }
}

Deno.test("every older schema version has a fixture holding data, so each upgrade step is tested on a database with events", async () => {
  for (let version = 1; version < SCHEMA_VERSION; version++) {
    const dir = await Deno.makeTempDir({ prefix: "schema_fixture_" });
    try {
      await olderDatabase(join(dir, "old.db"), version);
      const db = new DatabaseSync(join(dir, "old.db"));
      const states = db.prepare(
        "SELECT state FROM outbox_events ORDER BY id",
      ).all().map((row) => row["state"]);
      db.close();
      assert.deepEqual(states, ["pending", "leased", "done", "dead"]);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

for (let version = 1; version < SCHEMA_VERSION; version++) {
  Deno.test(`a version ${version} database with an event in every state upgrades to version ${SCHEMA_VERSION}, shaped as a fresh one, every event kept, claimable, acknowledgeable and explained`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "schema_every_version_" });
    try {
      const path = join(dir, "old.db");
      await olderDatabase(path, version);
      await using driver = await openSqliteFile(path);
      await using outbox = await Outbox.open(driver, { now: () => 1_000 });
      {
        await using fresh = await openSqliteFile(join(dir, "fresh.db"));
        await using _fresh = await Outbox.open(fresh);
        assert.deepEqual(await shapeOf(driver), await shapeOf(fresh));
      }
      assert.deepEqual(
        (await driver.query(
          "SELECT version FROM outbox_schema ORDER BY version",
        ))
          .map((row) => row["version"]),
        Array.from(
          { length: SCHEMA_VERSION - version + 1 },
          (_, i) => version + i,
        ),
      );
      assert.deepEqual(await driver.query("PRAGMA user_version"), [{
        user_version: 0,
      }]);
      const { oldestPendingAgeMs: _, ...counts } = await outbox.stats();
      assert.deepEqual(counts, { pending: 1, leased: 1, done: 1, dead: 1 });
      const kinds = async (id: number) =>
        (await outbox.explain(id))?.history.map((entry) => entry.kind);
      assert.deepEqual(await kinds(2), ["claimed"]);
      assert.deepEqual(await kinds(3), ["claimed", "acknowledged"]);
      assert.deepEqual(await kinds(4), ["dead"]);
      const identities = await driver.query(
        "SELECT identity FROM outbox_events ORDER BY id",
      );
      for (const { identity } of identities) {
        assert.match(String(identity), /^[0-9a-f-]{36}$/);
      }
      const lease = await outbox.claim();
      assert.deepEqual([lease?.eventId, lease?.payload], [1, { n: 1 }]);
      assert.equal(await outbox.acknowledge(lease!), true);
      // The older release's worker still holds its lease, and keeps it.
      assert.equal(
        await outbox.acknowledge(
          {
            eventId: 2,
            token: "a".repeat(32),
            fence: 1,
          } as unknown as Lease,
        ),
        true,
      );
      assert.equal(await outbox.redrive({ ids: [4] }), 1);
      assert.deepEqual((await outbox.claim())?.payload, { n: 4 });
      const { oldestPendingAgeMs: __, ...after } = await outbox.stats();
      assert.deepEqual(after, { pending: 0, leased: 1, done: 3, dead: 0 });
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

Deno.test("released upgrade steps are frozen: each step's text keeps the SHA-256 it was released with", async () => {
  // A new step adds its line; a released one never changes (fix forward
  // with a new step instead).
  const released = new Map([
    [1, "c0e0d38b42240ff2b718adc13f0673fd3df07375ddb2dcf94d15e0d675a59c63"],
    [2, "22c326b606816be5d49470edb2df0e56cd86e54dbd886e38767b9f8471e16ea8"],
    [3, "2d358d85a0b6d4cb3d16c509a78ca6d4eab76b6b82654464ddd0a89b235006d2"],
    [4, "f817c506c1ece832d91959fbad7ce900515b90d54c93584878b6e12e5452b136"],
    [5, "e0728db3caee1fa267baa79673ee0361aa452e32c015218788b387016d3d1cbc"],
    [6, "4c28542874be8eec1753dc72c8fa5c7b2249e66b7030744b8471248dae1c5d6b"],
    [7, "cb735f73f71e1bcfebb8a02c3e8e70d9b7c6f5cf7e04eb37752da65b9beeb30b"],
    [8, "66b8dd8410a290c274239097f89aa6465e2a0bcc724caed6ab1f1ee1265b8fa7"],
  ]);
  for (const [version, hash] of released) {
    const digest = await crypto.subtle.digest(
      "SHA-256",
      new TextEncoder().encode(UPGRADES.get(version)),
    );
    assert.equal(
      Array.from(
        new Uint8Array(digest),
        (b) => b.toString(16).padStart(2, "0"),
      ).join(""),
      hash,
      `step ${version}`,
    );
  }
});

Deno.test("the main entry names each engine's schema version, and SCHEMA_VERSION is SQLite's", async () => {
  assert.equal(SCHEMA_VERSION, SQLITE_SCHEMA_VERSION);
  assert.equal(POSTGRES_SCHEMA_VERSION, POSTGRES.version);
  await using driver = await openSqliteWasm(":memory:");
  await using _outbox = await Outbox.open(driver);
  assert.deepEqual(
    await driver.query("SELECT max(version) AS version FROM outbox_schema"),
    [{ version: SQLITE_SCHEMA_VERSION }],
  );
});
