/**
 * What PostgreSQL adds to the contract: claims from many connections side
 * by side, the server's clock, LISTEN/NOTIFY wake-ups, and faults (a
 * connection dropped inside a claim or an acknowledgement, a statement
 * timeout, a server restart) that fail calls with typed errors and leave
 * nothing half done.
 */
import assert from "node:assert/strict";
import { POSTGRES, POSTGRES_SCHEMA_VERSION } from "../dialects/postgres.ts";
import type { Driver, Row, RunResult, SqlValue } from "../driver.ts";
import {
  connectPostgres,
  openPostgres,
  type PostgresDriver,
  type PostgresOutboxOptions,
} from "../drivers/postgres.ts";
import {
  BusyError,
  ConnectionLostError,
  PostgresError,
  SchemaVersionError,
  StatementTimeoutError,
} from "../errors.ts";
import { type Dialect, Outbox, processEvents } from "../mod.ts";
import { sharedPostgres, startPostgres } from "../scripts/postgres_server.ts";
import { asPostgresVersion7, ManualClock } from "./helpers.ts";

async function fresh(): Promise<{ url: string; schema: string }> {
  const server = await sharedPostgres();
  return { url: server.url, schema: await server.createSchema() };
}

async function raw(url: string, schema: string): Promise<PostgresDriver> {
  return await connectPostgres(url, { schema });
}

async function ledgerKinds(db: Driver, eventId: number): Promise<string[]> {
  const rows = await db.query(
    "SELECT kind, fence FROM outbox_ledger WHERE event_id = $1 ORDER BY seq",
    [eventId],
  );
  return rows.map((row) => `${row["kind"]}:${row["fence"]}`);
}

/**
 * Resolves once a backend of the database waits for a lock (polled every
 * 5 ms), or once `call` settles without having waited.
 */
async function untilWaiting(
  admin: Driver,
  call: Promise<unknown>,
): Promise<void> {
  let settled = false;
  call.then(() => settled = true, () => settled = true);
  while (!settled) {
    const [row] = await admin.query(
      "SELECT count(*)::integer AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
    );
    if (row?.["n"] === 1) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/**
 * A connection whose backend is terminated (pg_terminate_backend, from a
 * second connection) when it sends the statement `when` picks: just before
 * it, or, `inFlight`, while the statement waits for a lock the test holds.
 */
class DroppingDriver implements Driver {
  drops = 0;
  constructor(
    readonly inner: PostgresDriver,
    readonly admin: PostgresDriver,
    readonly when: (sql: string) => boolean,
    readonly inFlight = false,
  ) {}

  async #send<T>(sql: string, send: () => Promise<T>): Promise<T> {
    if (!this.when(sql)) return await send();
    this.drops++;
    const [row] = await this.inner.query("SELECT pg_backend_pid() AS pid");
    const pid = row?.["pid"] ?? null;
    const terminate = () =>
      this.admin.query("SELECT pg_terminate_backend($1, 5000)", [pid]);
    if (!this.inFlight) {
      await terminate();
      return await send();
    }
    const sent = send();
    sent.catch(() => {});
    const deadline = Date.now() + 10_000;
    while (
      (await this.admin.query(
        "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
        [pid],
      )).length === 0
    ) {
      if (Date.now() > deadline) {
        throw new Error(`the statement never waited for a lock: ${sql}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await terminate();
    return await sent;
  }

  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]> {
    return this.#send(sql, () => this.inner.query(sql, params));
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult> {
    return this.#send(sql, () => this.inner.run(sql, params));
  }

  exec(sql: string): Promise<void> {
    return this.inner.exec(sql);
  }

  get dialect(): Dialect {
    return this.inner.dialect;
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

Deno.test("postgres: claims from four connections at once take every event exactly once", async () => {
  const { url, schema } = await fresh();
  const outboxes = await Promise.all(
    [0, 1, 2, 3].map(() => openPostgres(url, { schema })),
  );
  try {
    const ids = [];
    for (let i = 0; i < 200; i++) {
      ids.push((await outboxes[0]!.enqueue({ i })).eventId);
    }
    const claimed = new Map<number, number>();
    await Promise.all(outboxes.map(async (outbox) => {
      for (;;) {
        const leases = await outbox.claim({ max: 7 });
        if (leases.length === 0) return;
        for (const lease of leases) {
          claimed.set(lease.eventId, (claimed.get(lease.eventId) ?? 0) + 1);
          assert.equal(lease.fence, 1);
        }
        assert.deepEqual(
          await outbox.acknowledge(leases),
          leases.map(() => true),
        );
      }
    }));
    assert.deepEqual([...claimed.keys()].sort((a, b) => a - b), ids);
    assert.ok([...claimed.values()].every((n) => n === 1));
    assert.equal((await outboxes[0]!.stats()).done, 200);
  } finally {
    await Promise.all(outboxes.map((outbox) => outbox.close()));
  }
});

Deno.test("postgres: a claim skips an event another transaction holds locked instead of waiting for it", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema });
  await using holder = await raw(url, schema);
  const first = await outbox.enqueue("first");
  const second = await outbox.enqueue("second");
  await holder.run("BEGIN");
  await holder.query("SELECT id FROM outbox_events WHERE id = $1 FOR UPDATE", [
    first.eventId,
  ]);
  const lease = await outbox.claim();
  assert.equal(lease?.eventId, second.eventId);
  await holder.run("ROLLBACK");
  assert.equal((await outbox.claim())?.eventId, first.eventId);
});

Deno.test("postgres: tx.run() refuses ABORT, START TRANSACTION and PREPARE TRANSACTION before they run, so the transaction's event and rows commit together", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema });
  await using db = await raw(url, schema);
  await db.run("CREATE TABLE orders (id integer)");
  const { eventId } = await outbox.transaction(async (tx) => {
    const enqueued = await tx.enqueue({ order: 1 });
    for (
      const [sql, keyword] of [
        ["ABORT", "ABORT"],
        ["start transaction", "START"],
        ["PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION"],
        // PostgreSQL's block comments nest: this is a ROLLBACK there.
        ["/* /* */ SELECT */ ROLLBACK", "ROLLBACK"],
        // A line comment ends at a carriage return there too.
        ["-- note\rCOMMIT", "COMMIT"],
      ]
    ) {
      // Before, ABORT rolled the enqueue back, the insert after it ran on
      // its own, and the transaction still resolved.
      await assert.rejects(tx.run(sql!), {
        name: "RangeError",
        message: new RegExp(
          `must not control the transaction: found ${keyword}`,
        ),
      });
    }
    await assert.rejects(tx.query(5 as unknown as string), {
      name: "TypeError",
      message: /'sql' must be a string/,
    });
    await assert.rejects(
      tx.run("INSERT INTO orders VALUES ($1)", 2 as unknown as []),
      { name: "TypeError", message: /'params' must be an array/ },
    );
    await tx.run("INSERT INTO orders VALUES (1)");
    return enqueued;
  });
  assert.equal((await outbox.explain(eventId))?.state, "pending");
  assert.deepEqual(await db.query("SELECT id FROM orders"), [{ id: 1 }]);
});

Deno.test("postgres: enqueues do not wait for a transaction holding a lapsed last-attempt lease's row; the next claim makes it a dead letter", async () => {
  const { url, schema } = await fresh();
  const clock = new ManualClock(1_000_000);
  await using outbox = await openPostgres(url, {
    schema,
    now: clock.now,
    busyTimeoutMs: 300,
  });
  await using holder = await raw(url, schema);
  const { eventId } = await outbox.enqueue("last", { maxAttempts: 1 });
  assert.ok(await outbox.claim({ leaseMs: 1_000 }));
  clock.advance(2_000);
  await holder.run("BEGIN");
  await holder.query("SELECT id FROM outbox_events WHERE id = $1 FOR UPDATE", [
    eventId,
  ]);
  try {
    // Before, each waited for the row and failed with BusyError.
    await outbox.enqueue("one", { queue: "other" });
    await Promise.all([outbox.enqueue("two"), outbox.enqueue("three")]);
    await outbox.enqueueBatch([{ payload: "four" }]);
    assert.deepEqual(
      await holder.query("SELECT state FROM outbox_events WHERE id = $1", [
        eventId,
      ]),
      [{ state: "leased" }],
    );
  } finally {
    await holder.run("ROLLBACK");
  }
  assert.equal((await outbox.claim())?.payload, "two");
  assert.equal((await outbox.explain(eventId))?.state, "dead");
});

Deno.test("postgres: an event of an ordering key that commits after a later one of its key was claimed waits for that lease, so one is in flight per key", async () => {
  const { url, schema } = await fresh();
  const clock = new ManualClock(1_000_000);
  await using outbox = await openPostgres(url, { schema, now: clock.now });
  await using producer = await openPostgres(url, { schema, now: clock.now });
  let inserted!: () => void;
  let commit!: () => void;
  const insertedFirst = new Promise<void>((resolve) => inserted = resolve);
  const committing = new Promise<void>((resolve) => commit = resolve);
  const first = producer.transaction(async (tx) => {
    const result = await tx.enqueue("first", { orderingKey: "k" });
    inserted();
    await committing;
    return result;
  });
  await insertedFirst;
  const second = await outbox.enqueue("second", { orderingKey: "k" });
  const lease = await outbox.claim({ leaseMs: 1_000 });
  assert.equal(lease?.payload, "second");
  commit();
  assert.ok((await first).eventId < second.eventId);
  // Before, "first" was claimed here: two of the key in flight.
  assert.equal(await outbox.claim({ max: 2 }).then((l) => l.length), 0);
  // Once that lease lapses, the earlier event goes first, then the retry.
  clock.advance(2_000);
  const next = await outbox.claim({ max: 2 });
  assert.deepEqual(next.map((l) => l.payload), ["first"]);
  assert.equal(await outbox.acknowledge(next[0]!), true);
  assert.equal((await outbox.claim())?.payload, "second");
});

Deno.test("postgres: a claim skips an ordering key another claim is taking an event of at that moment, whatever search_path led that claim to the table, and takes the other keys", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema });
  await using db = await raw(url, schema);
  await db.run("CREATE SCHEMA IF NOT EXISTS elsewhere");
  // A session whose current schema is another one, reaching the same table.
  const other = await connectPostgres(
    `${url}?options=${
      encodeURIComponent(`-c search_path=elsewhere,${schema}`)
    }`,
  );
  await using _ = other;
  assert.deepEqual(await other.query("SELECT current_schema() AS s"), [{
    s: "elsewhere",
  }]);
  await outbox.enqueue("k", { orderingKey: "k" });
  await outbox.enqueue("j", { orderingKey: "j" });
  // What a concurrent claim of key k holds until it commits.
  await other.run("BEGIN");
  await other.query(
    "SELECT pg_advisory_xact_lock('outbox_events'::regclass::oid::integer, hashtext(length('default') || ':default' || 'k'))",
  );
  const leases = await outbox.claim({ max: 2 });
  assert.deepEqual(leases.map((l) => l.payload), ["j"]);
  await other.run("ROLLBACK");
  assert.equal((await outbox.claim())?.payload, "k");
});

Deno.test("postgres: a claim locks only the ordering keys it takes, so a claim beside it takes the other keys", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema });
  await using other = await raw(url, schema);
  for (const key of ["k1", "k2", "k3", "k4", "k5"]) {
    await outbox.enqueue(key, { orderingKey: key });
  }
  // A small analyzed table: the planner sorts every candidate, and before,
  // the key lock in the scan's filter locked every key it read.
  await other.run("ANALYZE outbox_events");
  await other.run("BEGIN");
  const [one] = await other.query(POSTGRES.candidates, [
    "default",
    Date.now() + 1_000,
    1,
    1_000,
    null,
  ]);
  assert.equal(one?.["ordering_key"], "k1");
  const [{ n }] = await other.query(
    "SELECT count(*)::integer AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
  ) as [{ n: number }];
  assert.equal(n, 1);
  const leases = await outbox.claim({ max: 5 });
  assert.deepEqual(leases.map((l) => l.payload), ["k2", "k3", "k4", "k5"]);
  await other.run("ROLLBACK");
});

Deno.test("postgres: leases are judged by the server's clock by default", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema, leaseMs: 60_000 });
  await using db = await raw(url, schema);
  await outbox.enqueue("x");
  const lease = await outbox.claim();
  const [row] = await db.query(POSTGRES.now);
  const serverNow = Number(row?.["now"]);
  assert.ok(lease!.leaseUntil > serverNow + 50_000);
  assert.ok(lease!.leaseUntil <= serverNow + 60_000);
});

Deno.test("postgres: with the server's clock, schedule() refuses a cron that never fires after the server's now, naming cron, and stores nothing", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema });
  await assert.rejects(
    outbox.schedule("s", "0 0 0 1 1 * 2020", 1),
    (e) =>
      e instanceof RangeError &&
      /^Cannot schedule as 'cron' must fire after \d{4}-\d\d-\d\dT[\d:.]+Z: current value is "0 0 0 1 1 \* 2020"$/
        .test(e.message),
  );
  assert.deepEqual(await outbox.schedules(), []);
  await outbox.schedule("s", "0 0 0 1 1 * 2999", 1);
  assert.deepEqual(
    (await outbox.schedules()).map((s) => s.nextAt),
    [Date.UTC(2999, 0, 1)],
  );
});

Deno.test("postgres: a worker whose own clock is hours off still respects another worker's live lease", async () => {
  const { url, schema } = await fresh();
  await using a = await openPostgres(url, { schema, leaseMs: 60_000 });
  await using b = await openPostgres(url, { schema });
  await a.enqueue("x");
  const lease = await a.claim();
  assert.ok(lease);
  // b's process clock plays no part: were it judged by a clock three hours
  // ahead, a's lease would have lapsed.
  const realNow = Date.now;
  Date.now = () => realNow() + 3 * 3_600_000;
  try {
    assert.equal(await b.claim(), null);
  } finally {
    Date.now = realNow;
  }
  assert.equal(await a.acknowledge(lease), true);
});

Deno.test("postgres: an enqueue on one connection wakes a listener of another through NOTIFY", async () => {
  const { url, schema } = await fresh();
  await using worker = await openPostgres(url, { schema });
  await using producer = await openPostgres(url, { schema });
  const woken = Promise.withResolvers<void>();
  const off = worker.onEnqueue(() => woken.resolve());
  await producer.enqueue("x");
  await woken.promise;
  off();
  assert.equal((await worker.claim())?.payload, "x");
});

Deno.test("postgres: a batch enqueue of minted events on one connection wakes a listener of another through NOTIFY", async () => {
  const { url, schema } = await fresh();
  await using worker = await openPostgres(url, { schema });
  await using producer = await openPostgres(url, { schema });
  const woken = Promise.withResolvers<void>();
  const off = worker.onEnqueue(() => woken.resolve());
  await producer.enqueueBatch([{ payload: "x" }, { payload: "y" }]);
  await woken.promise;
  off();
  assert.deepEqual(
    (await worker.claim({ max: 2 })).map((lease) => lease.payload),
    ["x", "y"],
  );
});

Deno.test("postgres: a batch enqueue of minted events keeps each payload's JSON text as enqueued, escapes and all, and answers its ids in array order", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema, listen: false });
  await using db = await raw(url, schema);
  // JSON text the server must not parse as a string's value: `->>` refuses
  // a lone surrogate's escape and NUL's, and jsonb would reorder keys.
  const payloads = [
    "\ud800 lone surrogate",
    "NUL \u0000",
    'a quote " and a backslash \\',
    "a line separator \u2028 and an emoji 😀",
    { z: [1, { b: "}]," }], a: null, "": "" },
    [],
    -1.5e300,
    false,
    null,
    "[1,2]",
  ];
  const results = await outbox.enqueueBatch(
    payloads.map((payload) => ({ payload })),
  );
  const rows = await db.query(
    `SELECT e.id, e.payload, e.identity::text AS identity, k.event_id AS keyed
      FROM outbox_events AS e JOIN outbox_keys AS k USING (identity)
      ORDER BY e.id`,
  );
  assert.deepEqual(
    rows,
    results.map((result, i) => ({
      id: result.eventId,
      payload: JSON.stringify(payloads[i]),
      identity: result.identity,
      keyed: result.eventId,
    })),
  );
  assert.deepEqual(
    (await outbox.claim({ max: payloads.length })).map((lease) =>
      lease.payload
    ),
    payloads,
  );
});

for (const tablesFirst of [false, true]) {
  const where = tablesFirst
    ? "in public, with a schema named after the user first in the search_path"
    : "where the search_path leads (a schema named after the user)";
  Deno.test(`postgres: without the schema option, an outbox ${where} wakes its listeners`, async () => {
    const url = await (await sharedPostgres()).createDatabase();
    // Created before the user's schema, the tables stay in public.
    if (tablesFirst) await (await openPostgres(url)).close();
    await using db = await connectPostgres(url);
    await db.run("CREATE SCHEMA postgres");
    await using worker = await openPostgres(url);
    await using producer = await openPostgres(url);
    assert.deepEqual(
      await db.query(
        "SELECT schemaname FROM pg_tables WHERE tablename = 'outbox_events'",
      ),
      [{ schemaname: tablesFirst ? "public" : "postgres" }],
    );
    const woken = Promise.withResolvers<string>();
    const off = worker.onEnqueue(() => woken.resolve("woken"));
    const timer = setTimeout(() => woken.resolve("not woken"), 5_000);
    await producer.enqueue("x");
    // Before, the listener compared the NOTIFY's schema with "public", and
    // then with current_schema(), which need not hold the table.
    assert.equal(await woken.promise, "woken");
    clearTimeout(timer);
    off();
    assert.equal((await worker.claim())?.payload, "x");
  });
}

Deno.test("postgres: with listen off, enqueues on another connection wake nobody and polling still claims", async () => {
  const { url, schema } = await fresh();
  await using worker = await openPostgres(url, { schema, listen: false });
  await using producer = await openPostgres(url, { schema });
  let wakes = 0;
  worker.onEnqueue(() => wakes++);
  await producer.enqueue("x");
  // The notification, had it been listened for, arrives before the next
  // statement's answer on the same connection.
  assert.equal((await worker.claim())?.payload, "x");
  assert.equal(wakes, 0);
});

Deno.test("postgres: a connection dropped inside a claim fails it with ConnectionLostError, leaves the event unclaimed, and the next claim reconnects", async () => {
  const { url, schema } = await fresh();
  await using admin = await raw(url, schema);
  let armed = true;
  const dropping = new DroppingDriver(
    await raw(url, schema),
    admin,
    (sql) => armed && sql === POSTGRES.claimInOne,
    true,
  );
  await using outbox = await Outbox.open(dropping);
  const { eventId } = await outbox.enqueue("x");
  // The claim's statement waits for this lock.
  await admin.run("BEGIN");
  await admin.run("LOCK TABLE outbox_events IN EXCLUSIVE MODE");
  await assert.rejects(outbox.claim(), ConnectionLostError);
  await admin.run("ROLLBACK");
  assert.equal(dropping.drops, 1);
  const [row] = await admin.query(
    "SELECT state, fence, attempt, token FROM outbox_events WHERE id = $1",
    [eventId],
  );
  assert.deepEqual(row, {
    state: "pending",
    fence: 0,
    attempt: 0,
    token: null,
  });
  assert.deepEqual(await ledgerKinds(admin, eventId), []);
  armed = false;
  const lease = await outbox.claim();
  assert.equal(lease?.eventId, eventId);
  assert.equal(lease?.fence, 1);
  assert.equal(await outbox.acknowledge(lease!), true);
});

Deno.test("postgres: a connection dropped inside an acknowledgement fails it with ConnectionLostError, the lease stays live, and acknowledging again succeeds once", async () => {
  const { url, schema } = await fresh();
  await using admin = await raw(url, schema);
  let armed = false;
  const dropping = new DroppingDriver(
    await raw(url, schema),
    admin,
    (sql) => armed && sql === POSTGRES.acknowledgeInOne,
    true,
  );
  await using outbox = await Outbox.open(dropping);
  const { eventId } = await outbox.enqueue("x");
  const lease = await outbox.claim();
  armed = true;
  // The acknowledgement waits for this row lock.
  await admin.run("BEGIN");
  await admin.query("SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", [
    eventId,
  ]);
  await assert.rejects(outbox.acknowledge(lease!), ConnectionLostError);
  await admin.run("ROLLBACK");
  armed = false;
  const [row] = await admin.query(
    "SELECT state, fence FROM outbox_events WHERE id = $1",
    [eventId],
  );
  assert.deepEqual(row, { state: "leased", fence: 1 });
  assert.equal(await outbox.acknowledge(lease!), true);
  assert.equal(await outbox.acknowledge(lease!), false);
  assert.deepEqual(await ledgerKinds(admin, eventId), [
    "claimed:1",
    "acknowledged:1",
    "stale_acknowledge:1",
  ]);
});

Deno.test("postgres: a connection dropped just before the COMMIT of a transaction that acknowledges rolls it back, and acknowledging again records one acknowledgement", async () => {
  const { url, schema } = await fresh();
  await using admin = await raw(url, schema);
  let armed = false;
  const dropping = new DroppingDriver(
    await raw(url, schema),
    admin,
    (sql) => armed && sql === POSTGRES.commit,
  );
  await using outbox = await Outbox.open(dropping);
  const { eventId } = await outbox.enqueue("x");
  const lease = await outbox.claim();
  armed = true;
  await assert.rejects(
    outbox.transaction((tx) => tx.acknowledge(lease!)),
    ConnectionLostError,
  );
  armed = false;
  // The drop came before COMMIT reached the server, so it rolled back.
  const [row] = await admin.query(
    "SELECT state FROM outbox_events WHERE id = $1",
    [eventId],
  );
  assert.equal(row?.["state"], "leased");
  assert.equal(await outbox.acknowledge(lease!), true);
  const acknowledged = (await ledgerKinds(admin, eventId)).filter((entry) =>
    entry.startsWith("acknowledged")
  );
  assert.deepEqual(acknowledged, ["acknowledged:1"]);
});

Deno.test("postgres: an acknowledgement blocked past statementTimeoutMs fails with StatementTimeoutError and changes nothing", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, {
    schema,
    statementTimeoutMs: 200,
  });
  await using holder = await raw(url, schema);
  const { eventId } = await outbox.enqueue("x");
  const lease = await outbox.claim();
  await holder.run("BEGIN");
  await holder.query("SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", [
    eventId,
  ]);
  await assert.rejects(outbox.acknowledge(lease!), StatementTimeoutError);
  await holder.run("ROLLBACK");
  assert.deepEqual(await ledgerKinds(holder, eventId), ["claimed:1"]);
  assert.equal(await outbox.acknowledge(lease!), true);
});

Deno.test("postgres: workers draining through a server restart reconnect, lose nothing committed and acknowledge every event once", async () => {
  const server = await startPostgres();
  try {
    const outboxes = [
      await openPostgres(server.url, { leaseMs: 5_000 }),
      await openPostgres(server.url, { leaseMs: 5_000 }),
    ];
    const errors: unknown[] = [];
    let delivered = 0;
    const restartAt = Promise.withResolvers<void>();
    const processors = outboxes.map((outbox) =>
      processEvents(outbox, () => {
        if (++delivered === 100) restartAt.resolve();
        return Promise.resolve();
      }, {
        concurrency: 4,
        pollMinMs: 10,
        pollMaxMs: 50,
        onError: (error) => errors.push(error),
      })
    );
    const ids: number[] = [];
    for (let i = 0; i < 300; i++) {
      ids.push((await outboxes[0]!.enqueue({ i })).eventId);
    }
    await restartAt.promise;
    await server.restart();
    let stats = await retry(() => outboxes[0]!.stats());
    for (let i = 0; stats.done < ids.length && i < 400; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      stats = await retry(() => outboxes[0]!.stats());
    }
    await Promise.all(processors.map((processor) => processor.stop()));
    assert.equal(stats.done, ids.length);
    assert.ok(
      errors.some((error) => error instanceof ConnectionLostError),
      "the restart was seen",
    );
    const db = await connectPostgres(server.url);
    try {
      const [row] = await db.query(
        `SELECT count(*) AS n, count(DISTINCT event_id) AS events
         FROM outbox_ledger WHERE kind = 'acknowledged'`,
      );
      assert.deepEqual(row, { n: ids.length, events: ids.length });
    } finally {
      await db.close();
    }
    await Promise.all(outboxes.map((outbox) => outbox.close()));
  } finally {
    await server.stop();
  }
});

/** Runs `fn` again while the connection it needs is being re-made. */
async function retry<T>(fn: () => Promise<T>): Promise<T> {
  for (let i = 0;; i++) {
    try {
      return await fn();
    } catch (error) {
      if (!(error instanceof ConnectionLostError) || i >= 50) throw error;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

Deno.test("postgres: openPostgres refuses bad options before connecting, and creates nothing", async () => {
  const { url, schema } = await fresh();
  const missing = `${schema}_never`;
  await assert.rejects(
    openPostgres(url, { schema: missing, leaseMs: 0 }),
    new RangeError(
      "Cannot open outbox as 'leaseMs' must be a positive integer at most 31536000000: current value is 0",
    ),
  );
  await assert.rejects(
    openPostgres("postgres://nobody@127.0.0.1:1/none", { maxAttempts: -1 }),
    RangeError,
  );
  // Each refused by name before connecting (before, a server error about
  // an option the user never set, a timer overflow, a hang or a bare
  // TypeError from the client).
  const refused: [unknown, string][] = [
    [{ statementTimeoutMs: 2 ** 31 }, "statementTimeoutMs"],
    [{ lockTimeoutMs: 2 ** 31 }, "lockTimeoutMs"],
    [{ connectTimeoutMs: 2 ** 40 }, "connectTimeoutMs"],
    [{ applicationName: 5 }, "applicationName"],
    [{ applicationName: "a\0b" }, "applicationName"],
    [{ applicationName: "x".repeat(64) }, "applicationName"],
    [{ schema: "pg_x" }, "schema"],
    [null, "options"],
  ];
  for (const [options, field] of refused) {
    await assert.rejects(
      openPostgres(
        "postgres://nobody@127.0.0.1:1/none",
        options as PostgresOutboxOptions,
      ),
      (error: Error) =>
        (error instanceof TypeError || error instanceof RangeError) &&
        error.message.includes(`'${field}'`),
      field,
    );
  }
  await using db = await raw(url, schema);
  assert.deepEqual(
    await db.query("SELECT 1 FROM pg_namespace WHERE nspname = $1", [missing]),
    [],
  );
  await using outbox = await openPostgres(url, { schema: missing });
  assert.equal((await outbox.stats()).pending, 0);
});

Deno.test("postgres: a busyTimeoutMs past the server's longest lock_timeout waits the longest it takes", async () => {
  const { url, schema } = await fresh();
  // 30 days; before, the open failed with the server's error about
  // lock_timeout.
  await using outbox = await openPostgres(url, {
    schema,
    busyTimeoutMs: 30 * 86_400_000,
  });
  assert.deepEqual(
    await outbox.transaction((tx) => tx.query("SHOW lock_timeout")),
    [{ lock_timeout: "2147483647ms" }],
  );
});

Deno.test("R12: four outboxes opening one new schema at once all open, and the schema version is recorded once", async () => {
  const { url, schema } = await fresh();
  const target = `${schema}_r12`;
  const outboxes = await Promise.all(
    [0, 1, 2, 3].map(() => openPostgres(url, { schema: target })),
  );
  try {
    await using db = await raw(url, target);
    assert.deepEqual(
      await db.query("SELECT version FROM outbox_schema ORDER BY version"),
      [{ version: POSTGRES_SCHEMA_VERSION }],
    );
    await outboxes[0]!.enqueue("x");
    assert.equal((await outboxes[3]!.claim())?.payload, "x");
  } finally {
    await Promise.all(outboxes.map((outbox) => outbox.close()));
  }
});

/**
 * Turns a fresh schema's outbox_events back into version 4's (version 7's
 * layout, identity as text, version 5's change; no index of ordering keys'
 * live leases, version 6's) and records version 4.
 */
async function asVersion4(db: Driver): Promise<void> {
  await asPostgresVersion7(db);
  await db.exec(`ALTER TABLE outbox_events ALTER COLUMN identity TYPE text;
    DROP INDEX outbox_events_ordering_leased;
    DELETE FROM outbox_schema;
    INSERT INTO outbox_schema (version, applied_at) VALUES (4, 0)`);
}

async function identityType(db: Driver): Promise<unknown> {
  const [row] = await db.query(
    "SELECT format_type(atttypid, atttypmod) AS type FROM pg_attribute WHERE attrelid = 'outbox_events'::regclass AND attname = 'identity'",
  );
  return row?.["type"];
}

Deno.test("postgres: opening a version 4 schema (identities as text) upgrades it to uuid identities; every event and ledger entry reads as before, and events are claimed, acknowledged and deduplicated by identity as before", async () => {
  await upgradeKeepsEverything(4);
});

Deno.test("postgres: opening a version 7 schema (done events in outbox_events, identities and dedup keys in its unique indexes) moves the done events to outbox_done and fills outbox_keys; every event and ledger entry reads as before, and events are claimed, acknowledged and deduplicated by identity and dedup key as before", async () => {
  await upgradeKeepsEverything(7);
});

/**
 * Events in every state and their ledger in a schema turned back into
 * version `from`; opened, it upgrades to this version and keeps them all.
 */
async function upgradeKeepsEverything(from: 4 | 7): Promise<void> {
  const { url, schema } = await fresh();
  const identities: string[] = [];
  {
    await using outbox = await openPostgres(url, { schema });
    // An event in every state but pending, with the ledger entries they
    // leave: done, a dead letter, and a lease that outlives the test.
    await outbox.enqueueBatch([
      { payload: new Uint8Array([1, 2]), dedupKey: "k", orderingKey: "o" },
      { payload: "dead", maxAttempts: 1 },
      { payload: "leased" },
    ]);
    const [done, dead] = await outbox.claim({ max: 3, leaseMs: 3_600_000 });
    await outbox.acknowledge(done!);
    assert.equal(await outbox.release(dead!, { error: "boom" }), true);
    for (const payload of ["a", "b"]) {
      identities.push((await outbox.enqueue(payload)).identity);
    }
    const upstream = "0190b2c4-7d3e-4a11-8f00-5c0ffee0cafe";
    assert.equal(
      (await outbox.enqueue("c", { identity: upstream })).identity,
      upstream,
    );
    identities.push(upstream);
  }
  await using db = await raw(url, schema);
  const snapshot = async () => ({
    events: await db.query(
      `SELECT id, identity::text AS identity, queue, state, payload, payload_bytes, dedup_key, ordering_key, CASE WHEN state = 'leased' THEN lease_until ELSE due_at END AS due_at, lease_until, token, fence, attempt, max_attempts, last_error, created_at, updated_at, done_at, claimed_at FROM outbox_all ORDER BY id`,
    ),
    ledger: await db.query("SELECT * FROM outbox_ledger ORDER BY seq"),
  });
  const before = await snapshot();
  assert.deepEqual(
    before.events.map((event) => event["state"]),
    ["done", "dead", "leased", "pending", "pending", "pending"],
  );
  if (from === 4) {
    await asVersion4(db);
    assert.equal(await identityType(db), "text");
  } else {
    await asPostgresVersion7(db);
    assert.deepEqual(
      await db.query("SELECT state FROM outbox_events ORDER BY id"),
      before.events.map((event) => ({ state: event["state"] })),
    );
  }

  await using outbox = await openPostgres(url, { schema });
  assert.equal(await identityType(db), "uuid");
  assert.deepEqual(
    await db.query("SELECT version FROM outbox_schema ORDER BY version"),
    [{ version: from }, { version: POSTGRES_SCHEMA_VERSION }],
  );
  assert.equal(POSTGRES_SCHEMA_VERSION, 9);
  // The done event moved; every event's keys are there; the indexes they
  // replace are gone.
  assert.deepEqual(
    await db.query(
      "SELECT (SELECT count(*) FROM outbox_done)::integer AS done, (SELECT count(*) FROM outbox_events WHERE state = 'done')::integer AS left, (SELECT count(*) FROM outbox_keys)::integer AS keys",
    ),
    [{ done: 1, left: 0, keys: 6 }],
  );
  assert.deepEqual(
    await db.query(
      "SELECT indexname FROM pg_indexes WHERE indexname IN ('outbox_events_identity', 'outbox_events_dedup', 'outbox_events_done') AND schemaname = current_schema()",
    ),
    [],
  );
  // The done event's dedup key still deduplicates.
  const done = before.events[0]!;
  const deduplicated = await outbox.enqueue("k again", { dedupKey: "k" });
  assert.deepEqual(deduplicated, {
    eventId: Number(done["id"]),
    identity: done["identity"],
    deduplicated: true,
  });
  assert.deepEqual(
    await db.query(
      "SELECT 1 AS present FROM pg_indexes WHERE indexname = 'outbox_events_key_leases' AND schemaname = current_schema()",
    ),
    [{ present: 1 }],
  );
  assert.deepEqual(await snapshot(), before);
  // The same text comes back, by claim and by lookup, and an enqueue with
  // an identity that exists is deduplicated to its event.
  const leases = await outbox.claim({ max: 3 });
  assert.deepEqual(leases.map((lease) => lease.identity), identities);
  assert.equal((await outbox.explain(identities[2]!))?.identity, identities[2]);
  const again = await outbox.enqueue("c again", { identity: identities[2]! });
  assert.equal(again.deduplicated, true);
  assert.equal(again.eventId, leases[2]!.eventId);
  const batch = await outbox.enqueueBatch([
    { payload: "d" },
    { payload: "a again", identity: identities[0]! },
  ]);
  assert.deepEqual(batch.map((result) => result.deduplicated), [false, true]);
  assert.equal(batch[1]!.eventId, leases[0]!.eventId);
  assert.deepEqual(await outbox.acknowledge(leases), [true, true, true]);
  assert.equal((await outbox.stats()).done, 4);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves once `count` backends of the database wait on `event`, polled. */
async function untilWaitingOn(
  db: Driver,
  event: string,
  count: number,
): Promise<void> {
  const deadline = performance.now() + 20_000;
  for (;;) {
    const [row] = await db.query(
      "SELECT count(*)::integer AS n FROM pg_stat_activity WHERE wait_event = $1 AND datname = current_database()",
      [event],
    );
    if (row?.["n"] === count) return;
    assert.ok(performance.now() < deadline, `${count} waiting on ${event}`);
    await sleep(10);
  }
}

/** A new database of its own, for tests that change its settings. */
async function freshDatabase(): Promise<{ url: string; schema: string }> {
  const server = await sharedPostgres();
  return { url: await server.createDatabase(), schema: "outbox" };
}

/** Makes `value` the default of setting `name` for the database's new sessions. */
async function setDatabaseDefault(
  db: Driver,
  url: string,
  name: string,
  value: string,
): Promise<void> {
  await db.exec(
    `ALTER DATABASE ${new URL(url).pathname.slice(1)} SET ${name} = '${value}'`,
  );
}

/**
 * An outbox schema turned back into version 4: in a fresh schema, or, with
 * `settings`, in a fresh database whose sessions default to them.
 */
async function version4(
  settings?: Record<string, string>,
): Promise<{ url: string; schema: string; db: PostgresDriver }> {
  const { url, schema } = settings === undefined
    ? await fresh()
    : await freshDatabase();
  await (await openPostgres(url, { schema })).close();
  const db = await raw(url, schema);
  for (const [name, value] of Object.entries(settings ?? {})) {
    await setDatabaseDefault(db, url, name, value);
  }
  await asVersion4(db);
  return { url, schema, db };
}

/** The set-up lock, as an opener creating or upgrading the schema holds it. */
const SET_UP_LOCK =
  "SELECT pg_advisory_xact_lock(hashtext('leased_outbox:' || current_schema()))";

/**
 * Runs `sql` in a transaction of its own connection and holds what it
 * locks until `release()`, or 10 s at the latest, so a test that waits for
 * the release fails rather than hangs.
 */
async function holdInTransaction(
  url: string,
  schema: string,
  sql: string,
): Promise<{ release(): Promise<void> }> {
  const holder = await raw(url, schema);
  // The holder outlives the database's transaction_timeout.
  await holder.query(
    "SELECT set_config('transaction_timeout', '0', false) WHERE current_setting('transaction_timeout', true) IS NOT NULL",
  );
  await holder.run("BEGIN");
  await holder.query(sql);
  let released: Promise<void> | undefined;
  const end = () =>
    released ??= holder.run("COMMIT").then(() => holder.close());
  const deadline = setTimeout(end, 10_000);
  return {
    release() {
      clearTimeout(deadline);
      return end();
    },
  };
}

/**
 * Waits until the `openers` all wait on `event` (pg_stat_activity), then
 * `ms` more, before `held` lets go; asserts that each then opened and that
 * the schema is upgraded (identities as uuid). Returns the outboxes, and
 * how many openers had settled before the release.
 */
async function openBehind(
  db: Driver,
  held: { release(): Promise<void> },
  event: string,
  ms: number,
  openers: readonly Promise<Outbox>[],
): Promise<{ outboxes: Outbox[]; settledBefore: number }> {
  let settled = 0;
  const outcomes = openers.map((opener) =>
    opener.then(() => "opened", (error) => String(error)).finally(() =>
      settled++
    )
  );
  await untilWaitingOn(db, event, openers.length);
  await sleep(ms);
  const settledBefore = settled;
  await held.release();
  assert.deepEqual(
    await Promise.all(outcomes),
    openers.map(() => "opened"),
  );
  assert.equal(await identityType(db), "uuid");
  return { outboxes: await Promise.all(openers), settledBefore };
}

Deno.test("postgres: openers wait for another opener's schema upgrade however long it takes, past busyTimeoutMs and statementTimeoutMs, then open", async () => {
  const { url, schema, db } = await version4();
  await using _db = db;
  // An upgrade in progress elsewhere: the set-up lock, held until both
  // openers wait for it and then 300 ms past both timeouts.
  const lock = await holdInTransaction(url, schema, SET_UP_LOCK);
  const { outboxes, settledBefore } = await openBehind(
    db,
    lock,
    "advisory",
    300,
    [0, 1].map(() =>
      openPostgres(url, { schema, busyTimeoutMs: 100, statementTimeoutMs: 100 })
    ),
  );
  assert.equal(settledBefore, 0);
  for (const outbox of outboxes) {
    await outbox.enqueue("x");
    await outbox.close();
  }
});

for (
  const [name, options] of [
    ["busyTimeoutMs", { busyTimeoutMs: 200 }],
    [
      "statementTimeoutMs when lockTimeoutMs is 0",
      { lockTimeoutMs: 0, statementTimeoutMs: 200 },
    ],
  ] as const
) {
  Deno.test(`postgres: an upgrade whose table lock another transaction holds (an older release's, a dump's) fails with BusyError after ${name} and changes nothing`, async () => {
    const { url, schema, db } = await version4();
    await using _db = db;
    // Were the upgrade's wait unbounded, the reader lets go after 10 s and
    // the open succeeds: the test fails rather than hangs.
    const reader = await holdInTransaction(
      url,
      schema,
      "SELECT count(*) FROM outbox_events",
    );
    const started = performance.now();
    try {
      await assert.rejects(
        openPostgres(url, { schema, ...options }),
        BusyError,
      );
    } finally {
      await reader.release();
    }
    const waited = performance.now() - started;
    assert.ok(waited >= 200 && waited < 5_000, `waited ${waited} ms`);
    assert.equal(await identityType(db), "text");
    assert.deepEqual(
      await db.query("SELECT version FROM outbox_schema ORDER BY version"),
      [{ version: 4 }],
    );
  });
}

Deno.test("postgres: with the database's default isolation at REPEATABLE READ, two openers queued behind another's upgrade both open (each transaction is READ COMMITTED), and the outbox works", async () => {
  const { url, schema, db } = await version4({
    default_transaction_isolation: "repeatable read",
  });
  await using _db = db;
  const lock = await holdInTransaction(url, schema, SET_UP_LOCK);
  const { outboxes: [a, b] } = await openBehind(
    db,
    lock,
    "advisory",
    50,
    [0, 1].map(() => openPostgres(url, { schema })),
  );
  try {
    await a!.transaction(async (tx) => {
      await tx.enqueue("x");
      await tx.enqueue("y");
    });
    const leases = await b!.claim({ max: 2 });
    assert.deepEqual(leases.map((lease) => lease.payload), ["x", "y"]);
    assert.deepEqual(await a!.acknowledge(leases), [true, true]);
    assert.equal((await b!.stats()).done, 2);
  } finally {
    await a!.close();
    await b!.close();
  }
});

for (const level of ["repeatable read", "serializable"]) {
  Deno.test(`postgres: with the database's default isolation at ${level}, an acknowledgement that waited for a row another transaction updated succeeds (the one-statement form's serialization failure falls back to a READ COMMITTED transaction), and so does a batch's`, async () => {
    const { url, schema } = await freshDatabase();
    await using db = await raw(url, schema);
    await setDatabaseDefault(db, url, "default_transaction_isolation", level);
    await using outbox = await openPostgres(url, { schema });
    await outbox.enqueueBatch([{ payload: "a" }, { payload: "b" }, {
      payload: "c",
    }]);
    const [one, ...two] = await outbox.claim({ max: 3 });
    for (const leases of [[one!], two]) {
      // Another transaction updates the rows (not their tokens) and holds
      // them while the acknowledgement waits, then commits.
      const holder = await holdInTransaction(
        url,
        schema,
        `UPDATE outbox_events SET updated_at = updated_at
        WHERE id IN (${leases.map((lease) => lease.eventId).join(", ")})`,
      );
      const acknowledged = outbox.acknowledge(leases);
      await untilWaitingOn(db, "transactionid", 1);
      await holder.release();
      assert.deepEqual(await acknowledged, leases.map(() => true));
    }
    assert.equal((await outbox.stats()).done, 3);
    // Each acknowledged once: the failed statement wrote nothing.
    for (const lease of [one!, ...two]) {
      assert.deepEqual(await ledgerKinds(db, lease.eventId), [
        "claimed:1",
        "acknowledged:1",
      ]);
    }
  });
}

// transaction_timeout came with PostgreSQL 17. On an older server (one from
// LEASED_OUTBOX_PG_BIN) the test below cannot test what it says: it is
// reported as ignored, with the reason in its name; every other test opens
// outboxes there, which is what the set-up's leaving the setting alone needs.
const { version: serverVersion } = await sharedPostgres();
const noTransactionTimeout = serverVersion < 17;
/** A test of transaction_timeout: ignored before 17, saying why. */
function needsTransactionTimeout(
  name: string,
): { name: string; ignore: boolean } {
  return {
    name: noTransactionTimeout
      ? `${name} (ignored: PostgreSQL ${serverVersion} has no transaction_timeout)`
      : name,
    ignore: noTransactionTimeout,
  };
}
Deno.test({
  ...needsTransactionTimeout(
    "postgres: an opener waits for another's upgrade past the database's transaction_timeout (PostgreSQL 17 and later), and the set-up runs without it",
  ),
  fn: async () => {
    const { url, schema, db } = await version4({
      transaction_timeout: "500ms",
    });
    await using _db = db;
    const lock = await holdInTransaction(url, schema, SET_UP_LOCK);
    const { outboxes: [outbox] } = await openBehind(
      db,
      lock,
      "advisory",
      1_000,
      [openPostgres(url, { schema })],
    );
    await outbox!.close();
  },
});

Deno.test({
  ...needsTransactionTimeout(
    "postgres: a session the server ends for its transaction_timeout (PostgreSQL 17 and later) fails the call with ConnectionLostError, and the outbox goes on",
  ),
  fn: async () => {
    const { url, schema } = await freshDatabase();
    await using outbox = await openPostgres(url, { schema });
    await using holder = await raw(url, schema);
    const { eventId } = await outbox.enqueue("x");
    const lease = await outbox.claim();
    await setDatabaseDefault(holder, url, "transaction_timeout", "300ms");
    // A new session takes the database's settings: end the outbox's own.
    await holder.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    await outbox.stats().catch(() => {});
    await holder.run("BEGIN");
    await holder.query(
      "SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE",
      [eventId],
    );
    const failed = await outbox.acknowledge(lease!).then(
      () => "acknowledged",
      (error) => error,
    );
    await holder.run("ROLLBACK");
    assert.ok(failed instanceof ConnectionLostError, String(failed));
    assert.equal(failed.code, "25P04");
    assert.equal(await outbox.acknowledge(lease!), true);
  },
});

Deno.test("postgres: an upgrade that waits for a reader's table lock longer than statementTimeoutMs but within lockTimeoutMs completes", async () => {
  const { url, schema, db } = await version4();
  await using _db = db;
  const reader = await holdInTransaction(
    url,
    schema,
    "SELECT count(*) FROM outbox_events",
  );
  const { outboxes: [outbox] } = await openBehind(db, reader, "relation", 400, [
    openPostgres(url, {
      schema,
      lockTimeoutMs: 3_000,
      statementTimeoutMs: 200,
    }),
  ]);
  await outbox!.close();
});

Deno.test("postgres: open() refuses an application's own table named outbox_events (no outbox_schema beside it), naming it, and changes nothing", async () => {
  const { url, schema } = await fresh();
  await using db = await raw(url, schema);
  await db.exec(
    "CREATE TABLE outbox_events (id bigint PRIMARY KEY, body text); INSERT INTO outbox_events VALUES (1, 'keep')",
  );
  await assert.rejects(() => openPostgres(url, { schema }), {
    name: "Error",
    message:
      /table outbox_events is not an outbox's: there is no outbox_schema/,
  });
  assert.deepEqual(
    await db.query("SELECT id, body FROM outbox_events"),
    [{ id: 1, body: "keep" }],
  );
  const [tables] = await db.query(
    `SELECT count(*)::integer AS n FROM pg_tables WHERE schemaname = $1`,
    [schema],
  );
  assert.equal(tables?.["n"], 1);
});

Deno.test("postgres: a schema of a newer version than this release's is refused at open with SchemaVersionError, and nothing changes", async () => {
  const { url, schema } = await fresh();
  await (await openPostgres(url, { schema })).close();
  await using db = await raw(url, schema);
  await db.run(
    "INSERT INTO outbox_schema (version, applied_at) VALUES ($1, 0)",
    [POSTGRES_SCHEMA_VERSION + 1],
  );
  // Refused at once, also while another opener holds the set-up lock
  // (which it lets go after 10 s: too late).
  const lock = await holdInTransaction(url, schema, SET_UP_LOCK);
  const started = performance.now();
  const error = await openPostgres(url, { schema, busyTimeoutMs: 60_000 })
    .then(
      () => assert.fail("opened"),
      (error) => error,
    );
  assert.ok(performance.now() - started < 5_000);
  await lock.release();
  assert.ok(error instanceof SchemaVersionError, String(error));
  assert.equal(error.version, POSTGRES_SCHEMA_VERSION + 1);
  assert.equal(error.supported, POSTGRES_SCHEMA_VERSION);
  assert.deepEqual(
    await db.query("SELECT version FROM outbox_schema ORDER BY version"),
    [{ version: POSTGRES_SCHEMA_VERSION }, {
      version: POSTGRES_SCHEMA_VERSION + 1,
    }],
  );
});

for (const busyTimeoutMs of [100, 0]) {
  Deno.test(
    busyTimeoutMs === 0
      ? "postgres: at busyTimeoutMs 0 an acknowledgement waiting for a row lock fails with BusyError at once, as on SQLite, and changes nothing"
      : "postgres: an acknowledgement waiting for a row lock past busyTimeoutMs fails with BusyError and changes nothing",
    async () => {
      const { url, schema } = await fresh();
      await using outbox = await openPostgres(url, { schema, busyTimeoutMs });
      const { eventId } = await outbox.enqueue("x");
      const lease = await outbox.claim();
      // Were the wait unbounded, the holder lets go after 10 s and the
      // acknowledgement succeeds: the test fails rather than hangs.
      const holder = await holdInTransaction(
        url,
        schema,
        `SELECT 1 FROM outbox_events WHERE id = ${eventId} FOR UPDATE`,
      );
      const started = performance.now();
      try {
        await assert.rejects(outbox.acknowledge(lease!), BusyError);
      } finally {
        await holder.release();
      }
      if (busyTimeoutMs === 0) assert.ok(performance.now() - started < 4_000);
      await using db = await raw(url, schema);
      assert.deepEqual(await ledgerKinds(db, eventId), ["claimed:1"]);
      assert.equal(await outbox.acknowledge(lease!), true);
    },
  );
}

Deno.test("postgres: on the server's clock, a lapsed last-attempt lease is a dead letter at the next call", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema, maxAttempts: 1 });
  const { eventId } = await outbox.enqueue("x");
  const lease = await outbox.claim({ leaseMs: 1 });
  // Real time is the subject: the server's clock must pass the deadline.
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.deepEqual(
    (await outbox.stats()).dead,
    1,
  );
  assert.equal(await outbox.acknowledge(lease!), false);
  const history = (await outbox.explain(eventId))!.history.map((entry) =>
    entry.kind
  );
  assert.deepEqual(history, [
    "claimed",
    "expired",
    "dead",
    "stale_acknowledge",
  ]);
});

Deno.test("postgres: a call that reads while another transaction makes a lapsed last-attempt lease dead waits for it, and reads it dead", async () => {
  const { url, schema } = await fresh();
  const clock = new ManualClock(1_000_000);
  const options = { now: clock.now, maxAttempts: 1 };
  await using reader = await Outbox.open(await raw(url, schema), options);
  await using other = await raw(url, schema);
  await using admin = await raw(url, schema);
  const { eventId } = await reader.enqueue("x");
  await reader.claim({ leaseMs: 1_000 });
  clock.advance(2_000);
  // Another outbox's transaction at its first step: it locks the lapsed
  // lease and makes it a dead letter, and holds the row until COMMIT.
  await other.run("BEGIN");
  const exhausted = await other.query(POSTGRES.exhausted, [clock.ms]);
  assert.deepEqual(exhausted.map((row) => Number(row["id"])), [eventId]);
  await other.run(POSTGRES.expire, [clock.ms, JSON.stringify([eventId])]);
  const stats = reader.stats();
  // Until stats waits for the row lock, or (the defect) returns without.
  await untilWaiting(admin, stats);
  await other.run("COMMIT");
  const { leased, dead } = await stats;
  assert.deepEqual({ leased, dead }, { leased: 0, dead: 1 });
});

Deno.test("postgres: a release waits for the row before writing the ledger entries it holds, so it never deadlocks with a claim taking the lapsed lease over", async () => {
  const { url, schema } = await fresh();
  const clock = new ManualClock(1_000_000);
  await using outbox = await Outbox.open(await raw(url, schema), {
    now: clock.now,
  });
  await using claimer = await raw(url, schema);
  await using admin = await raw(url, schema);
  const { eventId } = await outbox.enqueue("x");
  const lease = await outbox.claim({ leaseMs: 1_000 });
  clock.advance(2_000);
  // A claim taking the lapsed lease over, between its candidates' lock and
  // its writing the entries the row holds, while the release starts.
  await claimer.run("BEGIN");
  await claimer.query(
    "SELECT id FROM outbox_events WHERE id = $1 FOR UPDATE",
    [eventId],
  );
  const release = outbox.release(lease!);
  await untilWaiting(admin, release);
  // The claim's entries: before the fix, the release had written the same
  // entry and waited for the row, so this waited for the release (deadlock).
  await claimer.run(POSTGRES.writeUnwritten, [JSON.stringify([eventId])]);
  await claimer.run(
    "UPDATE outbox_events SET fence = fence + 1, token = 'taken' WHERE id = $1",
    [eventId],
  );
  await claimer.run("COMMIT");
  assert.equal(await release, false);
  assert.deepEqual(await ledgerKinds(admin, eventId), [
    "claimed:1",
    "claimed:2",
    "stale_release:1",
  ]);
});

/**
 * Two last-attempt leases (a < b), lapsed unless `lapse` is false, a live
 * lease, and `other` holding b's row in a transaction whose
 * deadlock_timeout outlasts the server's (1 s): in a deadlock with
 * `other`, the outbox's backend finds it first and is its victim. The
 * outbox runs on `connection` when given (its schema's tables are made).
 */
async function deadlockScene(
  lapse = true,
  connection?: (url: string, schema: string) => Promise<Driver>,
) {
  const { url, schema } = await fresh();
  const clock = new ManualClock(1_000_000);
  const outbox = await Outbox.open(
    await (connection ?? raw)(url, schema),
    { now: clock.now },
  );
  const other = await raw(url, schema);
  const admin = await raw(url, schema);
  const a = await outbox.enqueue("a", { maxAttempts: 1 });
  const b = await outbox.enqueue("b", { maxAttempts: 1 });
  await outbox.enqueue("c");
  await outbox.claim({ max: 2, leaseMs: 1_000 });
  const live = (await outbox.claim({ leaseMs: 60_000 }))!;
  if (lapse) clock.advance(2_000);
  await other.run("SET deadlock_timeout = '60s'");
  await other.run("BEGIN");
  const lock = (eventId: number) =>
    other.query("SELECT id FROM outbox_events WHERE id = $1 FOR UPDATE", [
      eventId,
    ]);
  await lock(b.eventId);
  return {
    outbox,
    other,
    admin,
    live,
    a: a.eventId,
    b: b.eventId,
    lock,
    async [Symbol.asyncDispose]() {
      await outbox.close();
      await other.close();
      await admin.close();
    },
  };
}

Deno.test("postgres: an outbox call that a deadlock rolls back runs again and succeeds, having changed nothing the first time", async () => {
  await using scene = await deadlockScene();
  const { outbox, other, admin, live, a, b, lock } = scene;
  let settled = false;
  // Its transaction first makes the lapsed leases dead letters, locking a,
  // then waiting for b.
  const release = outbox.release(live).finally(() => settled = true);
  await untilWaiting(admin, release);
  // Granted once the server rolls the outbox's transaction back (before the
  // fix, the release then failed with PostgresError 40P01).
  await lock(a);
  assert.equal(settled, false);
  await other.run("ROLLBACK");
  assert.equal(await release, true);
  const stats = await outbox.stats();
  assert.deepEqual({ pending: stats.pending, dead: stats.dead }, {
    pending: 1,
    dead: 2,
  });
  assert.deepEqual(await ledgerKinds(admin, a), [
    "claimed:1",
    "expired:1",
    "dead:1",
  ]);
  assert.deepEqual(await ledgerKinds(admin, b), [
    "claimed:1",
    "expired:1",
    "dead:1",
  ]);
  assert.deepEqual(await ledgerKinds(admin, live.eventId), [
    "claimed:1",
    "released:1",
  ]);
});

Deno.test("postgres: an application transaction begun on the shared connection while a deadlock's rerun waits is waited for, not run inside", async () => {
  let shared: PostgresDriver | undefined;
  let application: Promise<void> | undefined;
  await using scene = await deadlockScene(true, async (url, schema) => {
    shared = await raw(url, schema);
    const run = shared.run.bind(shared);
    // The moment the outbox rolls its deadlocked transaction back, the
    // application (a request on the same connection) begins its own.
    shared.run = async (sql, params) => {
      const result = await run(sql, params);
      if (sql === POSTGRES.rollback && application === undefined) {
        application = (async () => {
          await run("BEGIN");
          await run("CREATE TABLE app_rows (n integer)");
          await new Promise((resolve) => setTimeout(resolve, 300));
          await run("ROLLBACK");
        })();
      }
      return result;
    };
    return shared;
  });
  const { outbox, other, admin, live, a, lock } = scene;
  const release = outbox.release(live);
  await untilWaiting(admin, release);
  await lock(a);
  // Before the fix, the rerun began inside the application's transaction
  // and its COMMIT committed the application's table.
  await application;
  await other.run("ROLLBACK");
  assert.equal(await release, true);
  assert.deepEqual(
    await admin.query("SELECT to_regclass('app_rows') IS NULL AS absent"),
    [{ absent: true }],
  );
  assert.equal((await outbox.stats()).dead, 2);
});

Deno.test("postgres: an outbox call whose reruns are deadlock victims past busyTimeoutMs fails with BusyError (its cause the PostgresError 40P01) and changes nothing", async () => {
  const { url, schema } = await fresh();
  const driver = await raw(url, schema);
  const run = driver.run.bind(driver);
  const query = driver.query.bind(driver);
  let inTransaction = false;
  let victims = 0;
  let armed = false;
  // Once armed, every statement of a transaction is a deadlock's victim,
  // as the server reports one: the transaction is left for ROLLBACK.
  const victim = (sql: string) => {
    const keyword = sql.trim().split(/\s+/)[0]!.toUpperCase();
    if (keyword === "BEGIN") inTransaction = true;
    if (keyword === "COMMIT" || keyword === "ROLLBACK") inTransaction = false;
    if (armed && inTransaction && keyword !== "BEGIN") {
      victims++;
      throw new PostgresError("deadlock detected", "40P01");
    }
  };
  driver.run = async (sql, params) => {
    victim(sql);
    return await run(sql, params);
  };
  driver.query = async (sql, params) => {
    victim(sql);
    return await query(sql, params);
  };
  const clock = new ManualClock(1_000_000);
  await using outbox = await Outbox.open(driver, {
    now: clock.now,
    busyTimeoutMs: 200,
  });
  await outbox.enqueue("a", { maxAttempts: 1 });
  const lease = (await outbox.claim({ leaseMs: 1_000 }))!;
  // Lapsed on its last attempt: the one-statement release refuses, and the
  // general path's transaction (the dead letter first) runs.
  clock.advance(2_000);
  armed = true;
  const started = performance.now();
  await assert.rejects(outbox.release(lease), (error: Error) => {
    assert.equal(error.name, "BusyError");
    assert.match(error.message, /Cannot release as .*200 ms/);
    const cause = error.cause as PostgresError;
    assert.equal(cause.name, "PostgresError");
    assert.equal(cause.code, "40P01");
    return true;
  });
  armed = false;
  assert.ok(performance.now() - started >= 200);
  assert.ok(victims > 1, `reran ${victims} times`);
  // Read as it is (an outbox call would first make the lapsed lease a dead
  // letter).
  assert.deepEqual(
    await query("SELECT state, fence FROM outbox_events WHERE id = $1", [
      lease.eventId,
    ]),
    [{ state: "leased", fence: 1 }],
  );
  assert.deepEqual(
    await query(
      "SELECT kind FROM outbox_ledger WHERE event_id = $1 ORDER BY seq",
      [lease.eventId],
    ),
    [{ kind: "claimed" }],
  );
});

Deno.test("postgres: transaction(fn) that a deadlock rolls back fails with PostgresError 40P01 and does not run the application's code again", async () => {
  await using scene = await deadlockScene(false);
  const { outbox, other, admin, a, b, lock } = scene;
  let runs = 0;
  const call = outbox.transaction(async (tx) => {
    runs++;
    const rows = (id: number) =>
      tx.query("SELECT id FROM outbox_events WHERE id = $1 FOR UPDATE", [id]);
    await rows(a);
    await rows(b);
  });
  await untilWaiting(admin, call);
  await lock(a);
  await other.run("ROLLBACK");
  await assert.rejects(call, (error: Error & { code?: string }) => {
    assert.equal(error.name, "PostgresError");
    assert.equal(error.code, "40P01");
    return true;
  });
  assert.equal(runs, 1);
  const stats = await outbox.stats();
  assert.deepEqual({ leased: stats.leased, dead: stats.dead }, {
    leased: 3,
    dead: 0,
  });
});

Deno.test("postgres: processEvents at concurrency 4, with events trickling in and handlers of 0-2 ms, never runs more than 4 handlers (with at most 4 acknowledgements under way beside them) and acknowledges each event once", async () => {
  const { url, schema } = await fresh();
  const events = 2_000;
  const outbox = await openPostgres<{ n: number }>(url, { schema });
  const producer = await openPostgres<{ n: number }>(url, { schema });
  // Events trickle in, so the loop's own claims run with slots free while
  // handlers finish and their acknowledgements claim too.
  const produced = (async () => {
    for (let n = 0; n < events;) {
      const k = Math.min(events - n, 1 + Math.floor(Math.random() * 3));
      await producer.enqueueBatch(
        Array.from({ length: k }, (_, i) => ({ payload: { n: n + i } })),
      );
      n += k;
      await new Promise((resolve) =>
        setTimeout(resolve, Math.floor(Math.random() * 3))
      );
    }
  })();
  let running = 0;
  let most = 0;
  let mostInFlight = 0;
  const errors: unknown[] = [];
  const processor = processEvents(outbox, async () => {
    most = Math.max(most, ++running);
    mostInFlight = Math.max(mostInFlight, processor.inFlight);
    await new Promise((resolve) =>
      setTimeout(resolve, Math.floor(Math.random() * 3))
    );
    running--;
  }, {
    concurrency: 4,
    pollMinMs: 5,
    pollMaxMs: 20,
    onError: (error) => errors.push(error),
  });
  try {
    await produced;
    while ((await outbox.stats()).done < events) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  } finally {
    await processor.stop();
    await producer.close();
  }
  const stats = await outbox.stats();
  await outbox.close();
  assert.deepEqual(errors, []);
  assert.ok(most <= 4, `${most} handlers at once`);
  // A slot's acknowledgement may still be under way while the next handler
  // runs on a lease claimed ahead: at most one of each per slot.
  assert.ok(mostInFlight <= 8, `inFlight up to ${mostInFlight}`);
  assert.equal(stats.done, events);
  assert.equal(processor.counters.acknowledged, events);
  assert.equal(processor.counters.claimed, events);
});

Deno.test("postgres: a claim of events without ordering or concurrency keys before their last attempt, and a renewal, are HOT updates (schema version 9: no index names a column they change); a keyed claim is not", async () => {
  const { url, schema } = await fresh();
  await using outbox = await openPostgres(url, { schema, listen: false });
  await using db = await raw(url, schema);
  // The outbox's backend reports its counts at its next idle moment.
  const counts = async () => {
    await outbox.transaction((tx) =>
      tx.query("SELECT pg_stat_force_next_flush()")
    );
    const [row] = await db.query(
      `SELECT n_tup_upd::integer AS updates, n_tup_hot_upd::integer AS hot
      FROM pg_stat_user_tables
      WHERE schemaname = current_schema() AND relname = 'outbox_events'`,
    );
    return row;
  };
  await outbox.enqueueBatch(
    Array.from({ length: 64 }, (_, i) => ({ payload: { i } })),
  );
  const leases = await outbox.claim({ max: 64 });
  assert.equal(leases.length, 64);
  for (const lease of leases) {
    assert.ok(await outbox.renew(lease, 60_000) !== null);
  }
  assert.deepEqual(await counts(), { updates: 128, hot: 128 });
  await outbox.enqueue("keyed", { orderingKey: "k" });
  assert.equal((await outbox.claim({ max: 1 }))[0]?.orderingKey, "k");
  assert.deepEqual(await counts(), { updates: 129, hot: 128 });
});
