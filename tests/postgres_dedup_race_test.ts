/**
 * Enqueues and acceptances racing a purge on PostgreSQL, the interleaving
 * forced against the real server: an insert skips a row whose dedup key or
 * identity is taken, then, before the lookup of that row runs (a statement
 * of its own, a fresh snapshot under READ COMMITTED), another connection
 * purges it and commits. The call must insert the event after all, since
 * the key is free again.
 */
import assert from "node:assert/strict";
import type { Driver, Row, RunResult, SqlValue } from "../driver.ts";
import { POSTGRES } from "../dialects/postgres.ts";
import { POSTGRES_INBOX } from "../dialects/postgres_inbox.ts";
import { connectPostgres, type PostgresDriver } from "../drivers/postgres.ts";
import {
  DedupRaceError,
  type Dialect,
  type EnqueueResult,
  Inbox,
  Outbox,
} from "../mod.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { ManualClock, untilWaiting } from "./helpers.ts";

const LOOKUPS: readonly string[] = [
  POSTGRES.existing,
  POSTGRES.existingAll,
  POSTGRES_INBOX.accepted,
];

const INSERTS: readonly string[] = [
  POSTGRES.insert,
  POSTGRES.insertAll,
  POSTGRES.insertAlike,
];

/**
 * A connection that runs `between` (on another connection) right before
 * its next lookup of the row an insert met, once per `arm()`.
 */
class PurgeBeforeLookup implements Driver {
  #between: (() => Promise<void>) | undefined;
  #always: { insert(): Promise<void>; lookup(): Promise<void> } | undefined;
  /** How many lookups ran after `between`. */
  raced = 0;
  /** How many inserts that may meet a taken key ran. */
  inserts = 0;

  constructor(
    readonly inner: PostgresDriver,
    readonly dialect: Dialect = inner.dialect,
  ) {}

  arm(between: () => Promise<void>): void {
    this.#between = between;
  }

  /** Runs `insert` before every insert and `lookup` before every lookup. */
  armAlways(insert: () => Promise<void>, lookup: () => Promise<void>): void {
    this.#always = { insert, lookup };
  }

  async query(sql: string, params?: readonly SqlValue[]): Promise<Row[]> {
    const between = this.#between;
    if (LOOKUPS.includes(sql)) {
      if (between !== undefined) {
        this.#between = undefined;
        await between();
        this.raced++;
      } else if (this.#always !== undefined) {
        await this.#always.lookup();
        this.raced++;
      }
    } else if (INSERTS.includes(sql)) {
      this.inserts++;
      await this.#always?.insert();
    }
    return await this.inner.query(sql, params);
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult> {
    return this.inner.run(sql, params);
  }

  exec(sql: string): Promise<void> {
    return this.inner.exec(sql);
  }

  inTransaction(): boolean {
    return this.inner.inTransaction();
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

/** PostgreSQL's dialect without its one-statement forms. */
const GENERAL = Object.fromEntries(
  Object.entries(POSTGRES).filter(([name]) => !name.endsWith("InOne")),
) as unknown as Dialect;

interface Race extends AsyncDisposable {
  readonly clock: ManualClock;
  /** The racing enqueuer, on the wrapped connection. */
  readonly outbox: Outbox;
  readonly db: PurgeBeforeLookup;
  /** The purger, on a connection of its own. */
  readonly purger: Outbox;
  readonly raw: PostgresDriver;
  /** The racing connection's application_name. */
  readonly name: string;
  /** Opens another connection to the same schema. */
  connect(): Promise<PostgresDriver>;
  /**
   * Enqueues `events` through the purger, acknowledges them, and arms the
   * racing connection to purge them right before its next lookup.
   */
  donePurgedBeforeLookup(
    events: readonly { dedupKey?: string; identity?: string }[],
  ): Promise<number[]>;
}

async function race(dialect?: Dialect): Promise<Race> {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = new ManualClock(1_000_000);
  const name = `race-${crypto.randomUUID()}`;
  const db = new PurgeBeforeLookup(
    await connectPostgres(server.url, {
      schema,
      listen: false,
      applicationName: name,
    }),
    dialect,
  );
  const outbox = await Outbox.open(db, { now: clock.now });
  const connect = () => connectPostgres(server.url, { schema, listen: false });
  const raw = await connect();
  const purger = await Outbox.open(raw, { now: clock.now });
  return {
    clock,
    outbox,
    db,
    purger,
    raw,
    name,
    connect,
    async donePurgedBeforeLookup(events) {
      const ids = [];
      for (const options of events) {
        ids.push((await purger.enqueue({ old: true }, options)).eventId);
        const lease = await purger.claim();
        assert.ok(lease !== null && await purger.acknowledge(lease));
      }
      clock.advance(1_000);
      db.arm(async () => {
        assert.equal(
          await purger.purge({ olderThanMs: 0 }),
          events.length,
        );
      });
      return ids;
    },
    async [Symbol.asyncDispose]() {
      await outbox.close();
      await purger.close();
    },
  };
}

/** Asserts `result` is a new pending event, readable back with `payload`. */
async function assertNew(
  outbox: Outbox,
  result: EnqueueResult,
  old: readonly number[],
  payload: unknown,
): Promise<void> {
  assert.equal(result.deduplicated, false);
  assert.ok(Number.isSafeInteger(result.eventId) && result.eventId > 0);
  assert.ok(!old.includes(result.eventId));
  const explained = await outbox.explain(result.eventId);
  assert.equal(explained?.state, "pending");
  assert.equal(explained?.identity, result.identity);
  const rows = await outbox.list({ state: "pending" });
  assert.deepEqual(
    rows.find((row) => row.id === result.eventId)?.payload,
    payload,
  );
}

for (
  const [mode, dialect] of [
    ["one statement", undefined],
    ["general transaction", GENERAL],
  ] as const
) {
  Deno.test(`postgres (${mode}): an enqueue whose dedup key's event is purged between its insert and its lookup inserts a new event`, async () => {
    await using r = await race(dialect);
    const old = await r.donePurgedBeforeLookup([{ dedupKey: "k" }]);
    const result = await r.outbox.enqueue({ n: 1 }, { dedupKey: "k" });
    assert.equal(r.db.raced, 1);
    // The insert that met the key, then the one that went in.
    assert.equal(r.db.inserts, 2);
    await assertNew(r.outbox, result, old, { n: 1 });
    assert.equal(
      await r.outbox.eventIdByDedupKey("default", "k"),
      result.eventId,
    );
  });

  Deno.test(`postgres (${mode}): an enqueue whose identity's event is purged between its insert and its lookup inserts a new event with that identity`, async () => {
    await using r = await race(dialect);
    const identity = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
    const old = await r.donePurgedBeforeLookup([{ identity }]);
    const result = await r.outbox.enqueue({ n: 1 }, { identity });
    assert.equal(r.db.raced, 1);
    assert.equal(result.identity, identity);
    await assertNew(r.outbox, result, old, { n: 1 });
  });

  Deno.test(`postgres (${mode}): an enqueueBatch whose keys' events are purged between its insert and its lookup inserts them, and dedups within the batch as before`, async () => {
    await using r = await race(dialect);
    const identity = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
    const old = await r.donePurgedBeforeLookup([
      { dedupKey: "k1" },
      { identity },
      { dedupKey: "k2" },
    ]);
    const results = await r.outbox.enqueueBatch([
      { payload: { n: 0 }, dedupKey: "k1" },
      { payload: { n: 1 } },
      { payload: { n: 2 }, identity },
      { payload: { n: 3 }, dedupKey: "k1" },
      { payload: { n: 4 }, dedupKey: "k2" },
    ]);
    assert.equal(r.db.raced, 1);
    for (const n of [0, 1, 2, 4]) {
      await assertNew(r.outbox, results[n]!, old, { n });
    }
    assert.equal(results[2]!.identity, identity);
    // The batch's second k1 meets its first, as a batch without the race.
    assert.deepEqual(results[3], { ...results[0]!, deduplicated: true });
    assert.equal(
      await r.outbox.eventIdByDedupKey("default", "k1"),
      results[0]!.eventId,
    );
    assert.equal(
      await r.outbox.eventIdByDedupKey("default", "k2"),
      results[4]!.eventId,
    );
    assert.equal((await r.outbox.stats()).pending, 4);
  });

  Deno.test(`postgres (${mode}): a group of concurrent enqueues whose dedup keys' events are purged between its insert and its lookup inserts them`, async () => {
    await using r = await race(dialect);
    const old = await r.donePurgedBeforeLookup([
      { dedupKey: "k1" },
      { dedupKey: "k2" },
    ]);
    const results = await Promise.all([
      r.outbox.enqueue({ n: 0 }, { dedupKey: "k1" }),
      r.outbox.enqueue({ n: 1 }),
      r.outbox.enqueue({ n: 2 }, { dedupKey: "k2" }),
    ]);
    assert.equal(r.db.raced, 1);
    for (const [n, result] of results.entries()) {
      await assertNew(r.outbox, result, old, { n });
    }
  });
}

Deno.test("postgres: enqueues inside a transaction whose keys' events are purged between insert and lookup insert new events", async () => {
  await using r = await race();
  const old = await r.donePurgedBeforeLookup([{ dedupKey: "k" }]);
  const one = await r.outbox.transaction((tx) =>
    tx.enqueue({ n: 1 }, { dedupKey: "k" })
  );
  assert.equal(r.db.raced, 1);
  await assertNew(r.outbox, one, old, { n: 1 });
  await using b = await race();
  const older = await b.donePurgedBeforeLookup([{ dedupKey: "b" }]);
  const batch = await b.outbox.transaction((tx) =>
    tx.enqueueBatch([
      { payload: { n: 2 }, dedupKey: "b" },
      { payload: { n: 3 }, dedupKey: "b" },
    ])
  );
  assert.equal(b.db.raced, 1);
  await assertNew(b.outbox, batch[0]!, older, { n: 2 });
  assert.deepEqual(batch[1], { ...batch[0]!, deduplicated: true });
});

Deno.test("postgres: a schedule's tick whose dedup key's event is purged between insert and lookup is enqueued", async () => {
  await using r = await race();
  await r.outbox.schedule("every-minute", "* * * * *", { n: 1 });
  const [schedule] = await r.outbox.schedules();
  r.clock.set(schedule!.nextAt!);
  const dedupKey = `schedule:every-minute:${schedule!.nextAt}`;
  const old = await r.donePurgedBeforeLookup([{ dedupKey }]);
  assert.equal(await r.outbox.runSchedules(), 1);
  assert.equal(r.db.raced, 1);
  const id = await r.outbox.eventIdByDedupKey("default", dedupKey);
  assert.ok(id !== null && !old.includes(id));
  assert.equal((await r.outbox.explain(id))?.state, "pending");
});

Deno.test("postgres: an inbox acceptance whose identity's record is purged between its insert and its lookup accepts the delivery", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = new ManualClock(1_000_000);
  const db = new PurgeBeforeLookup(
    await connectPostgres(server.url, { schema, listen: false }),
  );
  await using inbox = await Inbox.open(db, { now: clock.now });
  await using purger = await Inbox.open(
    await connectPostgres(server.url, { schema, listen: false }),
    { now: clock.now },
  );
  const identity = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
  const effect = () => Promise.resolve("ran");
  assert.equal((await purger.accept(identity, 1, effect)).status, "accepted");
  clock.advance(1_000);
  db.arm(async () => {
    assert.equal(await purger.purge({ olderThanMs: 0 }), 1);
  });
  assert.deepEqual(await inbox.accept(identity, 2, effect), {
    status: "accepted",
    value: "ran",
  });
  assert.equal(db.raced, 1);
  assert.equal((await inbox.accept(identity, 2, effect)).status, "duplicate");
});

Deno.test("postgres: an inbox acceptance whose identity's record is purged before its lookup, and recorded again by another acceptance that commits while the lookup's insert waits, fails with DedupRaceError, runs no effect and records nothing", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = new ManualClock(1_000_000);
  const name = `race-${crypto.randomUUID()}`;
  const db = new PurgeBeforeLookup(
    await connectPostgres(server.url, {
      schema,
      listen: false,
      applicationName: name,
    }),
  );
  const connect = () => connectPostgres(server.url, { schema, listen: false });
  await using inbox = await Inbox.open(db, { now: clock.now });
  await using purger = await Inbox.open(await connect(), { now: clock.now });
  await using other = await Inbox.open(await connect(), { now: clock.now });
  const watcher = await connect();
  try {
    const identity = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
    let effects = 0;
    const effect = () => Promise.resolve(effects++);
    assert.equal((await purger.accept(identity, 1, effect)).status, "accepted");
    clock.advance(1_000);
    let commit = () => {};
    const held = new Promise<void>((resolve) => commit = resolve);
    let recorded = () => {};
    const taken = new Promise<void>((resolve) => recorded = resolve);
    let again: Promise<unknown> = Promise.resolve();
    db.arm(async () => {
      assert.equal(await purger.purge({ olderThanMs: 0 }), 1);
      // Recorded, not committed, before the lookup's snapshot.
      again = other.accept(identity, 3, async () => {
        recorded();
        await held;
        return "other";
      });
      await taken;
    });
    const accepting = inbox.accept(identity, 2, effect);
    await untilWaiting(watcher, name, accepting);
    commit();
    await assert.rejects(accepting, (error: unknown) => {
      assert.ok(error instanceof DedupRaceError, String(error));
      assert.equal(error.rounds, 1);
      assert.equal(
        error.message,
        "Cannot accept as the row its dedup key or identity met was deleted before it could be read, and taken again (a purge racing the call): call again",
      );
      return true;
    });
    assert.deepEqual(await again, { status: "accepted", value: "other" });
    assert.equal(effects, 1);
    assert.equal(db.raced, 1);
    assert.deepEqual(
      await watcher.query("SELECT fence FROM inbox_accepted"),
      [{ fence: 3 }],
    );
    // Calling again finds the record the other acceptance committed.
    assert.deepEqual(await inbox.accept(identity, 2, effect), {
      status: "stale",
      acceptedFence: 3,
    });
  } finally {
    await watcher.close();
  }
});

Deno.test("postgres: an enqueue whose key's event is purged between insert and lookup in every round gives up after 5 with DedupRaceError, leaving none of its events", async () => {
  await using r = await race();
  // Before each insert another connection takes the key; before each
  // lookup its event and keys are deleted.
  r.db.armAlways(
    async () => {
      await r.purger.enqueue({ other: true }, { dedupKey: "k" });
    },
    async () => {
      await r.raw.run("DELETE FROM outbox_keys WHERE dedup_key = 'k'");
      await r.raw.run("DELETE FROM outbox_events WHERE dedup_key = 'k'");
    },
  );
  const refused = (error: unknown) => {
    assert.ok(error instanceof DedupRaceError);
    assert.equal(error.rounds, 5);
    assert.equal(
      error.message,
      "Cannot enqueue as the row its dedup key or identity met was deleted before it could be read, in each of 5 rounds (a purge racing the call): call again",
    );
    return true;
  };
  await assert.rejects(
    r.outbox.transaction((tx) => tx.enqueue({ n: 1 }, { dedupKey: "k" })),
    refused,
  );
  assert.equal(r.db.raced, 5);
  await assert.rejects(
    r.outbox.enqueueBatch([{ payload: { n: 2 }, dedupKey: "k" }]),
    refused,
  );
  assert.equal(r.db.raced, 10);
  assert.equal((await r.outbox.stats()).pending, 0);
});

Deno.test("postgres: tx.enqueueBatch() that gives up with DedupRaceError after its first round stored its other events fails the whole transaction even when fn catches the error, as a failed statement does there: transaction() rejects with it and nothing commits", async () => {
  await using r = await race();
  await r.raw.exec("CREATE TABLE app_rows (n integer)");
  r.db.armAlways(
    async () => {
      await r.purger.enqueue({ other: true }, { dedupKey: "k" });
    },
    async () => {
      await r.raw.run("DELETE FROM outbox_keys WHERE dedup_key = 'k'");
      await r.raw.run("DELETE FROM outbox_events WHERE dedup_key = 'k'");
    },
  );
  let caught: unknown;
  await assert.rejects(
    r.outbox.transaction(async (tx) => {
      await tx.run("INSERT INTO app_rows VALUES (1)");
      try {
        await tx.enqueueBatch([
          { payload: { n: 1 } },
          { payload: { n: 2 }, dedupKey: "k" },
          { payload: { n: 3 } },
        ]);
      } catch (error) {
        caught = error;
      }
      return "done";
    }),
    (error: unknown) => error === caught,
  );
  assert.ok(caught instanceof DedupRaceError, String(caught));
  assert.equal(r.db.raced, 5);
  assert.deepEqual(await r.raw.query("SELECT n FROM app_rows"), []);
  assert.equal((await r.outbox.stats()).pending, 0);
});

Deno.test("postgres: a batch whose dedup key was taken by a transaction that drew its event id after the batch's finds that event in one round", async () => {
  await using r = await race();
  const holder = await Outbox.open(await r.connect(), { now: r.clock.now });
  const watcher = await r.connect();
  try {
    // A transaction holds k0, uncommitted, so the batch waits on it.
    let hold = () => {};
    const held = new Promise<void>((resolve) => hold = resolve);
    let inserted = () => {};
    const k0Taken = new Promise<void>((resolve) => inserted = resolve);
    const first = holder.transaction(async (tx) => {
      const result = await tx.enqueue({ by: "holder" }, { dedupKey: "k0" });
      inserted();
      await held;
      return result;
    });
    await k0Taken;
    const batch = r.outbox.enqueueBatch(
      ["k0", "k1", "k2"].map((dedupKey) => ({ payload: {}, dedupKey })),
    );
    await untilWaiting(watcher, r.name, batch);
    // Meanwhile k1 is taken and committed, its id drawn after the batch's.
    const second = await r.purger.enqueue({ by: "other" }, { dedupKey: "k1" });
    hold();
    const results = await batch;
    assert.deepEqual(results.slice(0, 2), [
      { ...await first, deduplicated: true },
      { ...second, deduplicated: true },
    ]);
    assert.ok(second.eventId > results[2]!.eventId);
    await assertNew(r.outbox, results[2]!, [], {});
    // Found by the first lookup, not by a second round.
    assert.equal(r.db.inserts, 1);
  } finally {
    await watcher.close();
    await holder.close();
  }
});
