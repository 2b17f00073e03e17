/** Features beyond the cases: transactions, dedup, ordering, batches, retention. */
import assert from "node:assert/strict";
import {
  BusyError,
  Inbox,
  type Lease,
  LeaseLostError,
  Outbox,
  SCHEMA_SQL,
  SCHEMA_VERSION,
  type Transaction,
  uuidv7Time,
} from "../mod.ts";
import { DatabaseSync } from "node:sqlite";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { driverTest, eventRow, type Harness, snapshot } from "./helpers.ts";
import { SQLITE_DRIVERS as DRIVERS } from "./drivers.ts";

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("transaction() commits the business row and the event together, or neither", async ({ open, raw }) => {
    const [a] = await open();
    await raw.exec(
      "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL) STRICT",
    );
    await a!.transaction(async (tx) => {
      await tx.run("INSERT INTO orders (total) VALUES (?)", [10]);
      await tx.enqueue({ order: 1 });
    });
    await assert.rejects(
      () =>
        a!.transaction(async (tx) => {
          await tx.enqueue({ order: 2 });
          await tx.run("INSERT INTO orders (total) VALUES (?)", [
            "not a number",
          ]);
        }),
      { name: "ConstraintError" },
    );
    assert.deepEqual(await raw.query("SELECT total FROM orders"), [{
      total: 10,
    }]);
    assert.equal((await a!.stats()).pending, 1);
  });

  test("tx.acknowledge() commits the handler's row with the acknowledgement", async ({ open, raw }) => {
    const [a] = await open();
    await raw.exec(
      "CREATE TABLE receipts (event_id INTEGER PRIMARY KEY) STRICT",
    );
    const { eventId } = await a!.enqueue("x");
    const lease = await a!.claim();
    await a!.transaction(async (tx) => {
      await tx.run("INSERT INTO receipts VALUES (?)", [lease!.eventId]);
      await tx.acknowledge(lease!);
    });
    assert.deepEqual(await raw.query("SELECT event_id FROM receipts"), [{
      event_id: eventId,
    }]);
    assert.equal((await eventRow(raw, eventId))?.["state"], "done");
  });

  test("tx.acknowledge() with a stale token rolls back the handler's row too", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    await raw.exec(
      "CREATE TABLE receipts (event_id INTEGER PRIMARY KEY) STRICT",
    );
    const { eventId } = await a!.enqueue("x");
    const stale = await a!.claim({ leaseMs: 10 });
    clock.set(10);
    const current = await b!.claim({ leaseMs: 10 });
    const before = await snapshot(raw);
    await assert.rejects(
      () =>
        a!.transaction(async (tx) => {
          await tx.run("INSERT INTO receipts VALUES (?)", [eventId]);
          await tx.acknowledge(stale!);
        }),
      (e: unknown) =>
        e instanceof LeaseLostError && e.eventId === eventId && e.fence === 1,
    );
    const after = await snapshot(raw);
    assert.deepEqual(after.events, before.events);
    assert.deepEqual(after.attempts, before.attempts);
    assert.deepEqual(await raw.query("SELECT event_id FROM receipts"), []);
    assert.equal(await b!.acknowledge(current!), true);
  });

  test("enqueue() with a dedup key returns the original id, also after it is done", async ({ open }) => {
    const [a] = await open();
    const first = await a!.enqueue("x", { dedupKey: "order-7" });
    assert.deepEqual(await a!.enqueue("y", { dedupKey: "order-7" }), {
      eventId: first.eventId,
      identity: first.identity,
      deduplicated: true,
    });
    await a!.acknowledge((await a!.claim())!);
    assert.deepEqual(await a!.enqueue("z", { dedupKey: "order-7" }), {
      eventId: first.eventId,
      identity: first.identity,
      deduplicated: true,
    });
    const other = await a!.enqueue("x", {
      dedupKey: "order-7",
      queue: "other",
    });
    assert.equal(other.deduplicated, false);
    assert.equal((await a!.stats()).done, 1);
  });

  test("enqueue() assigns each event a UUIDv7 identity that its leases, dead letter, retry and explain() carry unchanged", async ({ clock, open }) => {
    const [a, b] = await open({ maxAttempts: 1 });
    clock.set(1_700_000_000_000);
    const { eventId, identity } = await a!.enqueue("x");
    assert.match(
      identity,
      /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
    );
    assert.ok(uuidv7Time(identity) >= 1_700_000_000_000);
    const first = await a!.claim({ leaseMs: 10 });
    assert.equal(first?.identity, identity);
    clock.advance(10);
    // The lapsed last attempt makes it a dead letter.
    assert.equal(await b!.claim(), null);
    const [dead] = await b!.deadLetters();
    assert.deepEqual([dead?.eventId, dead?.identity], [eventId, identity]);
    assert.equal(await b!.redrive({ ids: [eventId] }), 1);
    const second = await b!.claim();
    assert.deepEqual([second?.identity, second?.fence], [identity, 2]);
    assert.equal(await b!.release(second!), true);
    const third = await a!.redrive({ ids: [eventId] }) === 1 &&
      await a!.claim();
    assert.deepEqual([third && third.identity, third && third.fence], [
      identity,
      3,
    ]);
    const byId = await a!.explain(eventId);
    assert.equal(byId?.identity, identity);
    assert.deepEqual(await a!.explain(identity), byId);
  });

  test("enqueue() keeps a supplied identity, and one that exists already returns its event deduplicated, across queues", async ({ open, raw }) => {
    const [a] = await open();
    const upstream = "3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8";
    const first = await a!.enqueue("x", { identity: upstream });
    assert.deepEqual(first, {
      eventId: first.eventId,
      identity: upstream,
      deduplicated: false,
    });
    assert.deepEqual(
      await a!.enqueue("y", { identity: upstream, queue: "other" }),
      { ...first, deduplicated: true },
    );
    // A dedup key names its event first; the supplied identity then goes unused.
    const keyed = await a!.enqueue("k", { dedupKey: "order-1" });
    assert.deepEqual(
      await a!.enqueue("z", { dedupKey: "order-1", identity: upstream }),
      { ...keyed, deduplicated: true },
    );
    const [count] = await raw.query("SELECT count(*) AS n FROM outbox_events");
    assert.equal(count?.["n"], 2);
    assert.equal((await a!.claim())?.identity, upstream);
  });

  test("enqueue() refuses an identity that is not canonical lowercase UUID text before any SQL", async ({ open, raw, sent }) => {
    const [a] = await open();
    const before = await snapshot(raw);
    const statements = sent();
    for (
      const identity of [
        "3F2B8C1E-9A4D-4E6F-B1C2-D3E4F5A6B7C8",
        "3f2b8c1e9a4d4e6fb1c2d3e4f5a6b7c8",
        "{3f2b8c1e-9a4d-4e6f-b1c2-d3e4f5a6b7c8}",
        "",
        42,
        null,
      ]
    ) {
      await assert.rejects(
        () => a!.enqueue("x", { identity: identity as string }),
        new TypeError(
          `Cannot enqueue as 'identity' must be a UUID in canonical lowercase text (8-4-4-4-12 hex digits): current value is ${
            typeof identity === "string" ? JSON.stringify(identity) : identity
          }`,
        ),
      );
      if (typeof identity === "string") {
        await assert.rejects(
          () => a!.explain(identity),
          /Cannot explain as 'event' must be a UUID/,
        );
      }
    }
    assert.equal(sent(), statements);
    assert.deepEqual(await snapshot(raw), before);
  });

  test("enqueue(), enqueueBatch(), tx.enqueue(), a group commit and schedule() refuse a payload JSON would change, naming the place in it, before any SQL", async ({ open, raw, sent }) => {
    const [a] = await open();
    const cycle: Record<string, unknown> = { a: 1 };
    cycle["self"] = cycle;
    const cases: [unknown, string, string][] = [
      [{ a: NaN }, "payload.a", "NaN"],
      [[1, Infinity], "payload[1]", "Infinity"],
      [-Infinity, "payload", "-Infinity"],
      [[undefined], "payload[0]", "undefined"],
      [{ list: [1, () => 1] }, "payload.list[1]", "a function"],
      [{ d: new Date(0) }, "payload.d", "a Date"],
      [new Map([[1, 2]]), "payload", "a Map"],
      [{ s: new Set([1]) }, "payload.s", "a Set"],
      [new ArrayBuffer(4), "payload", "an ArrayBuffer"],
      [new Uint16Array([1, 2]), "payload", "a Uint16Array"],
      [{ b: new Uint8Array([1, 2]) }, "payload.b", "a Uint8Array"],
      [[new Uint8Array(1)], "payload[0]", "a Uint8Array"],
      [{ "a b": [{ c: 1n }] }, 'payload["a b"][0].c', "1n"],
      [new String("x"), "payload", "a String"],
      [new (class Order {})(), "payload", "an Order"],
    ];
    const shaped: [unknown, string, string, string][] = [
      [
        { toJSON: () => 1 },
        "payload",
        ", without a toJSON method",
        "an object",
      ],
      [[1, , 3], "payload", ", without holes (index 1)", "an array"],
      [{ [Symbol("s")]: 1 }, "payload", ", without symbol keys", "an object"],
      [cycle, "payload.self", ", not a cycle", "an object"],
    ];
    const all = [
      ...cases.map(([p, f, v]) => [p, f, "", v] as const),
      ...shaped,
    ];
    const message = (op: string, field: string, why: string, value: string) =>
      new TypeError(
        `Cannot ${op} as '${field}' must be JSON data (a plain object, an array, a string, a finite number, a boolean or null, which JSON gives back as it is)${why}: current value is ${value}`,
      );
    const before = await snapshot(raw);
    const statements = sent();
    for (const [payload, field, why, value] of all) {
      await assert.rejects(
        () => a!.enqueue(payload),
        message("enqueue", field, why, value),
      );
      await assert.rejects(
        () => a!.enqueueBatch([{ payload: 1 }, { payload }]),
        message(
          "enqueue batch",
          field.replace("payload", "events[1].payload"),
          why,
          value,
        ),
      );
      await assert.rejects(
        () => a!.schedule("s", "* * * * *", payload),
        message("schedule", field, why, value),
      );
    }
    assert.equal(sent(), statements);
    assert.deepEqual(await snapshot(raw), before);
    // Inside a transaction, and beside other calls of one group commit.
    await a!.transaction(async (tx) => {
      await assert.rejects(
        () => tx.enqueue({ a: NaN }),
        message("enqueue", "payload.a", "", "NaN"),
      );
      await assert.rejects(
        () => tx.enqueueBatch([{ payload: { d: new Date(0) } }]),
        message("enqueue batch", "events[0].payload.d", "", "a Date"),
      );
    });
    assert.deepEqual(await snapshot(raw), before);
    const settled = await Promise.allSettled([
      a!.enqueue({ n: 1 }),
      a!.enqueue({ n: new Map() }),
      a!.enqueue({ n: 3 }),
    ]);
    assert.deepEqual(settled.map((s) => s.status), [
      "fulfilled",
      "rejected",
      "fulfilled",
    ]);
    assert.deepEqual(
      (settled[1] as PromiseRejectedResult).reason,
      message("enqueue", "payload.n", "", "a Map"),
    );
    assert.deepEqual(
      (await a!.claim({ max: 10 })).map((lease) => lease.payload),
      [{ n: 1 }, { n: 3 }],
    );
  });

  test("payloads JSON keeps come back from claim() as enqueued, bytes as bytes", async ({ open }) => {
    const [a] = await open();
    const payloads: unknown[] = [
      null,
      true,
      0,
      -1.5,
      2 ** 60,
      Number.MAX_VALUE,
      "",
      "\ud800 lone surrogate",
      [],
      [1, "two", null, false, [{}]],
      { a: { b: { c: [1, 2, 3] } }, "key with spaces": "v", "": 0 },
      new Uint8Array([0, 1, 255]),
    ];
    for (const payload of payloads) await a!.enqueue(payload);
    const plain = Object.assign(Object.create(null), { x: [1] });
    await a!.enqueue(plain);
    // An optional member left undefined is dropped, as JSON drops it.
    await a!.enqueue({ a: undefined, b: [{ c: undefined }] });
    const leases = await a!.claim({ max: 100 });
    assert.deepEqual(
      leases.map((lease) => lease.payload),
      [...payloads, { x: [1] }, { b: [{}] }],
    );
  });

  test("an ordering key holds later events until the earlier one is done or dead", async ({ open }) => {
    const [a] = await open({ maxAttempts: 1 });
    const e1 = await a!.enqueue(1, { orderingKey: "user-1" });
    const e2 = await a!.enqueue(2, { orderingKey: "user-1" });
    const e3 = await a!.enqueue(3, { orderingKey: "user-2" });
    const batch = await a!.claim({ max: 10 });
    assert.deepEqual(batch.map((l) => l.eventId), [e1.eventId, e3.eventId]);
    assert.equal(await a!.claim(), null);
    await a!.release(batch[0]!, { error: "poison" });
    const next = await a!.claim();
    assert.equal(next?.eventId, e2.eventId);
    assert.deepEqual(
      (await a!.deadLetters()).map((d) => [d.eventId, d.lastError]),
      [[e1.eventId, "poison"]],
    );
  });

  test("a redriven earlier event of an ordering key waits while a later event's lease is live, and is claimed once that lease ends", async ({ clock, open }) => {
    const [a] = await open({ maxAttempts: 1 });
    const e1 = await a!.enqueue(1, { orderingKey: "k" });
    const e2 = await a!.enqueue(2, { orderingKey: "k" });
    assert.equal(
      await a!.release((await a!.claim())!, { error: "poison" }),
      true,
    );
    const later = await a!.claim({ leaseMs: 100 });
    assert.equal(later?.eventId, e2.eventId);
    assert.equal(await a!.redrive({ ids: [e1.eventId] }), 1);
    clock.set(99);
    assert.deepEqual(await a!.claim({ max: 10 }), []);
    clock.set(100);
    // The later event's lapsed lease waits behind the earlier event.
    assert.deepEqual((await a!.claim({ max: 10 })).map((l) => l.eventId), [
      e1.eventId,
    ]);
  });

  test("delayMs holds an event until its due time", async ({ clock, open }) => {
    const [a] = await open();
    const { eventId } = await a!.enqueue("later", { delayMs: 500 });
    clock.set(499);
    assert.equal(await a!.claim(), null);
    clock.set(500);
    assert.equal((await a!.claim())?.eventId, eventId);
  });

  test("release() makes the event claimable after its delay and keeps the error", async ({ clock, open }) => {
    const [a] = await open();
    const { eventId } = await a!.enqueue("x");
    const lease = await a!.claim({ leaseMs: 1000 });
    assert.equal(
      await a!.release(lease!, { delayMs: 100, error: "503 from receiver" }),
      true,
    );
    assert.equal(await a!.acknowledge(lease!), false);
    clock.set(99);
    assert.equal(await a!.claim(), null);
    clock.set(100);
    const again = await a!.claim();
    assert.deepEqual([
      again?.eventId,
      again?.attempt,
      again?.fence,
      again?.lastError,
    ], [
      eventId,
      2,
      2,
      "503 from receiver",
    ]);
  });

  test("claim({ max }) and acknowledge([...]) work on batches in one transaction each", async ({ open }) => {
    const [a] = await open();
    for (let i = 0; i < 5; i++) await a!.enqueue(i);
    const leases = await a!.claim({ max: 3 });
    assert.deepEqual(leases.map((l) => l.payload), [0, 1, 2]);
    assert.equal(new Set(leases.map((l) => l.token)).size, 3);
    assert.deepEqual(await a!.acknowledge([...leases, leases[0]!]), [
      true,
      true,
      true,
      false,
    ]);
    assert.deepEqual((await a!.claim({ max: 10 })).map((l) => l.payload), [
      3,
      4,
    ]);
    assert.deepEqual(await a!.claim({ max: 10 }), []);
  });

  test("claim({ max }) returns leases in claim order, by due time then id, taking over lapsed leases", async ({ clock, open }) => {
    const [a] = await open();
    const e1 = await a!.enqueue(1, { delayMs: 30 });
    const e2 = await a!.enqueue(2);
    const e3 = await a!.enqueue(3, { delayMs: 10 });
    const e4 = await a!.enqueue(4);
    const [lapsing] = await a!.claim({ max: 1, leaseMs: 20 });
    assert.equal(lapsing?.eventId, e2.eventId);
    clock.set(40);
    // Due at 0, 10, 20 (the lapsed lease's deadline) and 30: the reverse of
    // the ids, so an answer in row order would fail.
    const leases = await a!.claim({ max: 10, leaseMs: 100 });
    assert.deepEqual(
      leases.map((
        l,
      ) => [l.eventId, l.fence, l.attempt, l.leaseUntil, l.lastError]),
      [
        [e4.eventId, 1, 1, 140, null],
        [e3.eventId, 1, 1, 140, null],
        [e2.eventId, 2, 2, 140, "lease expired"],
        [e1.eventId, 1, 1, 140, null],
      ],
    );
    assert.deepEqual(leases.map((l) => l.payload), [4, 3, 2, 1]);
    assert.deepEqual(
      (await a!.explain(e2.eventId))?.history.map((e) => [
        e.kind,
        e.fence,
        e.at,
        e.token,
        e.leaseUntil,
        e.detail,
      ]),
      [
        ["claimed", 1, 0, lapsing!.token, 20, null],
        ["expired", 1, 40, null, null, "lease expired"],
        ["claimed", 2, 40, leases[2]!.token, 140, null],
      ],
    );
  });

  test("claim({ max }) takes only the first unfinished event of each ordering key", async ({ clock, open }) => {
    const [a] = await open();
    const k1 = await a!.enqueue("k1", { orderingKey: "k" });
    const k2 = await a!.enqueue("k2", { orderingKey: "k" });
    await a!.enqueue("j1", { orderingKey: "j", delayMs: 50 });
    const j2 = await a!.enqueue("j2", { orderingKey: "j" });
    const free = await a!.enqueue("free");
    assert.equal((await a!.claim({ leaseMs: 10 }))?.eventId, k1.eventId);
    clock.set(10);
    // k2 waits for k1 (leased, lapsed, claimed again in this batch); j2 waits
    // for j1, which is not due yet.
    const batch = await a!.claim({ max: 10 });
    assert.deepEqual(batch.map((l) => l.eventId), [
      free.eventId,
      k1.eventId,
    ]);
    assert.deepEqual(await a!.acknowledge(batch), [true, true]);
    assert.deepEqual((await a!.claim({ max: 10 })).map((l) => l.eventId), [
      k2.eventId,
    ]);
    clock.set(50);
    assert.deepEqual((await a!.claim({ max: 10 })).map((l) => l.payload), [
      "j1",
    ]);
    assert.notEqual(j2.eventId, 0);
  });

  test("acknowledge([...]) answers live, stale and repeated leases in input order, with the ledger of calls made one by one", async ({ clock, open, raw }) => {
    const [a] = await open();
    const e1 = await a!.enqueue(1);
    const e2 = await a!.enqueue(2);
    const e3 = await a!.enqueue(3);
    const l1 = await a!.claim({ leaseMs: 100 });
    const l2 = await a!.claim({ leaseMs: 10 });
    const l3 = await a!.claim({ leaseMs: 100 });
    clock.set(10);
    const l2b = await a!.claim({ leaseMs: 100 });
    assert.equal(l2b?.eventId, e2.eventId);
    clock.set(11);
    assert.deepEqual(
      await a!.acknowledge([
        l2!,
        l1!,
        l1!,
        l2b!,
        { ...l3!, fence: 2 },
        l3!,
        { ...l1!, eventId: 999 },
      ]),
      [false, true, false, true, false, true, false],
    );
    const history = async (eventId: number) =>
      (await a!.explain(eventId))?.history.map((e) => [
        e.kind,
        e.fence,
        e.at,
        e.token,
        e.leaseUntil,
      ]);
    assert.deepEqual(await history(e1.eventId), [
      ["claimed", 1, 0, l1!.token, 100],
      ["acknowledged", 1, 11, l1!.token, null],
      ["stale_acknowledge", 1, 11, l1!.token, null],
    ]);
    assert.deepEqual(await history(e2.eventId), [
      ["claimed", 1, 0, l2!.token, 10],
      ["expired", 1, 10, null, null],
      ["claimed", 2, 10, l2b!.token, 110],
      ["stale_acknowledge", 1, 11, l2!.token, null],
      ["acknowledged", 2, 11, l2b!.token, null],
    ]);
    assert.deepEqual(await history(e3.eventId), [
      ["claimed", 1, 0, l3!.token, 100],
      ["stale_acknowledge", 2, 11, l3!.token, null],
      ["acknowledged", 1, 11, l3!.token, null],
    ]);
    const [orphans] = await raw.query(
      "SELECT count(*) AS n FROM outbox_attempts WHERE event_id = 999",
    );
    assert.equal(orphans?.["n"], 0);
    assert.equal((await a!.stats()).done, 3);
  });

  test("a supplied token the event was claimed with before is refused", async ({ clock, open, raw }) => {
    const [a] = await open();
    await a!.enqueue("x");
    await a!.claim({ token: "worker-1", leaseMs: 10 });
    clock.set(10);
    const before = await snapshot(raw);
    await assert.rejects(() => a!.claim({ token: "worker-1" }), RangeError);
    assert.deepEqual(await snapshot(raw), before);
    assert.equal((await a!.claim({ token: "worker-2" }))?.fence, 2);
  });

  test("purge() deletes done events before a time with their ledger", async ({ clock, open, raw }) => {
    const [a] = await open();
    await a!.enqueue("old");
    const old = (await a!.claim())!;
    await a!.acknowledge(old);
    // Stale now: writes the old event's entries as rows of outbox_attempts.
    assert.equal(await a!.acknowledge(old), false);
    clock.set(100);
    const { eventId } = await a!.enqueue("new");
    await a!.acknowledge((await a!.claim())!);
    await a!.enqueue("pending");
    assert.equal(await a!.purge({ olderThanMs: 0 }), 1);
    // The WAL's size (in WAL mode) is wal_growth_test.ts's.
    const { wal: _, ...counts } = await a!.stats();
    assert.deepEqual(counts, {
      pending: 1,
      leased: 0,
      done: 1,
      dead: 0,
      oldestPendingAgeMs: 0,
    });
    const ledger = await raw.query(
      "SELECT event_id, kind FROM outbox_ledger ORDER BY event_id, seq",
    );
    assert.deepEqual(ledger.map((e) => [e["event_id"], e["kind"]]), [
      [eventId, "claimed"],
      [eventId, "acknowledged"],
    ]);
    const [written] = await raw.query(
      "SELECT count(*) AS n FROM outbox_attempts",
    );
    assert.equal(written?.["n"], 0);
  });

  test("stats() counts per state and the oldest pending age", async ({ clock, open }) => {
    const [a] = await open({ maxAttempts: 1 });
    await a!.enqueue(1);
    clock.set(50);
    await a!.enqueue(2);
    await a!.enqueue(3);
    await a!.enqueue(4);
    const [l1, l2, l3] = await a!.claim({ max: 3, leaseMs: 10 });
    await a!.acknowledge(l1!);
    await a!.release(l2!);
    clock.set(70);
    // The WAL's size (in WAL mode) is wal_growth_test.ts's.
    const { wal: _, ...counts } = await a!.stats();
    assert.deepEqual(counts, {
      pending: 1,
      leased: 0,
      done: 1,
      dead: 2,
      oldestPendingAgeMs: 20,
    });
    assert.ok(l3);
  });

  test("explain() tells every claim, renewal, release and acknowledgement", async ({ clock, open }) => {
    const [a] = await open();
    const { eventId } = await a!.enqueue("x");
    const l1 = await a!.claim({ leaseMs: 10 });
    clock.set(5);
    await a!.renew(l1!, 10);
    await a!.release(l1!, { error: "boom" });
    const l2 = await a!.claim({ leaseMs: 10 });
    await a!.acknowledge(l2!);
    const explanation = await a!.explain(eventId);
    assert.deepEqual(
      explanation?.history.map((
        e,
      ) => [e.kind, e.fence, e.at, e.leaseUntil, e.detail]),
      [
        ["claimed", 1, 0, 10, null],
        ["renewed", 1, 5, 15, null],
        ["released", 1, 5, null, "boom"],
        ["claimed", 2, 5, 15, null],
        ["acknowledged", 2, 5, null, null],
      ],
    );
    assert.equal(explanation?.state, "done");
    assert.equal(await a!.explain(999), null);
  });

  test("integers stay exact: epoch times plus leases beyond 2^31 ms", async ({ clock, open, raw }) => {
    const [a] = await open();
    clock.set(1_700_000_000_123);
    const { eventId } = await a!.enqueue("x");
    const lease = await a!.claim({ leaseMs: 2 ** 31 + 7 });
    assert.equal(lease?.leaseUntil, 1_700_000_000_123 + 2 ** 31 + 7);
    assert.equal(
      (await eventRow(raw, eventId))?.["lease_until"],
      1_700_000_000_123 + 2 ** 31 + 7,
    );
    await raw.exec(
      "CREATE TABLE big (v INTEGER) STRICT; INSERT INTO big VALUES (9007199254740993)",
    );
    assert.deepEqual(await raw.query("SELECT v FROM big"), [{
      v: 9007199254740993n,
    }]);
  });

  test("claim() while another connection holds the write lock throws BusyError and changes nothing", async ({ open, raw }) => {
    const [a, b] = await open({ busyTimeoutMs: 0 });
    await a!.enqueue("x");
    let release!: () => void;
    const held = new Promise<void>((resolve) => release = resolve);
    let entered!: () => void;
    const inside = new Promise<void>((resolve) => entered = resolve);
    const transaction = a!.transaction(async () => {
      entered();
      await held;
    });
    await inside;
    await assert.rejects(() => b!.claim(), BusyError);
    release();
    await transaction;
    const before = await snapshot(raw);
    assert.equal(before.events[0]?.["state"], "pending");
    assert.equal(before.attempts.length, 0);
    assert.equal((await b!.claim())?.fence, 1);
  });

  test("catching LeaseLostError inside transaction() still rolls everything back", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    await raw.exec(
      "CREATE TABLE receipts (event_id INTEGER PRIMARY KEY) STRICT",
    );
    const { eventId } = await a!.enqueue("x");
    const stale = await a!.claim({ leaseMs: 10 });
    clock.set(10);
    await b!.claim({ leaseMs: 10 });
    await assert.rejects(
      () =>
        a!.transaction(async (tx) => {
          await tx.run("INSERT INTO receipts VALUES (?)", [eventId]);
          await tx.acknowledge(stale!).catch(() => false);
        }),
      LeaseLostError,
    );
    assert.deepEqual(await raw.query("SELECT event_id FROM receipts"), []);
  });

  test("a transaction handle used after its transaction ended rejects and changes nothing", async ({ open, raw }) => {
    const [a] = await open();
    let kept: Transaction | undefined;
    await a!.transaction((tx) => {
      kept = tx;
      return Promise.resolve();
    });
    const before = await snapshot(raw);
    await assert.rejects(
      () => kept!.run("BEGIN"),
      /transaction this handle belongs to has ended/,
    );
    await assert.rejects(() => kept!.enqueue("late"), /has ended/);
    assert.deepEqual(await snapshot(raw), before);
    assert.equal((await a!.enqueue("next")).deduplicated, false);
  });

  test("a lease with the right token but another fence is stale", async ({ open }) => {
    const [a] = await open();
    await a!.enqueue("x");
    const lease = await a!.claim();
    assert.equal(await a!.renew({ ...lease!, fence: 2 }), false);
    assert.equal(await a!.acknowledge({ ...lease!, fence: 2 }), false);
    assert.equal(await a!.acknowledge(lease!), true);
  });

  test("a clock outside Date's range is refused and changes nothing", async ({ clock, open, raw }) => {
    const [a] = await open();
    const before = await snapshot(raw);
    clock.set(Number.MAX_SAFE_INTEGER - 5);
    await assert.rejects(() => a!.enqueue("x"), /within Date's range/);
    clock.set(-1);
    await assert.rejects(() => a!.claim(), RangeError);
    clock.set(8_640_000_000_000_000);
    assert.equal((await a!.enqueue("edge")).deduplicated, false);
    assert.notDeepEqual(await snapshot(raw), before);
  });

  for (const older of [1, 2, 3]) {
    test(`open() upgrades a version ${older} database in place: its history reads the same and calls after it are recorded once`, async ({ clock, open, raw }) => {
      const fixture = (v: number) =>
        Deno.readTextFile(
          new URL(`./fixtures/schema_v${v}.sql`, import.meta.url),
        );
      await raw.exec(await fixture(older));
      // Versions 2 and 3 wrote the ledger rows version 1's triggers wrote
      // (version 3 could leave a claim's entry in its row; written is valid).
      const v1 = await fixture(1);
      const triggers = v1.slice(
        v1.indexOf("CREATE TRIGGER"),
        v1.lastIndexOf("PRAGMA user_version"),
      );
      if (older >= 2) await raw.exec(triggers);
      // What an older lease.ts ran for: enqueue, claim as tokenA, takeover
      // as tokenB after the lease lapsed, tokenA's stale acknowledgement,
      // tokenB's acknowledgement; and a second event claimed as tokenC. It
      // wrote the claims' and the acknowledgement's ledger entries.
      const insert = `INSERT INTO outbox_events
      (queue, state, payload, due_at, max_attempts, created_at, updated_at)
      VALUES ('default', 'pending', ?1, ?2, 5, ?2, ?2)`;
      const claim = `UPDATE outbox_events
      SET state = 'leased', token = ?1, fence = fence + 1, attempt = attempt + 1,
        lease_until = ?2, due_at = ?2, updated_at = ?3,
        last_error = CASE state WHEN 'leased' THEN 'lease expired' ELSE last_error END
      WHERE id = ?4`;
      const acknowledge = `UPDATE outbox_events
      SET state = 'done', lease_until = NULL, updated_at = ?1, done_at = ?1
      WHERE id = ?2 AND token = ?3 AND fence = ?4 AND state = 'leased'`;
      await raw.run(insert, ['"v1"', 0]);
      await raw.run(claim, ["tokenA", 10, 0, 1]);
      await raw.run(claim, ["tokenB", 30, 20, 1]);
      await raw.run(
        `INSERT INTO outbox_attempts (event_id, fence, kind, at, token)
      SELECT id, ?2, ?3, ?4, ?5 FROM outbox_events WHERE id = ?1`,
        [1, 1, "stale_acknowledge", 21, "tokenA"],
      );
      await raw.run(acknowledge, [25, 1, "tokenB", 2]);
      await raw.run(insert, ['"open"', 25]);
      await raw.run(claim, ["tokenC", 1000, 25, 2]);
      if (older >= 2) {
        await raw.exec(
          "DROP TRIGGER outbox_events_claimed; DROP TRIGGER outbox_events_acknowledged",
        );
      }
      const before = await snapshot(raw);
      assert.equal(before.attempts.length, 6);

      clock.set(30);
      const [a] = await open();
      // The older release's user_version goes back to the application.
      const [version] = await raw.query("PRAGMA user_version");
      assert.equal(version?.["user_version"], 0);
      assert.deepEqual(
        await raw.query("SELECT version FROM outbox_schema ORDER BY version"),
        Array.from(
          { length: SCHEMA_VERSION - older + 1 },
          (_, i) => ({ version: older + i }),
        ),
      );
      assert.deepEqual(
        await raw.query(
          "SELECT name FROM sqlite_schema WHERE type = 'trigger' ORDER BY name",
        ),
        // Version 1's ledger triggers are gone; version 5's identity trigger
        // and version 9's id floor triggers are the schema's own.
        [
          { name: "outbox_events_deleted" },
          { name: "outbox_events_fill_identity" },
          { name: "outbox_events_id_reused" },
        ],
      );
      const after = await snapshot(raw);
      assert.deepEqual([
        after.events.map(({ identity: _, ...row }) => row),
        after.attempts,
      ], [
        // Version 7's columns read as an event enqueued without them.
        before.events.map((row) => ({
          ...row,
          claimed_at: null,
          priority: 0,
          concurrency_key: null,
        })),
        before.attempts,
      ]);
      // Each existing event got a UUIDv7 identity stamped with its
      // created_at, and no two the same.
      const identities = after.events.map((row) => String(row["identity"]));
      for (const [i, identity] of identities.entries()) {
        assert.match(
          identity,
          /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
        );
        assert.equal(uuidv7Time(identity), after.events[i]?.["created_at"]);
      }
      assert.equal(new Set(identities).size, identities.length);
      const columns =
        "SELECT name, type FROM pragma_table_info('outbox_events')";
      // An upgraded file keeps its AUTOINCREMENT, and so its sqlite_sequence
      // (schema version 9 dropped it from fresh files).
      const objects =
        "SELECT type, name, tbl_name FROM sqlite_schema WHERE name <> 'sqlite_sequence' ORDER BY name";
      const fresh = new DatabaseSync(":memory:");
      fresh.exec(SCHEMA_SQL);
      assert.deepEqual(
        [await raw.query(columns), await raw.query(objects)],
        [fresh.prepare(columns).all(), fresh.prepare(objects).all()].map((
          rows,
        ) => rows.map((row) => ({ ...row }))),
      );

      // The same calls through this release, on a fresh event.
      clock.set(0);
      const { eventId } = await a!.enqueue("v2", { queue: "again" });
      const leaseA = await a!.claim({
        queue: "again",
        token: "tokenA",
        leaseMs: 10,
      });
      clock.set(20);
      const leaseB = await a!.claim({
        queue: "again",
        token: "tokenB",
        leaseMs: 10,
      });
      clock.set(21);
      assert.equal(await a!.acknowledge(leaseA!), false);
      clock.set(25);
      assert.equal(await a!.acknowledge(leaseB!), true);
      const story = async (id: number) => {
        const { eventId: _, queue: __, identity: ___, ...rest } =
          (await a!.explain(id))!;
        return rest;
      };
      const upgraded = await story(1);
      assert.deepEqual(upgraded.history.map((e) => e.kind), [
        "claimed",
        "expired",
        "claimed",
        "stale_acknowledge",
        "acknowledged",
      ]);
      assert.deepEqual(upgraded, await story(eventId));

      clock.set(40);
      const leaseC: Lease = {
        eventId: 2,
        identity: identities[1]!,
        queue: "default",
        token: "tokenC",
        fence: 1,
        attempt: 1,
        maxAttempts: 5,
        leaseUntil: 1000,
        payload: "open",
        orderingKey: null,
        lastError: null,
      };
      assert.deepEqual(await a!.acknowledge([leaseC, leaseC]), [true, false]);
      const history = (await a!.explain(2))?.history;
      assert.deepEqual(history?.map((e) => [e.kind, e.fence, e.at]), [
        ["claimed", 1, 25],
        ["acknowledged", 1, 40],
        ["stale_acknowledge", 1, 40],
      ]);
    });
  }

  test("open() applies the schema once, records its version in outbox_schema and refuses a newer one", async ({ open, raw }) => {
    await open();
    await open();
    assert.deepEqual(await raw.query("SELECT version FROM outbox_schema"), [{
      version: SCHEMA_VERSION,
    }]);
    const [version] = await raw.query("PRAGMA user_version");
    assert.equal(version?.["user_version"], 0);
    await raw.run(
      "INSERT INTO outbox_schema (version, applied_at) VALUES (?, 0)",
      [SCHEMA_VERSION + 1],
    );
    await assert.rejects(() => open(), {
      name: "SchemaVersionError",
      version: SCHEMA_VERSION + 1,
      supported: SCHEMA_VERSION,
      message: new RegExp(
        `schema version ${
          SCHEMA_VERSION + 1
        }, newer than this release's ${SCHEMA_VERSION}`,
      ),
    });
    // Like any open that fails, it closed the connection it was given.
    await assert.rejects(() => raw.query("SELECT 1"));
  });

  test("open() refuses an application's own table named outbox_events, naming the columns an outbox has and it lacks", async ({ open, raw }) => {
    await raw.exec(
      "CREATE TABLE outbox_events (id INTEGER PRIMARY KEY, queue TEXT, body TEXT); INSERT INTO outbox_events (queue, body) VALUES ('q', 'keep')",
    );
    await assert.rejects(() => open(), {
      name: "Error",
      message:
        "Cannot open outbox as the database's table outbox_events is not an outbox's: it has no column 'state', 'payload', 'dedup_key', 'ordering_key', 'due_at', 'lease_until', 'token', 'fence', 'attempt', 'max_attempts', 'last_error', 'created_at', 'updated_at', 'done_at' (and no outbox_schema table); rename that table, or keep the outbox in another database",
    });
  });

  test("open() upgrades a version 4 file that kept its version in user_version: the version moves to outbox_schema and user_version goes back to 0", async ({ open, raw }) => {
    await raw.exec(
      await Deno.readTextFile(
        new URL("./fixtures/schema_v4.sql", import.meta.url),
      ),
    );
    await raw.run(
      `INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts, created_at, updated_at, identity)
       VALUES ('default', 'pending', '"legacy"', 0, 5, 0, 0, '0190a8b0-0000-7000-8000-000000000001')`,
    );
    const [a] = await open();
    assert.deepEqual(await raw.query("PRAGMA user_version"), [{
      user_version: 0,
    }]);
    assert.deepEqual(
      await raw.query("SELECT version FROM outbox_schema ORDER BY version"),
      [4, 5, 6, 7, 8, 9].map((version) => ({ version })),
    );
    const lease = await a!.claim();
    assert.equal(lease?.payload, "legacy");
    assert.equal(await a!.acknowledge(lease!), true);
  });

  test("an event another writer inserts without an identity gets a UUIDv7 at insert, the same on every claim and in explain()", async ({ open, raw }) => {
    const [a] = await open();
    await raw.run(
      `INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts, created_at, updated_at)
       VALUES ('default', 'pending', '"native"', 0, 5, 1720000000000, 0)`,
    );
    const [row] = await raw.query("SELECT identity FROM outbox_events");
    const identity = String(row?.["identity"]);
    assert.match(
      identity,
      /^019077fd-3000-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
    );
    const lease = await a!.claim();
    assert.equal(lease?.identity, identity);
    assert.equal((await a!.explain(identity))?.identity, identity);
    assert.equal(await a!.release(lease!), true);
    assert.equal((await a!.claim())?.identity, identity);
  });

  test("open() gives identities to a version 4 file's rows that other writers inserted without one", async ({ open, raw }) => {
    await raw.exec(
      await Deno.readTextFile(
        new URL("./fixtures/schema_v4.sql", import.meta.url),
      ),
    );
    await raw.exec("PRAGMA user_version = 0");
    await raw.exec(
      `CREATE TABLE outbox_schema (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT;
       INSERT INTO outbox_schema VALUES (4, 0);
       INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts, created_at, updated_at)
       VALUES ('default', 'pending', '"native"', 0, 5, 0, 0)`,
    );
    const [a] = await open();
    const lease = await a!.claim();
    assert.match(
      String(lease?.identity),
      /^00000000-0000-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
    );
    assert.deepEqual(
      await raw.query("SELECT identity FROM outbox_events"),
      [{ identity: lease?.identity }],
    );
  });

  test("open() leaves a user_version that differs from the legacy tables' version to the application", async ({ open, raw }) => {
    await raw.exec(
      await Deno.readTextFile(
        new URL("./fixtures/schema_v3.sql", import.meta.url),
      ),
    );
    // The application took user_version over after the older release ran.
    await raw.exec("PRAGMA user_version = 42");
    await open();
    assert.deepEqual(await raw.query("PRAGMA user_version"), [{
      user_version: 42,
    }]);
    assert.deepEqual(
      await raw.query("SELECT version FROM outbox_schema ORDER BY version"),
      [
        { version: 3 },
        { version: 4 },
        { version: 5 },
        { version: 6 },
        { version: 7 },
        { version: 8 },
        { version: 9 },
      ],
    );
  });
}

for (
  const [name, connect] of [
    ["sqlite-wasm file", (path: string) => openSqliteWasm(path)],
    ["node:sqlite", (path: string) => openNodeSqlite(path)],
  ] as const
) {
  Deno.test(`${name}: nextDueInMs reads without the write lock, answering while another connection holds it`, async () => {
    const dir = await Deno.makeTempDir();
    try {
      const path = `${dir}/o.db`;
      await using outbox = await Outbox.open(await connect(path), {
        now: () => 1_000,
        busyTimeoutMs: 0,
      });
      await outbox.enqueue({ n: 1 }, { delayMs: 500 });
      const other = await connect(path);
      await other.run("BEGIN IMMEDIATE");
      try {
        // Before, it began a write transaction: BusyError at once.
        assert.equal(await outbox.nextDueInMs(), 500);
        await assert.rejects(outbox.claim(), BusyError);
      } finally {
        await other.run("ROLLBACK");
        await other.close();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

Deno.test("Outbox.open() and Inbox.open() refuse a driver without the Driver methods, naming the missing one, before any call on it", async () => {
  for (
    const [driver, message] of [
      [{}, "'driver.query' must be a function: current value is undefined"],
      [
        { query() {}, run() {}, exec: 1, close() {} },
        "'driver.exec' must be a function: current value is 1",
      ],
      [
        { query() {}, run() {}, exec() {} },
        "'driver.close' must be a function: current value is undefined",
      ],
      [
        { query() {}, run() {}, exec() {}, close() {}, busyWait: true },
        "'driver.busyWait' must be a function: current value is true",
      ],
    ] as const
  ) {
    await assert.rejects(
      () => Outbox.open(driver as never),
      new TypeError(`Cannot open outbox as ${message}`),
    );
    await assert.rejects(
      () => Inbox.open(driver as never),
      new TypeError(`Cannot open inbox as ${message}`),
    );
  }
});
