/**
 * The dashboard on large outboxes: every page it serves reads from an index
 * seek (checked by plan, on the statements the handler really runs), its
 * event pages page by enqueue time stably, and the overview stays small
 * however many queues there are.
 */
import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import type { Driver, SqlValue } from "../driver.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { dashboard } from "../dashboard/mod.ts";
import { openPostgres } from "../drivers/postgres.ts";
import { POSTGRES } from "../dialects/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

/** A driver that records every statement it is asked to run. */
function recording(driver: Driver): {
  driver: Driver;
  seen: [string, readonly SqlValue[]][];
} {
  const seen: [string, readonly SqlValue[]][] = [];
  const proxy = new Proxy(driver, {
    get(target, key) {
      if (key === "query") {
        return (sql: string, params: readonly SqlValue[] = []) => {
          seen.push([sql, params]);
          return target.query(sql, params);
        };
      }
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return { driver: proxy, seen };
}

/**
 * Inserts `events` events over `queues` queues with one statement: state by
 * `i % 100` (0 dead, 1 pending, else done), created a millisecond apart.
 */
async function fill(
  outbox: Outbox,
  events: number,
  queues: number,
): Promise<void> {
  await outbox.transaction(async (tx) => {
    await tx.query(
      `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ${events})
      INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts,
        created_at, updated_at, done_at)
      SELECT 'q-' || printf('%05d', i % ${queues}),
        CASE i % 100 WHEN 0 THEN 'dead' WHEN 1 THEN 'pending' ELSE 'done' END,
        '{}', 1000 + i, 5, 1000 + i, 1000 + i,
        CASE WHEN i % 100 = 1 THEN NULL ELSE 1000 + i END
      FROM c`,
      [],
    );
  });
}

Deno.test("every page the dashboard serves reads events by an index seek on SQLite, never a walk of the table or its primary key", async () => {
  const { driver, seen } = recording(await openSqliteWasm(":memory:"));
  await using outbox = await Outbox.open(driver);
  await fill(outbox, 2_000, 5);
  const handler = dashboard(outbox);
  for (
    const path of [
      "/",
      "/?prefix=q-0&after=q-00001",
      "/dead",
      "/events?state=dead",
      "/events?state=done&after=500",
      "/events?state=pending&queue=q-00003",
      "/events?state=dead&queue=q-00000&after=700",
      "/events?q=no-such-key",
    ]
  ) {
    seen.length = 0;
    const response = await handler(new Request(`http://localhost${path}`));
    assert.equal(response.status, 200, path);
    await response.body?.cancel();
    const reads = seen.filter(([sql]) =>
      /^\s*(SELECT|WITH)/i.test(sql) && /outbox_events/.test(sql)
    );
    assert.ok(reads.length > 0, path);
    for (const [sql, params] of reads) {
      const plan = (await outbox.transaction((tx) =>
        tx.query(`EXPLAIN QUERY PLAN ${sql}`, [...params])
      )).map((row) =>
        String(row["detail"])
      );
      for (const line of plan) {
        assert.doesNotMatch(
          line,
          /^SCAN (outbox_events|e|i)\b|INTEGER PRIMARY KEY \(rowid>/,
          `${path}: ${sql}\n${plan.join("\n")}`,
        );
      }
    }
  }
});

Deno.test("list({ order: 'enqueued' }) pages by enqueue time then id, with and without a queue, each event once, and goes on after a purged cursor at its predecessor's place", async () => {
  const clock = { now: 5_000 };
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
    now: () => clock.now,
  });
  // Enqueue times that go back and forth, several events per millisecond.
  const times = [9, 3, 3, 7, 1, 9, 3, 5, 5, 2, 8, 3];
  for (const [i, at] of times.entries()) {
    clock.now = 5_000 + at;
    await outbox.enqueue({ i }, { queue: i % 3 === 0 ? "a" : "b" });
  }
  const all = await outbox.list({ state: "pending", limit: 100 });
  const expected = [...all].sort((x, y) =>
    x.createdAt - y.createdAt || x.id - y.id
  ).map((e) => e.id);
  for (const queue of [undefined, "a", "b"]) {
    const ids: number[] = [];
    let afterId = 0;
    for (;;) {
      const page = await outbox.list({
        state: "pending",
        order: "enqueued",
        limit: 2,
        afterId,
        ...queue === undefined ? {} : { queue },
      });
      if (page.length === 0) break;
      ids.push(...page.map((e) => e.id));
      afterId = page.at(-1)!.id;
    }
    assert.deepEqual(
      ids,
      expected.filter((id) =>
        queue === undefined || all.find((e) => e.id === id)!.queue === queue
      ),
      String(queue),
    );
  }
  // The cursor's event gone: the next page starts at its predecessor's time.
  const [first, second] = await outbox.list({
    state: "pending",
    order: "enqueued",
    limit: 2,
  });
  assert.ok(first !== undefined && second !== undefined);
  await outbox.cancel(second.id);
  await outbox.purge({ olderThanMs: 0 });
  const next = await outbox.list({
    state: "pending",
    order: "enqueued",
    limit: 100,
    afterId: second.id,
  });
  assert.ok(next.length > 0);
  assert.ok(next.every((e) => e.id !== first.id && e.id !== second.id));
  await assert.rejects(
    () => outbox.list({ state: "pending", order: "newest" as never }),
    /'order'/,
  );
});

Deno.test("with 20,000 queues the overview shows 50 of them, says of how many, filters by a name prefix and pages on, staying small", async () => {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  await fill(outbox, 40_000, 20_000);
  const handler = dashboard(outbox);
  const get = async (path: string) => {
    const response = await handler(new Request(`http://localhost${path}`));
    assert.equal(response.status, 200, path);
    return await response.text();
  };
  const queuesOf = (body: string) =>
    [...body.matchAll(/<td><a href="\/events\?queue=([^"]+)">/g)].map((m) =>
      m[1]!
    );
  const first = await get("/");
  assert.ok(first.length < 100_000, `${first.length} bytes`);
  assert.match(first, /Showing 50 of 1,000\+ queues/);
  const names = queuesOf(first);
  assert.equal(names.length, 50);
  assert.equal(names[0], "q-00000");
  assert.equal(names.at(-1), "q-00049");
  const next = /href="(\/\?after=[^"]+)">Next queues/.exec(first)?.[1];
  assert.equal(next, "/?after=q-00049");
  assert.equal(queuesOf(await get(next!))[0], "q-00050");
  const filtered = await get("/?prefix=q-1234");
  assert.match(filtered, /Showing 10 of 10 queues starting with “q-1234”/);
  assert.deepEqual(
    queuesOf(filtered),
    Array.from({ length: 10 }, (_, i) => `q-1234${i}`),
  );
  assert.doesNotMatch(filtered, /Next queues/);
  assert.match(await get("/?prefix=zzz"), /Showing 0 of 0 queues/);
  assert.equal(await outbox.countQueues(), 20_000);
  assert.equal(await outbox.countQueues({ prefix: "q-0", upTo: 100 }), 100);
  assert.deepEqual(
    (await outbox.queues({ prefix: "q-1", after: "q-19998" })).map((q) =>
      q.queue
    ),
    ["q-19999"],
  );
  // A dedup key in any queue: one statement, not one call per queue.
  await outbox.enqueue({}, { queue: "q-19999", dedupKey: "order-1" });
  const found = await handler(
    new Request("http://localhost/events?q=order-1"),
  );
  assert.equal(found.status, 303);
  assert.equal(
    await outbox.eventIdByDedupKey(undefined, "order-1"),
    Number(found.headers.get("location")?.split("/").at(-1)),
  );
  const events = await get("/events?state=dead");
  assert.ok(events.length < 100_000, `${events.length} bytes`);
  await assert.rejects(() => outbox.queues({ limit: 0 }), /'limit'/);
  await assert.rejects(() => outbox.queues({ after: "" }), /'after'/);
  await assert.rejects(() => outbox.countQueues({ upTo: 0 }), /'upTo'/);
  assert.equal(
    (await handler(new Request(`http://localhost/?after=${"x".repeat(2000)}`)))
      .status,
    400,
  );
});

Deno.test("on PostgreSQL, the overview pages its queues by a name prefix and the events pages go by enqueue time, as on SQLite", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = { now: 10_000 };
  await using outbox = await openPostgres(server.url, {
    schema,
    now: () => clock.now,
  });
  for (const [i, at] of [5, 1, 3, 1, 4].entries()) {
    clock.now = 10_000 + at;
    await outbox.enqueue({ i }, { queue: `mail-${i % 2}` });
  }
  clock.now = 20_000;
  await outbox.enqueue({}, { queue: "sms" });
  assert.equal(await outbox.countQueues(), 3);
  assert.equal(await outbox.countQueues({ prefix: "mail-" }), 2);
  assert.equal(await outbox.countQueues({ upTo: 2 }), 2);
  assert.deepEqual(
    (await outbox.queues({ prefix: "mail-", after: "mail-0" })).map((q) =>
      q.queue
    ),
    ["mail-1"],
  );
  const all = await outbox.list({ state: "pending" });
  const byTime = [...all].sort((x, y) =>
    x.createdAt - y.createdAt || x.id - y.id
  );
  const [a, b] = await outbox.list({
    state: "pending",
    order: "enqueued",
    limit: 2,
  });
  const rest = await outbox.list({
    state: "pending",
    order: "enqueued",
    afterId: b!.id,
  });
  assert.deepEqual(
    [a, b, ...rest].map((e) => e!.id),
    byTime.map((e) => e.id),
  );
  assert.deepEqual(
    (await outbox.list({
      state: "pending",
      order: "enqueued",
      queue: "mail-1",
    })).map((e) => e.id),
    byTime.filter((e) => e.queue === "mail-1").map((e) => e.id),
  );
  const body = await (await dashboard(outbox)(
    new Request("http://localhost/?prefix=mail-"),
  )).text();
  assert.match(body, /Showing 2 of 2 queues starting with “mail-”/);
  // PostgreSQL's schema has no index of events by queue and state (see
  // docs/dashboard.md); with SQLite's, a queue's page is an index seek.
  const plan = await outbox.transaction(async (tx) => {
    await tx.query(
      "CREATE INDEX outbox_events_state_test ON outbox_events (queue, state, created_at, id)",
    );
    await tx.query("SET LOCAL enable_seqscan = off");
    return (await tx.query(
      `EXPLAIN ${POSTGRES.listEnqueuedInQueue}`,
      ["pending", "mail-1", 0, 50],
    )).map((row) => String(row["QUERY PLAN"])).join("\n");
  });
  assert.match(plan, /Index (Only )?Scan using outbox_events_state_test/, plan);
  assert.doesNotMatch(plan, /Seq Scan on outbox_events/, plan);
});
