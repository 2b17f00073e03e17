/**
 * The query plans of the admin and dashboard reads on SQLite, state by
 * state, on a table of 20,000 events over 7 queues in every state: each
 * reads the events through an index, never a walk of the table, but for the
 * few that say why below. A change of the indexes (the dashboard's state
 * index costs claims and acknowledgements pages: bench/README.md) shows here
 * first.
 */
import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { SQLITE } from "../dialects/sqlite.ts";

const STATES = ["pending", "leased", "done", "dead"] as const;

/** The statements and their parameters, by name, for state `state`. */
function reads(state: string): [string, string, unknown[]][] {
  const sql = SQLITE as unknown as Record<string, string>;
  const of = (name: string, params: unknown[]): [string, string, unknown[]] => [
    name,
    sql[name]!,
    params,
  ];
  return [
    of("listEnqueuedInQueue", [state, "q-3", 0, 50]),
    of("listEnqueued", [state, null, 0, 50]),
    of("stats", ["q-3"]),
    of("deadLetters", ["q-3", 50]),
    of("queuesUpTo", [1000]),
    of("queuesPage", [1000, "", "", 50]),
    of("queueCount", ["", 1000]),
    of("dedupKeyEvent", ["q-3", "k"]),
    of("dedupKeyEventAnyQueue", [null, "k"]),
    of("acknowledgedSince", [5000]),
    of("activity", [5000, 60_000]),
    of("nextDue", ["q-3", 5000]),
  ];
}

Deno.test("every admin and dashboard read of the events, in every state, searches an index on 20,000 events; the exceptions are named", async () => {
  await using driver = await openSqliteWasm(":memory:");
  await using outbox = await Outbox.open(driver);
  await outbox.transaction((tx) =>
    tx.run(
      `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 20000)
      INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts,
        created_at, updated_at, done_at, token, lease_until)
      SELECT 'q-' || (i % 7),
        CASE i % 10 WHEN 0 THEN 'dead' WHEN 1 THEN 'pending'
          WHEN 2 THEN 'leased' ELSE 'done' END,
        '{}', 1000 + i, 5, 1000 + i, 1000 + i,
        CASE WHEN i % 10 IN (1, 2) THEN NULL ELSE 1000 + i END,
        CASE WHEN i % 10 = 2 THEN 't' END,
        CASE WHEN i % 10 = 2 THEN 9999999 END
      FROM c`,
    )
  );
  const plan = async (sql: string, params: unknown[]) =>
    (await driver.query(`EXPLAIN QUERY PLAN ${sql}`, params as never)).map(
      (row) => String(row["detail"]),
    );
  const searches = /^SEARCH (outbox_events|e|i) USING (COVERING )?INDEX /;
  for (const state of STATES) {
    for (const [name, sql, params] of reads(state)) {
      const lines = await plan(sql, params);
      const where = `${name} (${state}):\n${lines.join("\n")}`;
      // No walk of the table, its primary key or a whole index (a cursor's
      // enqueue time is one seek back by id, rowid<? LIMIT 1).
      for (const line of lines) {
        assert.doesNotMatch(
          line,
          /^SCAN (outbox_events|e|i)\b|INTEGER PRIMARY KEY \(rowid>/,
          where,
        );
      }
      assert.ok(lines.some((line) => searches.test(line)), where);
    }
  }
  // The exceptions, as they stand. list() by id pages the primary key from
  // its cursor, passing over other states' events (the dashboard pages by
  // enqueue time instead); queues() without a limit counts every event, a
  // walk of the state index; purge() of dead letters finds them by a walk
  // of the table, as no index leads with the state or done_at for them.
  assert.deepEqual(await plan(SQLITE.list, ["pending", "q-3", 0, 50]), [
    "SEARCH outbox_events USING INTEGER PRIMARY KEY (rowid>?)",
  ]);
  assert.deepEqual(await plan(SQLITE.queues, []), [
    "SCAN outbox_events USING COVERING INDEX outbox_events_state",
    "USE TEMP B-TREE FOR ORDER BY",
  ]);
  assert.deepEqual(await plan(SQLITE.purgeable, ["dead", 5000]), [
    "SCAN outbox_events",
  ]);
  assert.deepEqual(await plan(SQLITE.purgeable, ["done", 5000]), [
    "SEARCH outbox_events USING COVERING INDEX outbox_events_done (done_at<?)",
  ]);
});
