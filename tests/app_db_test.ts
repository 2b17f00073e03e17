/**
 * The outbox inside the application's own database: beside its migrations
 * (user_version), on its own connection handle, inside its transactions;
 * and misuse that must fail at once.
 */
import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import {
  Inbox,
  type Lease,
  LeaseLostError,
  Outbox,
  processEvents,
  SCHEMA_VERSION,
} from "../mod.ts";
import { nodeSqliteDriver, openNodeSqlite } from "../drivers/node_sqlite.ts";
import {
  loadSqlite3,
  openSqliteWasm,
  sqliteWasmDriver,
} from "../deno/sqlite_wasm.ts";
import { openWorkerOutbox } from "../browser/outbox.ts";
import type { Driver, SqlValue } from "../driver.ts";
import { driverTest, type Harness, ManualClock, snapshot } from "./helpers.ts";
import { SQLITE_DRIVERS } from "./drivers.ts";

/** Rejects when `promise` has not settled within `ms`: a hang fails the test. */
function settlesWithin<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`still pending after ${ms} ms`)),
        ms,
      );
    }),
  ]).finally(() => clearTimeout(timer));
}

/** Options with a misspelt key, typed as whatever the call takes. */
function typo(options: Record<string, unknown>): never {
  return options as never;
}

async function userVersion(driver: Driver): Promise<number> {
  const [row] = await driver.query("PRAGMA user_version");
  return Number(row?.["user_version"]);
}

for (const driver of SQLITE_DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("an application whose migrations use user_version opens an outbox in the same file afterwards, and its user_version stays", async ({ open, raw }) => {
    // The application's migrations, version 5, before any outbox.
    await raw.exec(
      "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER); PRAGMA user_version = 5",
    );
    const [a] = await open();
    const lease = (await a!.enqueue("e1")) && await a!.claim();
    assert.equal(await a!.acknowledge(lease!), true);
    assert.equal(await userVersion(raw), 5);
    assert.deepEqual(await raw.query("SELECT version FROM outbox_schema"), [{
      version: SCHEMA_VERSION,
    }]);
    assert.deepEqual(await raw.query("SELECT count(*) AS n FROM orders"), [{
      n: 0,
    }]);
  });

  test("an application that migrates with user_version after the outbox was created keeps its value across later opens and calls", async ({ open, raw }) => {
    await open();
    assert.equal(await userVersion(raw), 0);
    // The application's first migration runs after the outbox's.
    await raw.exec(
      "CREATE TABLE orders (id INTEGER PRIMARY KEY); PRAGMA user_version = 1",
    );
    const [a] = await open();
    await a!.enqueue("e1");
    const lease = await a!.claim();
    await a!.release(lease!, { delayMs: 0 });
    await a!.transaction((tx) => tx.enqueue("e2"));
    await a!.stats();
    assert.equal(await userVersion(raw), 1);
    await raw.exec("PRAGMA user_version = 2");
    await open();
    assert.equal(await userVersion(raw), 2);
  });

  test("enqueue() inside the application's transaction on the shared connection commits with the application's COMMIT", async ({ clock, open, raw }) => {
    const [a] = await open();
    await raw.exec(
      "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)",
    );
    clock.set(100);
    await raw.run("BEGIN IMMEDIATE");
    await raw.run("INSERT INTO orders (total) VALUES (?)", [7]);
    const { eventId } = await a!.within(() => a!.enqueue({ order: 1 }));
    // Still inside: the outbox issued no COMMIT of its own.
    assert.equal(raw.inTransaction?.(), true);
    await raw.run("COMMIT");
    assert.deepEqual(await raw.query("SELECT total FROM orders"), [{
      total: 7,
    }]);
    assert.deepEqual((await a!.claim())?.eventId, eventId);
  });

  test("enqueue() inside the application's transaction is rolled back by the application's ROLLBACK, with its business row", async ({ open, raw }) => {
    const [a] = await open();
    await raw.exec(
      "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)",
    );
    const before = await snapshot(raw);
    await raw.run("BEGIN");
    await raw.run("INSERT INTO orders (total) VALUES (?)", [7]);
    await a!.within(() => a!.enqueue({ order: 1 }));
    await raw.run("ROLLBACK");
    assert.deepEqual(await raw.query("SELECT * FROM orders"), []);
    const after = await snapshot(raw);
    assert.deepEqual([after.events, after.attempts], [
      before.events,
      before.attempts,
    ]);
    assert.equal(await a!.claim(), null);
  });

  test("an enqueue() or acknowledge() called before the application's BEGIN waits for its transaction instead of joining it, so its ROLLBACK cannot take back a call that resolved", async ({ open, raw }) => {
    const [a] = await open();
    await a!.enqueue("to acknowledge");
    const lease = await a!.claim();
    // The calls start while the outbox's mutex is busy, then the
    // application begins: they must not run inside its transaction.
    const busy = a!.enqueue("first");
    const enqueued = a!.enqueue("before BEGIN");
    const batch = a!.enqueueBatch([{ payload: "batch before BEGIN" }]);
    const acknowledged = a!.acknowledge(lease!);
    await raw.run("BEGIN");
    await raw.exec("CREATE TABLE scratch (x INTEGER)");
    await new Promise((resolve) => setTimeout(resolve, 20));
    await raw.run("ROLLBACK");
    await busy;
    const { eventId } = await settlesWithin(enqueued, 5_000);
    const [fromBatch] = await settlesWithin(batch, 5_000);
    assert.equal(await settlesWithin(acknowledged, 5_000), true);
    const rows = await raw.query(
      "SELECT id, state FROM outbox_events WHERE id IN (?, ?, ?) ORDER BY id",
      [lease!.eventId, eventId, fromBatch!.eventId],
    );
    assert.deepEqual(
      rows,
      [
        { id: lease!.eventId, state: "done" },
        { id: eventId, state: "pending" },
        { id: fromBatch!.eventId, state: "pending" },
      ].toSorted((x, y) => x.id - y.id),
    );
  });

  test("acknowledge() of a stale lease inside the application's transaction throws LeaseLostError and writes nothing, so the application rolls back", async ({ clock, open, raw }) => {
    const [a, b] = await open();
    await raw.exec("CREATE TABLE effects (id INTEGER PRIMARY KEY)");
    await a!.enqueue("e1");
    const stale = await a!.claim({ leaseMs: 10 });
    clock.advance(10);
    const current = await b!.claim({ leaseMs: 10 });
    const before = await snapshot(raw);
    await raw.run("BEGIN IMMEDIATE");
    await raw.run("INSERT INTO effects DEFAULT VALUES");
    await assert.rejects(
      () => a!.within(() => a!.acknowledge(stale!)),
      LeaseLostError,
    );
    // The outbox's part is undone; the application's is its own to undo.
    assert.equal(raw.inTransaction?.(), true);
    await raw.run("ROLLBACK");
    assert.deepEqual(await raw.query("SELECT * FROM effects"), []);
    const after = await snapshot(raw);
    assert.deepEqual([after.events, after.attempts], [
      before.events,
      before.attempts,
    ]);
    // Outside a transaction a stale lease is a value, as before.
    assert.equal(await a!.acknowledge(stale!), false);
    assert.equal(await b!.acknowledge(current!), true);
  });

  test("acknowledge() of a current lease inside the application's transaction commits with the application's effect", async ({ open, raw }) => {
    const [a] = await open();
    await raw.exec("CREATE TABLE effects (id INTEGER PRIMARY KEY)");
    await a!.enqueue("e1");
    const lease = await a!.claim();
    await raw.run("BEGIN IMMEDIATE");
    await raw.run("INSERT INTO effects DEFAULT VALUES");
    assert.equal(await a!.within(() => a!.acknowledge(lease!)), true);
    await raw.run("COMMIT");
    assert.deepEqual(await raw.query("SELECT count(*) AS n FROM effects"), [{
      n: 1,
    }]);
    assert.equal((await a!.stats()).done, 1);
  });

  test("claim() waits for the application's transaction to end instead of running inside it, so the application's ROLLBACK cannot undo a claim", async ({ open, raw }) => {
    const [a] = await open();
    await a!.enqueue("e1");
    await raw.run("BEGIN IMMEDIATE");
    await raw.exec("CREATE TABLE scratch (x INTEGER)");
    let claimed: Lease | null | undefined;
    const claim = a!.claim().then((lease) => claimed = lease);
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(claimed, undefined);
    await raw.run("ROLLBACK");
    const lease = await settlesWithin(claim, 5_000);
    assert.equal(lease?.fence, 1);
    const [row] = await raw.query(
      "SELECT state, token FROM outbox_events WHERE id = ?",
      [lease!.eventId],
    );
    assert.deepEqual(row, { state: "leased", token: lease!.token });
  });

  test("claim() throws BusyError when the application's transaction stays open past busyTimeoutMs, and the transaction is left as it was", async ({ open, raw }) => {
    const [a] = await open({ busyTimeoutMs: 30 });
    await a!.enqueue("e1");
    await raw.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
    await raw.run("BEGIN IMMEDIATE");
    await raw.run("INSERT INTO orders DEFAULT VALUES");
    await assert.rejects(() => a!.claim(), {
      name: "BusyError",
      message:
        /Cannot claim as the application's transaction on this connection stayed open for 30 ms: only enqueue\(\), enqueueBatch\(\) and acknowledge\(\) of one lease made inside outbox.within\(\) join it/,
    });
    await assert.rejects(() =>
      a!.renew({
        eventId: 1,
        identity: "0190a8b0-0000-7000-8000-000000000001",
        queue: "default",
        token: "t",
        fence: 1,
        attempt: 1,
        maxAttempts: 5,
        leaseUntil: 1,
        payload: null,
        orderingKey: null,
        lastError: null,
      }), { name: "BusyError" });
    assert.equal(raw.inTransaction?.(), true);
    await raw.run("COMMIT");
    assert.deepEqual(await raw.query("SELECT count(*) AS n FROM orders"), [{
      n: 1,
    }]);
    assert.equal((await a!.claim())?.fence, 1);
  });

  test("a processor sharing the connection never claims inside the application's transaction: the application's ROLLBACK leaves its lease in place", async ({ open, raw }) => {
    const [a] = await open();
    await a!.enqueue("e1");
    await raw.run("BEGIN IMMEDIATE");
    const handled = Promise.withResolvers<Lease>();
    const processor = processEvents(a!, (lease) => {
      handled.resolve(lease);
    }, { pollMinMs: 1, pollMaxMs: 5 });
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(processor.counters.claimed, 0);
    await raw.run("ROLLBACK");
    const lease = await settlesWithin(handled.promise, 5_000);
    await processor.stop();
    assert.equal(lease.fence, 1);
    assert.deepEqual(
      await raw.query("SELECT state FROM outbox_events WHERE id = ?", [
        lease.eventId,
      ]),
      [{ state: "done" }],
    );
  });

  test("an outbox call made inside transaction(fn) on the same outbox throws at once, and later calls and processor.stop() go on", async ({ open }) => {
    const [a] = await open();
    const processor = processEvents(a!, () => {}, { pollMinMs: 1 });
    const attempt = a!.transaction(async (tx) => {
      await tx.enqueue("inside");
      await a!.enqueue("nested");
    });
    await assert.rejects(() => settlesWithin(attempt, 2_000), {
      name: "Error",
      message:
        /Cannot enqueue on the outbox inside its own transaction\(fn\): use the transaction's handle/,
    });
    await settlesWithin(processor.stop(), 2_000);
    assert.equal((await settlesWithin(a!.stats(), 2_000)).pending, 0);
    await a!.enqueue("after");
    assert.equal((await a!.stats()).pending, 1);
  });

  test("every kind of call on an outbox of the same connection inside transaction(fn) throws at once", async ({ open }) => {
    const [a] = await open();
    const [sibling] = await open();
    await a!.transaction(async () => {
      for (
        const call of <(() => Promise<unknown>)[]> [
          () => a!.claim(),
          () => a!.stats(),
          () => a!.transaction(() => Promise.resolve()),
          () => sibling!.enqueue("x"),
          () => a!.close(),
        ]
      ) {
        await assert.rejects(
          () => settlesWithin(call(), 2_000),
          /inside its own transaction\(fn\)/,
        );
      }
    });
    assert.equal(a!.closed, false);
    assert.equal((await a!.stats()).pending, 0);
  });

  test("tx.run() and tx.query() refuse transaction-control statements before running them", async ({ open, raw, sent }) => {
    const [a] = await open();
    await raw.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
    const statements: [string, string][] = [
      ["COMMIT", "COMMIT"],
      ["  commit;", "COMMIT"],
      ["END", "END"],
      ["end transaction", "END"],
      ["ROLLBACK", "ROLLBACK"],
      ["-- undo\nrollback to x", "ROLLBACK"],
      ["/* hidden */ BEGIN", "BEGIN"],
      ["begin immediate", "BEGIN"],
      ["\n\tSavePoint s", "SAVEPOINT"],
      ["RELEASE s", "RELEASE"],
      [";release savepoint s", "RELEASE"],
      // PostgreSQL's spellings, refused on every engine.
      ["abort", "ABORT"],
      ["/* x */ START TRANSACTION", "START"],
      ["prepare -- two-phase\n transaction 'x'", "PREPARE TRANSACTION"],
      ["/* /* */ SELECT */ ROLLBACK", "ROLLBACK"],
      // SQLite skips a byte order mark as space.
      ["\uFEFFCOMMIT", "COMMIT"],
    ];
    await assert.rejects(
      () =>
        a!.transaction(async (tx) => {
          await tx.run("INSERT INTO orders DEFAULT VALUES");
          await tx.enqueue("e1");
          for (const [sql, keyword] of statements) {
            for (const method of ["run", "query"] as const) {
              const before = sent();
              await assert.rejects(() => tx[method](sql), {
                name: "RangeError",
                message: new RegExp(
                  `^Cannot ${method} as 'sql' must not control the transaction: found ${keyword};`,
                ),
              });
              assert.equal(sent(), before, sql);
            }
          }
          throw new Error("roll back");
        }),
      /roll back/,
    );
    assert.deepEqual(await raw.query("SELECT * FROM orders"), []);
    assert.equal((await a!.stats()).pending, 0);
    // A column or table named like a keyword is not refused.
    await a!.transaction((tx) => tx.query("SELECT 1 AS commit_count"));
  });

  test("a typo'd option name throws a TypeError naming it and the nearest known one, before any SQL", async ({ open, raw, sent }) => {
    const [a] = await open();
    await a!.enqueue("e1");
    const lease = (await a!.claim())!;
    const before = await snapshot(raw);
    const calls: [() => unknown, string, string | undefined][] = [
      [() => a!.enqueue("x", typo({ delay: 5 })), "delay", "delayMs"],
      [() => a!.claim(typo({ leaseMS: 5 })), "leaseMS", "leaseMs"],
      [() => a!.claim(typo({ max: 2, quue: "q" })), "quue", "queue"],
      [() => a!.release(lease, typo({ delay: 5 })), "delay", "delayMs"],
      [() => a!.deadLetters(typo({ limt: 1 })), "limt", "limit"],
      [() => a!.purge(typo({ olderThan: 1 })), "olderThan", "olderThanMs"],
      [() => a!.stats(typo({ qeueu: "q" })), "qeueu", "queue"],
      [() => a!.list(typo({ state: "done", limitt: 1 })), "limitt", "limit"],
      [() => a!.redrive(typo({ id: [1] })), "id", "ids"],
      [() => a!.maintain(typo({ vaccum: true })), "vaccum", "vacuum"],
      [() => a!.nextDueInMs(typo({ queu: "q" })), "queu", "queue"],
      [
        () => a!.release(lease, typo({ deadletter: true })),
        "deadletter",
        "deadLetter",
      ],
      [() => Outbox.open(raw, typo({ leaseMS: 5 })), "leaseMS", "leaseMs"],
      [() => Outbox.open(raw, typo({ colour: "red" })), "colour", undefined],
      [
        () => processEvents(a!, () => {}, typo({ concurrancy: 2 })),
        "concurrancy",
        "concurrency",
      ],
    ];
    for (const [call, key, nearest] of calls) {
      const sentBefore = sent();
      await assert.rejects(
        async () => await call(),
        (error: Error) => {
          assert.equal(error.constructor, TypeError);
          assert.match(error.message, new RegExp(`'${key}' is not an option`));
          if (nearest === undefined) {
            assert.doesNotMatch(error.message, /did you mean/);
          } else {
            assert.match(
              error.message,
              new RegExp(`did you mean '${nearest}'`),
            );
          }
          return true;
        },
      );
      assert.equal(sent(), sentBefore, key);
    }
    // Inside a transaction the check comes before the enqueue's SQL.
    await assert.rejects(
      () => a!.transaction((tx) => tx.enqueue("x", typo({ dedupkey: "k" }))),
      {
        name: "TypeError",
        message: /'dedupkey' is not an option: did you mean 'dedupKey'\?/,
      },
    );
    assert.deepEqual(await snapshot(raw), before);
  });
}

Deno.test("the openers and driver factories refuse a typo'd option name, naming the nearest known one", async () => {
  const db = new DatabaseSync(":memory:");
  const sqlite3 = await loadSqlite3();
  const wasm = new sqlite3.oo1.DB(":memory:");
  const calls: [() => unknown, string, string][] = [
    [
      () => openNodeSqlite(":memory:", typo({ journalmode: "wal" })),
      "journalmode",
      "journalMode",
    ],
    [
      () => openSqliteWasm(":memory:", typo({ busyTimeout: 5 })),
      "busyTimeout",
      "busyTimeoutMs",
    ],
    [
      () => nodeSqliteDriver(db, typo({ closeDb: true })),
      "closeDb",
      "closeDatabase",
    ],
    [
      () => sqliteWasmDriver(wasm, typo({ sqlite: sqlite3 })),
      "sqlite",
      "sqlite3",
    ],
    [
      () => openWorkerOutbox("mail", typo({ openTimeout: 5 })),
      "openTimeout",
      "openTimeoutMs",
    ],
  ];
  try {
    for (const [call, key, nearest] of calls) {
      await assert.rejects(async () => await call(), {
        name: "TypeError",
        message: new RegExp(
          `'${key}' is not an option: did you mean '${nearest}'\\?`,
        ),
      });
    }
  } finally {
    db.close();
    wasm.close();
  }
});

Deno.test("nodeSqliteDriver(db): an outbox over the application's DatabaseSync joins its transaction and leaves the handle open when closed", async () => {
  const db = new DatabaseSync(":memory:");
  const clock = new ManualClock(1_000);
  const outbox = await Outbox.open(nodeSqliteDriver(db), { now: clock.now });
  db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)");
  db.exec("BEGIN IMMEDIATE");
  db.prepare("INSERT INTO orders (total) VALUES (?)").run(1);
  await outbox.within(() => outbox.enqueue("kept"));
  db.exec("COMMIT");
  db.exec("BEGIN");
  db.prepare("INSERT INTO orders (total) VALUES (?)").run(2);
  await outbox.within(() => outbox.enqueue("dropped"));
  db.exec("ROLLBACK");
  // No transaction open: enqueue commits on its own, as before.
  await outbox.enqueue("alone");
  assert.deepEqual(
    db.prepare("SELECT total FROM orders").all().map((r) => ({ ...r })),
    [{ total: 1 }],
  );
  const leases = await outbox.claim({ max: 5 });
  assert.deepEqual(leases.map((l) => l.payload), ["kept", "alone"]);
  await outbox.close();
  assert.equal(db.isOpen, true);
  assert.equal(db.isTransaction, false);
  db.close();

  const owned = new DatabaseSync(":memory:");
  await (await Outbox.open(nodeSqliteDriver(owned, { closeDatabase: true })))
    .close();
  assert.equal(owned.isOpen, false);
});

Deno.test("sqliteWasmDriver(db): an outbox over the application's oo1.DB joins its transaction and leaves the handle open when closed", async () => {
  const sqlite3 = await loadSqlite3();
  const db = new sqlite3.oo1.DB(":memory:");
  const clock = new ManualClock(1_000);
  const outbox = await Outbox.open(await sqliteWasmDriver(db), {
    now: clock.now,
  });
  db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)");
  await outbox.enqueue("e1");
  const lease = (await outbox.claim())!;
  db.exec("BEGIN IMMEDIATE");
  db.exec("INSERT INTO orders (total) VALUES (1)");
  await outbox.within(() => outbox.enqueue("kept"));
  assert.equal(await outbox.within(() => outbox.acknowledge(lease)), true);
  db.exec("COMMIT");
  db.exec("BEGIN");
  db.exec("INSERT INTO orders (total) VALUES (2)");
  await outbox.within(() => outbox.enqueue("dropped"));
  db.exec("ROLLBACK");
  assert.deepEqual(db.selectValues("SELECT total FROM orders"), [1]);
  assert.deepEqual(await outbox.stats(), {
    pending: 1,
    leased: 0,
    done: 1,
    dead: 0,
    oldestPendingAgeMs: 0,
  });
  await outbox.close();
  assert.equal(db.isOpen(), true);
  db.close();

  const other = new sqlite3.oo1.DB(":memory:");
  await (await Outbox.open(
    await sqliteWasmDriver(other, { closeDatabase: true }),
  )).close();
  assert.equal(other.isOpen(), false);
  await assert.rejects(() => sqliteWasmDriver(other), {
    name: "TypeError",
    message: /'db' must be an open oo1.DB/,
  });
});

Deno.test("node:sqlite: a call retrying BEGIN IMMEDIATE on a busy database waits for an application transaction begun on its connection meanwhile, instead of failing inside it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/app.db`;
    const shared = await openNodeSqlite(path);
    const outbox = await Outbox.open(shared, { busyTimeoutMs: 5_000 });
    const { eventId } = await outbox.enqueue("x");
    // Another connection holds the write lock, so the claim retries BEGIN.
    const other = await openNodeSqlite(path);
    await other.run("BEGIN IMMEDIATE");
    const claim = outbox.claim().then((lease) => lease, (error) => error);
    await new Promise((resolve) => setTimeout(resolve, 30));
    // The application's transaction on the shared connection, meanwhile.
    await shared.run("BEGIN");
    await other.run("COMMIT");
    await new Promise((resolve) => setTimeout(resolve, 30));
    await shared.run("ROLLBACK");
    // Before, the retried BEGIN IMMEDIATE failed: "cannot start a
    // transaction within a transaction".
    const lease = await claim;
    assert.equal(lease?.eventId, eventId, String(lease));
    await outbox.close();
    await other.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * node:sqlite's driver over `db`, telling how often the outbox found the
 * application's transaction open and how often its BEGIN met a busy file.
 */
function watched(db: DatabaseSync) {
  const inner = nodeSqliteDriver(db);
  const seen = { applicationTransaction: 0, busyBegins: 0 };
  const driver: Driver = new Proxy(inner, {
    get(target, key) {
      if (key === "inTransaction") {
        return () => {
          const open = target.inTransaction!();
          if (open) seen.applicationTransaction++;
          return open;
        };
      }
      if (key === "run") {
        return async (sql: string, params?: readonly SqlValue[]) => {
          try {
            return await target.run(sql, params);
          } catch (error) {
            if (sql.startsWith("BEGIN")) seen.busyBegins++;
            throw error;
          }
        };
      }
      const value = Reflect.get(target, key);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return { driver, seen };
}

async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 1));
}

for (const later of ["enqueueBatch", "transaction"] as const) {
  Deno.test(`node:sqlite: an enqueue that gives the connection up to the application's transaction keeps its place: a later ${later} commits after it`, async () => {
    const dir = await Deno.makeTempDir();
    try {
      const path = `${dir}/app.db`;
      const db = new DatabaseSync(path);
      const { driver, seen } = watched(db);
      await using outbox = await Outbox.open(driver);
      const other = new DatabaseSync(path);
      other.exec("BEGIN IMMEDIATE");
      const first = outbox.enqueue({ n: 1 }, { orderingKey: "k" });
      await until(() => seen.busyBegins > 0);
      other.exec("COMMIT");
      other.close();
      // The application's transaction, before the enqueue's next try.
      db.exec("BEGIN IMMEDIATE");
      await until(() => seen.applicationTransaction >= 2);
      db.exec("COMMIT");
      const second = later === "enqueueBatch"
        ? outbox.enqueueBatch([{ payload: { n: 2 }, orderingKey: "k" }])
          .then(([result]) => result!)
        : outbox.transaction((tx) =>
          tx.enqueue({ n: 2 }, { orderingKey: "k" })
        );
      const [a, b] = await Promise.all([first, second]);
      // Before, the later call took the free connection first: 2 and 1.
      assert.deepEqual([a.eventId, b.eventId], [1, 2]);
      assert.deepEqual((await outbox.claim())?.payload, { n: 1 });
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

Deno.test("node:sqlite: close() waits for the calls made before it that wait for the application's transaction", async () => {
  const db = new DatabaseSync(":memory:");
  const { driver, seen } = watched(db);
  const outbox = await Outbox.open(driver);
  const { eventId } = await outbox.enqueue({ n: 1 });
  db.exec("BEGIN IMMEDIATE");
  const claim = outbox.claim();
  const enqueued = outbox.transaction((tx) => tx.enqueue({ n: 2 }));
  const closing = outbox.close();
  await until(() => seen.applicationTransaction >= 2);
  db.exec("COMMIT");
  // Before, both rejected with the driver's "database is closed".
  assert.equal((await claim)?.eventId, eventId);
  assert.equal((await enqueued).eventId, eventId + 1);
  await closing;
  assert.deepEqual(
    db.prepare("SELECT id, state FROM outbox_events ORDER BY id").all()
      .map((row) => [row["id"], row["state"]]),
    [[eventId, "leased"], [eventId + 1, "pending"]],
  );
  db.close();
});

Deno.test("node:sqlite: an enqueue made inside the application's transaction while an inbox on the connection retries its BEGIN joins that transaction", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/app.db`;
    const db = new DatabaseSync(path);
    const { driver, seen } = watched(db);
    await using outbox = await Outbox.open(driver, { busyTimeoutMs: 2_000 });
    const inbox = await Inbox.open(driver, { busyTimeoutMs: 2_000 });
    const other = new DatabaseSync(path);
    other.exec("BEGIN IMMEDIATE");
    const accepting = inbox.accept(
      "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe",
      1,
      () => Promise.resolve(),
    ).then(() => "accepted", (error: Error) => error.message);
    await until(() => seen.busyBegins > 0);
    db.exec("BEGIN");
    other.exec("COMMIT");
    other.close();
    // Before, the inbox's retries counted the application's transaction as
    // the inbox's own: the enqueue did not join it, waited for it, and
    // failed with BusyError after busyTimeoutMs.
    const { eventId } = await outbox.within(() => outbox.enqueue("x"));
    db.exec("ROLLBACK");
    // The inbox waits for the application's transaction, as the outbox
    // does, then accepts in its own.
    assert.equal(await accepting, "accepted");
    assert.equal(await outbox.explain(eventId), null);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
