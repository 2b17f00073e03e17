/**
 * Group commit of concurrent enqueues and one-statement batches, on every
 * driver: each call keeps its own result and error, events commit in the
 * order of the calls, and a batch writes what its elements written one by
 * one would.
 */
import assert from "node:assert/strict";
import fc from "npm:fast-check@4.11.0";
import type { Driver, Row } from "../driver.ts";
import {
  BusyError,
  ConstraintError,
  type EnqueueResult,
  Outbox,
} from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { type DriverCase, DRIVERS } from "./drivers.ts";
import { driverTest, type Harness, ManualClock, snapshot } from "./helpers.ts";

/**
 * Triggers that make an enqueue fail on the engine: the payload `"refused"`
 * fails its INSERT; the payload `"doom"` inserts a row whose deferred
 * foreign key fails the COMMIT.
 */
async function installTriggers(raw: Driver, engine: string): Promise<void> {
  if (engine === "sqlite") {
    await raw.exec(`PRAGMA foreign_keys = ON;
      CREATE TABLE parent (id INTEGER PRIMARY KEY);
      CREATE TABLE child (p INTEGER REFERENCES parent (id)
        DEFERRABLE INITIALLY DEFERRED);
      CREATE TRIGGER refuse BEFORE INSERT ON outbox_events
        WHEN NEW.payload = '"refused"'
        BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END;
      CREATE TRIGGER doom AFTER INSERT ON outbox_events
        WHEN NEW.payload = '"doom"'
        BEGIN INSERT INTO child VALUES (42); END;`);
    return;
  }
  await raw.exec(`CREATE TABLE parent (id integer PRIMARY KEY);
    CREATE TABLE child (p integer REFERENCES parent (id)
      DEFERRABLE INITIALLY DEFERRED);
    CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'refused by trigger'; END $$;
    CREATE TRIGGER refuse BEFORE INSERT ON outbox_events FOR EACH ROW
      WHEN (NEW.payload = '"refused"') EXECUTE FUNCTION refuse();
    CREATE FUNCTION doom() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO child VALUES (42); RETURN NULL; END $$;
    CREATE TRIGGER doom AFTER INSERT ON outbox_events FOR EACH ROW
      WHEN (NEW.payload = '"doom"') EXECUTE FUNCTION doom();`);
}

function fulfilled<T>(settled: PromiseSettledResult<T> | undefined): T {
  assert.equal(settled?.status, "fulfilled", String(settled));
  return (settled as PromiseFulfilledResult<T>).value;
}

function rejected(settled: PromiseSettledResult<unknown> | undefined): Error {
  assert.equal(settled?.status, "rejected");
  return (settled as PromiseRejectedResult).reason;
}

async function payloads(raw: Driver): Promise<unknown[]> {
  const rows = await raw.query("SELECT payload FROM outbox_events ORDER BY id");
  return rows.map((row) => JSON.parse(String(row["payload"])));
}

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("concurrent enqueue() calls share a transaction and resolve with their own results, ids in call order", async ({ open, raw, sent }) => {
    const [a] = await open();
    await a!.enqueue("warm-up");
    const before = sent();
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, n) => a!.enqueue({ n })),
    );
    // One transaction for the twenty, not one each (four statements each).
    assert.ok(sent() - before < 20, `${sent() - before} statements`);
    const ids = results.map((r) => r.eventId);
    assert.deepEqual(ids, ids.toSorted((x, y) => x - y));
    assert.equal(new Set(ids).size, 20);
    assert.ok(results.every((r) => !r.deduplicated));
    const rows = await raw.query(
      "SELECT id, identity FROM outbox_events ORDER BY id",
    );
    assert.deepEqual(
      rows.slice(1).map((row) => [Number(row["id"]), row["identity"]]),
      results.map((r) => [r.eventId, r.identity]),
    );
    assert.deepEqual(
      await payloads(raw),
      ["warm-up", ...Array.from({ length: 20 }, (_, n) => ({ n }))],
    );
  });

  test("in one group, a call refused by a trigger, a dedup of an earlier call and bad input each get their own outcome; the rest commit in call order", async ({ open, raw }) => {
    const [a] = await open();
    await installTriggers(raw, driver.engine);
    let listened = 0;
    a!.onEnqueue(() => listened++);
    const calls = [
      a!.enqueue("first", { dedupKey: "k" }),
      a!.enqueue("refused"),
      a!.enqueue("again", { dedupKey: "k" }),
      a!.enqueue("bad", { delayMs: -1 }),
      a!.enqueue("last"),
    ];
    const settled = await Promise.allSettled(calls);
    const [first, again, last] = [0, 2, 4].map((i) => fulfilled(settled[i]));
    assert.match(rejected(settled[1]).message, /refused by trigger/);
    const bad = rejected(settled[3]);
    assert.ok(bad instanceof RangeError);
    assert.match(bad.message, /'delayMs'/);
    assert.deepEqual(again, { ...first, deduplicated: true });
    assert.ok(first!.eventId < last!.eventId);
    assert.deepEqual(await payloads(raw), ["first", "last"]);
    // One commit, one wake-up (PostgreSQL's NOTIFY may add its own).
    if (driver.engine === "sqlite") assert.equal(listened, 1);
    else assert.ok(listened >= 1);
  });

  test("a COMMIT refused by a deferred constraint one call broke commits the others, each alone, in call order; only that call fails", async ({ open, raw }) => {
    const [a] = await open();
    await installTriggers(raw, driver.engine);
    const settled = await Promise.allSettled([
      a!.enqueue("one"),
      a!.enqueue("doom"),
      a!.enqueue("three"),
    ]);
    // Before, all three rejected with the COMMIT's error.
    assert.match(rejected(settled[1]).message, /foreign key/i);
    const [one, three] = [fulfilled(settled[0]), fulfilled(settled[2])];
    assert.ok(one.eventId < three.eventId);
    assert.deepEqual(await payloads(raw), ["one", "three"]);
    const { eventId } = await a!.enqueue("after");
    assert.deepEqual(await payloads(raw), ["one", "three", "after"]);
    assert.ok(eventId > three.eventId);
  });

  if (driver.engine === "sqlite") {
    test("12 grouped enqueue() calls, one of which a trigger's RAISE(ROLLBACK) refuses, ending the shared transaction: only that call fails, the 11 others commit once each, in call order", async ({ open, raw, sent }) => {
      const [a] = await open();
      await raw.exec(`CREATE TRIGGER app_rollback BEFORE INSERT ON outbox_events
        WHEN NEW.payload = '"rolled back"'
        BEGIN SELECT RAISE(ROLLBACK, 'refused by app'); END`);
      let listened = 0;
      a!.onEnqueue(() => listened++);
      const names = Array.from(
        { length: 12 },
        (_, n) => n === 5 ? "rolled back" : `call ${n}`,
      );
      const before = sent();
      const settled = await Promise.allSettled(
        names.map((name) => a!.enqueue(name)),
      );
      // Before, all 12 rejected with call 5's error.
      const error = rejected(settled[5]);
      assert.ok(error instanceof ConstraintError, String(error));
      assert.equal(error.message, "refused by app");
      const results = settled.filter((_, n) => n !== 5).map(fulfilled);
      const ids = results.map((r) => r.eventId);
      assert.deepEqual(ids, ids.toSorted((x, y) => x - y));
      assert.deepEqual(
        await payloads(raw),
        names.filter((name) => name !== "rolled back"),
      );
      assert.deepEqual(
        (await raw.query("SELECT id FROM outbox_events ORDER BY id")).map((
          row,
        ) => Number(row["id"])),
        ids,
      );
      // The shared transaction, then one of its own per call (BEGIN, the
      // clock, the insert, COMMIT), not more.
      assert.ok(sent() - before < 12 * 6, `${sent() - before} statements`);
      assert.ok(listened >= 1);
      // The connection is left with no transaction open, and goes on.
      assert.equal(raw.inTransaction?.(), false);
      await a!.enqueue("after");
      assert.equal((await payloads(raw)).at(-1), "after");
    });
  }

  test("an enqueue made while the outbox's own transaction is open neither joins it nor overtakes the calls made before it", async ({ open, raw }) => {
    const [a] = await open();
    let entered!: () => void;
    let finish!: () => void;
    const inside = new Promise<void>((resolve) => entered = resolve);
    const finishing = new Promise<void>((resolve) => finish = resolve);
    const inTx = a!.transaction(async (tx) => {
      await tx.enqueue("t", { orderingKey: "k" });
      entered();
      await finishing;
    });
    const first = a!.enqueue("a", { orderingKey: "k" });
    await inside;
    // Before, this one counted the outbox's transaction as the
    // application's, skipped the line and committed before "a".
    const second = a!.enqueue("b", { orderingKey: "k" });
    finish();
    await inTx;
    const [x, y] = await Promise.all([first, second]);
    assert.ok(x.eventId < y.eventId, `${x.eventId} ${y.eventId}`);
    assert.deepEqual(await payloads(raw), ["t", "a", "b"]);
  });

  test("1,500 concurrent calls, more than one group holds, all commit in call order", async ({ open, raw }) => {
    const [a] = await open();
    const results = await Promise.all(
      Array.from({ length: 1_500 }, (_, n) => a!.enqueue(n)),
    );
    const ids = results.map((r) => r.eventId);
    assert.deepEqual(ids, ids.toSorted((x, y) => x - y));
    assert.deepEqual(
      await payloads(raw),
      Array.from({ length: 1_500 }, (_, n) => n),
    );
  });

  test("concurrent enqueues inside the application's transaction join it and roll back with it", async ({ open, raw }) => {
    const [a] = await open();
    await raw.exec("BEGIN");
    await a!.within(() =>
      Promise.all([a!.enqueue("x"), a!.enqueue("y", { dedupKey: "d" })])
    );
    await raw.exec("ROLLBACK");
    assert.deepEqual(await payloads(raw), []);
    await raw.exec("BEGIN");
    const [x, y] = await a!.within(() =>
      Promise.all([a!.enqueue("x"), a!.enqueue("y")])
    );
    await raw.exec("COMMIT");
    assert.ok(x.eventId < y.eventId);
    assert.deepEqual(await payloads(raw), ["x", "y"]);
  });

  test("enqueue() after close() rejects at once even while a group is open", async ({ open }) => {
    const [a] = await open();
    const first = a!.enqueue("x");
    const closing = a!.close();
    await assert.rejects(a!.enqueue("y"), /the outbox is closed/);
    assert.equal((await first).deduplicated, false);
    await closing;
  });

  test("an enqueue() called after enqueueBatch() or transaction() does not join a group queued before them: ids, dedup winners and per-key order follow the calls", async ({ open, raw }) => {
    const [a] = await open();
    const [first, batch, inTx, later, last] = await Promise.all([
      a!.enqueue("first"),
      a!.enqueueBatch([{ payload: "batch", dedupKey: "k" }]),
      a!.transaction((tx) => tx.enqueue("tx", { orderingKey: "o" })),
      a!.enqueue("later", { dedupKey: "k" }),
      a!.enqueue("last", { orderingKey: "o" }),
    ]);
    assert.equal(batch[0]!.deduplicated, false);
    assert.deepEqual(later, { ...batch[0], deduplicated: true });
    const ids = [first, batch[0], inTx, last].map((r) => r!.eventId);
    assert.deepEqual(ids, ids.toSorted((x, y) => x - y));
    assert.deepEqual(await payloads(raw), ["first", "batch", "tx", "last"]);
  });

  test("enqueueBatch() carries byte payloads of any length exactly, and refuses a batch past 128 MiB of payload before any SQL", async ({ open, sent }) => {
    const [a] = await open();
    const sizes = [0, 1, 63, 64, 65, 4096, 100_000];
    const payloads = sizes.map((n) =>
      Uint8Array.from({ length: n }, (_, i) => (i * 37 + n) & 255)
    );
    const results = await a!.enqueueBatch(
      payloads.map((payload) => ({ payload })),
    );
    const leases = await a!.claim({ max: sizes.length });
    assert.deepEqual(
      leases.map((l) => l.eventId),
      results.map((r) => r.eventId),
    );
    assert.deepEqual(leases.map((l) => l.payload), payloads);
    // Bytes travel as hex, two characters each: 70 MB of them is 140.
    const megabyte = new Uint8Array(1_000_000);
    const before = sent();
    await assert.rejects(
      a!.enqueueBatch(
        Array.from({ length: 70 }, () => ({ payload: megabyte })),
      ),
      (error) =>
        error instanceof RangeError &&
        /'events' must hold at most 134217728 bytes of payload/.test(
          error.message,
        ),
    );
    assert.equal(sent(), before);
    assert.equal((await a!.stats()).pending, 0);
  });

  test("enqueueBatch() inserts in one statement what enqueue() would, and joins the caller's transaction", async ({ open, raw, sent }) => {
    const [a] = await open();
    const before = sent();
    const results = await a!.enqueueBatch([
      { payload: { n: 1 }, dedupKey: "k", orderingKey: "o" },
      { payload: new Uint8Array([0, 1, 255]), delayMs: 50, maxAttempts: 2 },
      { payload: null, queue: "other" },
      { payload: "dup", dedupKey: "k" },
    ]);
    // BEGIN, the expiry check, the INSERT, the dedup lookup, COMMIT.
    assert.ok(sent() - before <= 5, `${sent() - before} statements`);
    assert.deepEqual(results.map((r) => r.deduplicated), [
      false,
      false,
      false,
      true,
    ]);
    assert.deepEqual(results[3], { ...results[0], deduplicated: true });
    const lease = await a!.claim({ max: 5 });
    assert.deepEqual(lease.map((l) => [l.payload, l.orderingKey]), [
      [{ n: 1 }, "o"],
    ]);
    const other = await a!.claim({ queue: "other" });
    assert.equal(other?.payload, null);
    assert.equal(other?.eventId, results[2]!.eventId);

    await assert.rejects(
      a!.transaction(async (tx) => {
        await tx.enqueueBatch([{ payload: "rolled back" }]);
        throw new Error("abort");
      }),
      /abort/,
    );
    const inTx = await a!.transaction(async (tx) => {
      await tx.run(
        driver.engine === "sqlite"
          ? "CREATE TABLE orders (id INTEGER PRIMARY KEY)"
          : "CREATE TABLE orders (id integer PRIMARY KEY)",
      );
      return await tx.enqueueBatch([{ payload: "a" }, { payload: "b" }]);
    });
    assert.equal(inTx[1]!.eventId, inTx[0]!.eventId + 1);
    const [{ n }] = await raw.query(
      "SELECT count(*) AS n FROM outbox_events WHERE payload IN ('\"a\"', '\"b\"', '\"rolled back\"')",
    ) as [Row];
    assert.equal(Number(n), 2);
  });

  test("enqueueBatch() refuses bad input naming the element and field, before any SQL", async ({ open, sent }) => {
    const [a] = await open();
    const before = sent();
    const cases: [unknown, RegExp][] = [
      [null, /'events' must be an array/],
      [[{ payload: 1 }, null], /'events\[1\]' must be an object/],
      [
        [{ payload: 1 }, { payload: 2 }, { payload: 3 }, {
          payload: 4,
          dedupKey: "",
        }],
        /'events\[3\]\.dedupKey' must be a string/,
      ],
      [
        [{ payload: 1, dedupkey: "k" }],
        /'events\[0\]\.dedupkey' is not an option: did you mean 'dedupKey'\?/,
      ],
      [[{}], /'events\[0\]\.payload' must be JSON data/],
      [
        [{ payload: 1, identity: "X" }],
        /'events\[0\]\.identity' must be a UUID/,
      ],
      [[{ payload: 1, delayMs: 1.5 }], /'events\[0\]\.delayMs'/],
      [new Array(10_001).fill({ payload: 1 }), /'events\.length' must be/],
    ];
    for (const [events, message] of cases) {
      await assert.rejects(a!.enqueueBatch(events as never), message);
    }
    assert.equal(sent(), before);
    assert.deepEqual(await a!.enqueueBatch([]), []);
  });

  test("enqueueBatch() is all or none: an element refused in SQL writes none", async ({ open, raw }) => {
    const [a] = await open();
    await installTriggers(raw, driver.engine);
    await assert.rejects(
      a!.enqueueBatch([{ payload: "ok" }, { payload: "refused" }]),
      /refused by trigger/,
    );
    assert.deepEqual(await payloads(raw), []);
  });

  differentialTest(driver);
}

/** One event of the differential test, from small pools so keys collide. */
const eventArbitrary = fc.record({
  payload: fc.oneof(
    fc.jsonValue({ maxDepth: 2 }),
    fc.uint8Array({ maxLength: 4 }),
  ),
  options: fc.record({
    queue: fc.constantFrom("q1", "q2"),
    dedupKey: fc.constantFrom("d1", "d2", "d3"),
    orderingKey: fc.constantFrom("o1", "o2"),
    identity: fc.constantFrom(0, 1, 2),
    delayMs: fc.nat({ max: 1_000 }),
    maxAttempts: fc.integer({ min: 1, max: 9 }),
  }, { requiredKeys: [] }),
});

/**
 * An event with JSON and at most an identity: a batch of these alone takes
 * the statement for events that differ only in payload and identity.
 */
const alikeArbitrary = fc.record({
  payload: fc.jsonValue({ maxDepth: 2 }),
  options: fc.record({ identity: fc.constantFrom(0, 1, 2) }, {
    requiredKeys: [],
  }),
});

type Generated = typeof eventArbitrary extends fc.Arbitrary<infer T> ? T
  : never;

/** A table's rows with minted identities made comparable across databases. */
function comparable(rows: Row[], pool: readonly string[]): Row[] {
  return rows.map((row) => {
    const copy = { ...row };
    delete copy["xmin"];
    if (!pool.includes(String(copy["identity"]))) copy["identity"] = "minted";
    return copy;
  });
}

function differentialTest(driver: DriverCase): void {
  Deno.test(`${driver.name}: property: enqueueBatch(xs) returns and stores what enqueue(x) for each x in turn does`, async () => {
    const clock = new ManualClock(1_700_000_000_000);
    const batchDb = await driver.open(1);
    const singleDb = await driver.open(1);
    try {
      const batch = await Outbox.open(batchDb.drivers[0]!, { now: clock.now });
      const single = await Outbox.open(singleDb.drivers[0]!, {
        now: clock.now,
      });
      let run = 0;
      await fc.assert(
        fc.asyncProperty(
          fc.array(eventArbitrary, { maxLength: 6 }),
          fc.oneof(
            fc.array(eventArbitrary, { maxLength: 12 }),
            fc.array(alikeArbitrary, { maxLength: 12 }),
          ),
          async (existing, events: Generated[]) => {
            // A fresh identity pool per run, so earlier runs' rows are only
            // met through dedup keys.
            run++;
            const pool = [0, 1, 2].map((i) =>
              `00000000-0000-4000-8000-${String(run * 3 + i).padStart(12, "0")}`
            );
            const toCall = ({ payload, options }: Generated) => {
              const { identity, ...rest } = options;
              return {
                payload,
                options: identity === undefined
                  ? rest
                  : { ...rest, identity: pool[identity]! },
              };
            };
            clock.advance(1);
            for (const event of existing.map(toCall)) {
              await batch.enqueue(event.payload, event.options);
              await single.enqueue(event.payload, event.options);
            }
            clock.advance(1);
            const calls = events.map(toCall);
            const fromBatch = await batch.enqueueBatch(
              calls.map(({ payload, options }) => ({ payload, ...options })),
            );
            const fromSingle: EnqueueResult[] = [];
            for (const { payload, options } of calls) {
              fromSingle.push(await single.enqueue(payload, options));
            }
            const shape = (results: EnqueueResult[], stored: Row[]) =>
              results.map((r) => {
                const row = stored.find((s) => Number(s["id"]) === r.eventId);
                assert.equal(row?.["identity"], r.identity);
                return [
                  r.eventId,
                  r.deduplicated,
                  pool.includes(r.identity) ? r.identity : "minted",
                ];
              });
            const batchState = await snapshot(batchDb.drivers[0]!);
            const singleState = await snapshot(singleDb.drivers[0]!);
            assert.deepEqual(
              shape(fromBatch, batchState.events),
              shape(fromSingle, singleState.events),
            );
            assert.deepEqual(
              comparable(batchState.events, pool),
              comparable(singleState.events, pool),
            );
            assert.deepEqual(batchState.attempts, singleState.attempts);
          },
        ),
        { numRuns: driver.engine === "postgres" ? 30 : 60 },
      );
      await batch.close();
      await single.close();
    } finally {
      await batchDb.close();
      await singleDb.close();
    }
  });
}

Deno.test("wasm file: a group waiting past busyTimeoutMs for another connection's write lock rejects every call with BusyError and writes none", async () => {
  const dir = await Deno.makeTempDir({ prefix: "group_busy_" });
  try {
    const path = `${dir}/outbox.db`;
    await using outbox = await Outbox.open(await openSqliteWasm(path), {
      busyTimeoutMs: 50,
    });
    await using other = await openSqliteWasm(path);
    await other.exec("BEGIN IMMEDIATE");
    const settled = await Promise.allSettled(
      [1, 2, 3].map((n) => outbox.enqueue(n)),
    );
    await other.exec("ROLLBACK");
    assert.ok(
      settled.every((s) =>
        s.status === "rejected" && s.reason instanceof BusyError
      ),
    );
    assert.deepEqual(
      await other.query("SELECT count(*) AS n FROM outbox_events"),
      [{ n: 0 }],
    );
    await outbox.enqueue(4);
    assert.deepEqual(
      await other.query("SELECT payload FROM outbox_events"),
      [{ payload: "4" }],
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
