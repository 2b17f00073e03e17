/**
 * An enqueue that the application's own schema refuses, on every driver:
 * its unique index on `outbox_events` fails the call with the engine's
 * error naming that index (not a dedup race to call again), a dedup hit
 * stays a dedup hit, and on SQLite a trigger's `RAISE(IGNORE)` fails the
 * call with a `ConstraintError` naming the table, as on PostgreSQL a
 * `BEFORE INSERT` trigger that returns NULL does; the inbox's record alike.
 */
import assert from "node:assert/strict";
import {
  ConstraintError,
  deliveryHeaders,
  type Driver,
  Inbox,
  PostgresError,
  TransactionEndedError,
  uuidv7,
} from "../mod.ts";
import { DRIVERS } from "./drivers.ts";
import { driverTest, type Harness, ManualClock } from "./helpers.ts";

/** Every event's ordering key and payload, in id order. */
async function stored(raw: Driver): Promise<[unknown, unknown][]> {
  const rows = await raw.query(
    "SELECT ordering_key, payload FROM outbox_events ORDER BY id",
  );
  return rows.map((
    row,
  ) => [row["ordering_key"], JSON.parse(String(row["payload"]))]);
}

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);
  // The engine's refusal, naming the application's index or its column.
  const refusedByAppIndex = (error: unknown) => {
    assert.ok(
      error instanceof
        (driver.engine === "sqlite" ? ConstraintError : PostgresError),
      String(error),
    );
    // SQLite names the index's column, PostgreSQL the index.
    assert.match(
      (error as Error).message,
      driver.engine === "sqlite"
        ? /^UNIQUE constraint failed: outbox_events\.ordering_key$/
        : /"app_k"/,
    );
    return true;
  };

  test("enqueue(), enqueueBatch(), tx.enqueue() and a grouped enqueue() refused by the application's unique index on outbox_events fail with the engine's error naming it; nothing of theirs is stored", async ({ open, raw }) => {
    const [a] = await open();
    await raw.exec("CREATE UNIQUE INDEX app_k ON outbox_events (ordering_key)");
    await a!.enqueue("first", { orderingKey: "o" });
    await assert.rejects(
      a!.enqueue("lone", { orderingKey: "o" }),
      refusedByAppIndex,
    );
    await assert.rejects(
      a!.enqueueBatch([
        { payload: "batch 1", orderingKey: "p" },
        { payload: "batch 2", orderingKey: "o" },
      ]),
      refusedByAppIndex,
    );
    await assert.rejects(
      a!.transaction((tx) => tx.enqueue("tx", { orderingKey: "o" })),
      refusedByAppIndex,
    );
    const settled = await Promise.allSettled([
      a!.enqueue("group 1", { orderingKey: "q" }),
      a!.enqueue("group 2", { orderingKey: "o" }),
      a!.enqueue("group 3", { orderingKey: "r" }),
    ]);
    assert.equal(settled[0]!.status, "fulfilled");
    assert.equal(settled[1]!.status, "rejected");
    refusedByAppIndex((settled[1] as PromiseRejectedResult).reason);
    assert.equal(settled[2]!.status, "fulfilled");
    assert.deepEqual(await stored(raw), [
      ["o", "first"],
      ["q", "group 1"],
      ["r", "group 3"],
    ]);
  });

  test("an enqueue whose dedup key is taken is deduplicated even when the application's unique index would refuse it too", async ({ open, raw }) => {
    const [a] = await open();
    await raw.exec("CREATE UNIQUE INDEX app_k ON outbox_events (ordering_key)");
    const first = await a!.enqueue("first", {
      dedupKey: "k",
      orderingKey: "o",
    });
    assert.deepEqual(
      await a!.enqueue("again", { dedupKey: "k", orderingKey: "o" }),
      { ...first, deduplicated: true },
    );
    assert.deepEqual(
      await a!.enqueueBatch([
        { payload: "batch", dedupKey: "k", orderingKey: "o" },
      ]),
      [{ ...first, deduplicated: true }],
    );
    assert.deepEqual(await stored(raw), [["o", "first"]]);
  });

  // A trigger that skips the insert of an event whose payload is "skip":
  // SQLite's RAISE(IGNORE), a PostgreSQL function returning NULL.
  const skipTrigger = driver.engine === "sqlite"
    ? [`CREATE TRIGGER app_skip BEFORE INSERT ON outbox_events
      WHEN NEW.payload = '"skip"' BEGIN SELECT RAISE(IGNORE); END`]
    : [
      `CREATE FUNCTION app_skip() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.payload = '"skip"' THEN RETURN NULL; END IF;
          RETURN NEW;
        END $$`,
      `CREATE TRIGGER app_skip BEFORE INSERT ON outbox_events
        FOR EACH ROW EXECUTE FUNCTION app_skip()`,
    ];
  const how = driver.engine === "sqlite"
    ? "RAISE(IGNORE)"
    : "its function returned NULL";

  test(`enqueue(), enqueueBatch() (minted identities, given identities, the general statement), tx.enqueue() and a grouped enqueue() whose insert a trigger skips (${how}) fail with a ConstraintError naming outbox_events, store nothing of theirs and leave no key behind; the group's other calls commit`, async ({ open, raw }) => {
    const [a] = await open();
    for (const statement of skipTrigger) await raw.exec(statement);
    const ignored = (error: unknown) => {
      assert.ok(error instanceof ConstraintError, String(error));
      assert.equal(
        error.message,
        `Cannot enqueue as a trigger on outbox_events skipped its insert (${how}), and no row holds its dedup key or identity: it was not stored, and calling again skips it again`,
      );
      // SQLITE_CONSTRAINT_TRIGGER, as a RAISE(ABORT) would give.
      assert.equal(error.code, 1811);
      return true;
    };
    const [i0, i1, i2, i3] = [uuidv7(0), uuidv7(1), uuidv7(2), uuidv7(3)];
    await assert.rejects(a!.enqueue("skip"), ignored);
    await assert.rejects(
      a!.enqueue("skip", { dedupKey: "k", identity: i0 }),
      ignored,
    );
    await assert.rejects(
      a!.enqueueBatch([{ payload: "kept" }, { payload: "skip" }]),
      ignored,
    );
    await assert.rejects(
      a!.enqueueBatch([
        { payload: "kept", identity: i2 },
        { payload: "skip", identity: i1 },
      ]),
      ignored,
    );
    await assert.rejects(
      a!.enqueueBatch([
        { payload: "kept", dedupKey: "d" },
        { payload: "skip", dedupKey: "e" },
      ]),
      ignored,
    );
    await assert.rejects(
      a!.transaction((tx) => tx.enqueue("skip", { identity: i3 })),
      ignored,
    );
    const settled = await Promise.allSettled([
      a!.enqueue("one"),
      a!.enqueue("skip"),
      a!.enqueue("three"),
    ]);
    assert.equal(settled[0]!.status, "fulfilled");
    assert.equal(settled[1]!.status, "rejected");
    ignored((settled[1] as PromiseRejectedResult).reason);
    assert.equal(settled[2]!.status, "fulfilled");
    assert.deepEqual(await stored(raw), [[null, "one"], [null, "three"]]);
    // The skipped calls' keys went with them: the same keys now insert.
    const again = await a!.enqueueBatch([
      { payload: "k", dedupKey: "k", identity: i0 },
      { payload: "i1", identity: i1 },
      { payload: "i2", identity: i2 },
      { payload: "d", dedupKey: "d" },
      { payload: "e", dedupKey: "e" },
      { payload: "i3", identity: i3 },
    ]);
    assert.deepEqual(again.map((result) => result.deduplicated), [
      false,
      false,
      false,
      false,
      false,
      false,
    ]);
    assert.deepEqual((await stored(raw)).map(([, payload]) => payload), [
      "one",
      "three",
      "k",
      "i1",
      "i2",
      "d",
      "e",
      "i3",
    ]);
  });

  test(
    `tx.enqueueBatch() that a trigger's skip (${how}) of one event fails (on SQLite after its statement stored the others) is all or none when fn catches its error: ${
      driver.engine === "sqlite"
        ? "the transaction commits fn's other writes and none of the batch"
        : "the statement failed the transaction, which commits nothing"
    }; within() likewise`,
    async ({ open, raw }) => {
      const [a] = await open();
      for (const statement of skipTrigger) await raw.exec(statement);
      await raw.exec("CREATE TABLE app_rows (n integer)");
      const ignored = (error: unknown) =>
        error instanceof ConstraintError &&
        error.message.startsWith(
          "Cannot enqueue as a trigger on outbox_events",
        );
      let caught: unknown;
      const committed = a!.transaction(async (tx) => {
        await tx.run("INSERT INTO app_rows VALUES (1)");
        try {
          await tx.enqueueBatch([
            { payload: "kept 1" },
            { payload: "skip" },
            { payload: "kept 2" },
          ]);
        } catch (error) {
          caught = error;
        }
        if (driver.engine === "sqlite") {
          await tx.run("INSERT INTO app_rows VALUES (2)");
          await tx.enqueue("after");
        }
        return "done";
      });
      if (driver.engine === "sqlite") {
        assert.equal(await committed, "done");
      } else {
        await assert.rejects(committed, TransactionEndedError);
      }
      assert.ok(ignored(caught), String(caught));
      assert.deepEqual(
        await stored(raw),
        driver.engine === "sqlite" ? [[null, "after"]] : [],
      );
      assert.deepEqual(
        (await raw.query("SELECT n FROM app_rows ORDER BY n")).map((row) =>
          row["n"]
        ),
        driver.engine === "sqlite" ? [1, 2] : [],
      );
      // Joined to the application's transaction: the batch alone is undone.
      await raw.exec("BEGIN");
      await raw.run("INSERT INTO app_rows VALUES (3)");
      await assert.rejects(
        a!.within(() =>
          a!.enqueueBatch([{ payload: "kept 3" }, { payload: "skip" }])
        ),
        ignored,
      );
      await raw.run("INSERT INTO app_rows VALUES (4)");
      await raw.exec("COMMIT");
      assert.deepEqual(
        (await stored(raw)).map(([, payload]) => payload),
        driver.engine === "sqlite" ? ["after"] : [],
      );
      assert.deepEqual(
        (await raw.query("SELECT n FROM app_rows ORDER BY n")).map((row) =>
          row["n"]
        ),
        driver.engine === "sqlite" ? [1, 2, 3, 4] : [3, 4],
      );
    },
  );

  // A trigger that skips every record of the inbox's.
  const skipRecord = driver.engine === "sqlite"
    ? [`CREATE TRIGGER app_skip_record BEFORE INSERT ON inbox_accepted
      BEGIN SELECT RAISE(IGNORE); END`]
    : [
      `CREATE FUNCTION app_skip_record() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN RETURN NULL; END $$`,
      `CREATE TRIGGER app_skip_record BEFORE INSERT ON inbox_accepted
        FOR EACH ROW EXECUTE FUNCTION app_skip_record()`,
    ];

  Deno.test(`${driver.name}: inbox.accept() and inbox.acceptRequest() whose record a trigger skips (${how}) fail with a ConstraintError naming inbox_accepted, run no effect and record nothing`, async () => {
    const connections = await driver.open();
    try {
      const raw = connections.drivers[0]!;
      await using inbox = await Inbox.open(raw, { now: new ManualClock().now });
      for (const statement of skipRecord) await raw.exec(statement);
      const skipped = (error: unknown) => {
        assert.ok(error instanceof ConstraintError, String(error));
        assert.equal(
          error.message,
          `Cannot accept as a trigger on inbox_accepted skipped its insert (${how}), and no row holds its identity: it was not stored, and calling again skips it again`,
        );
        assert.equal(error.code, 1811);
        return true;
      };
      let effects = 0;
      await assert.rejects(
        inbox.accept(uuidv7(0), 1, () => Promise.resolve(effects++)),
        skipped,
      );
      const request = new Request("http://x/", {
        method: "POST",
        headers: deliveryHeaders({ identity: uuidv7(1), fence: 1 }),
      });
      await assert.rejects(
        inbox.acceptRequest(request, () => {
          effects++;
          return Promise.resolve();
        }),
        skipped,
      );
      // Inside the application's transaction (within): the call alone is
      // undone, and the application's transaction goes on.
      await raw.exec("CREATE TABLE app_rows (n integer)");
      await raw.exec("BEGIN");
      await raw.run("INSERT INTO app_rows VALUES (1)");
      await assert.rejects(
        inbox.within(() =>
          inbox.accept(uuidv7(2), 1, () => Promise.resolve(effects++))
        ),
        skipped,
      );
      await raw.run("INSERT INTO app_rows VALUES (2)");
      await raw.exec("COMMIT");
      assert.equal(effects, 0);
      assert.deepEqual(
        await raw.query("SELECT count(*) AS n FROM inbox_accepted"),
        [{ n: 0 }],
      );
      assert.deepEqual(
        (await raw.query("SELECT n FROM app_rows ORDER BY n")).map((row) =>
          row["n"]
        ),
        [1, 2],
      );
    } finally {
      await connections.close();
    }
  });
}
