/**
 * PostgreSQL's admin calls against the real server, beside claims and
 * acknowledgements on other connections.
 *
 * Lock order: cancel, redrive and purge take their events' row locks in id
 * order, as acknowledgements do, so shuffled id lists on several
 * connections never wait for each other both ways: the server detects no
 * deadlock (no connection sees SQLSTATE 40P01, which the write path would
 * run again, and which reached the caller once the reruns kept meeting
 * one until `busyTimeoutMs`).
 *
 * Purge and the ledger: a stale acknowledge, renew or release writes its
 * ledger entry only while it holds its event's row (or a key-share lock on
 * it), and purge locks its events before it deletes their entries, so no
 * entry outlives its purged event, whichever of the two comes first. On
 * SQLite, whose writers are serialized (`BEGIN IMMEDIATE`), a purge and a
 * stale call never interleave: a stale call after the purge finds no event
 * and writes nothing (the last test).
 */
import assert from "node:assert/strict";
import type { Driver, Row, RunResult, SqlValue } from "../driver.ts";
import { POSTGRES } from "../dialects/postgres.ts";
import { connectPostgres, type PostgresDriver } from "../drivers/postgres.ts";
import { type Dialect, type Lease, Outbox, PostgresError } from "../mod.ts";
import { CANCELLED } from "../admin.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { ManualClock, waitingOrSettled } from "./helpers.ts";

/**
 * A connection that counts the deadlocks the server reported to it and
 * can run `before` (on another connection) ahead of a chosen statement,
 * once per arming, or `after` once that statement ran.
 */
class Wrapped implements Driver {
  deadlocks = 0;
  #armed:
    | { sql: string; before?: () => Promise<void>; after?: () => Promise<void> }
    | undefined;

  constructor(
    readonly inner: PostgresDriver,
    readonly dialect: Dialect = inner.dialect,
  ) {}

  /** Runs `before` ahead of, or `after` after, the next `sql` sent. */
  arm(
    sql: string,
    hooks: { before?: () => Promise<void>; after?: () => Promise<void> },
  ): void {
    this.#armed = { sql, ...hooks };
  }

  async #send<T>(sql: string, call: () => Promise<T>): Promise<T> {
    const armed = this.#armed?.sql === sql ? this.#armed : undefined;
    if (armed !== undefined) this.#armed = undefined;
    await armed?.before?.();
    try {
      const result = await call();
      await armed?.after?.();
      return result;
    } catch (error) {
      if (error instanceof PostgresError && error.code === "40P01") {
        this.deadlocks++;
      }
      throw error;
    }
  }

  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]> {
    return this.#send(sql, () => this.inner.query(sql, params));
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult> {
    return this.#send(sql, () => this.inner.run(sql, params));
  }

  exec(sql: string): Promise<void> {
    return this.#send(sql, () => this.inner.exec(sql));
  }

  inTransaction(): boolean {
    return this.inner.inTransaction();
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

/** A seeded generator (mulberry32), so a failing run can be replayed. */
function random(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Up to `n` of `items`, in a random order. */
function sample<T>(next: () => number, items: readonly T[], n: number): T[] {
  const copy = [...items];
  for (let i = copy.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [copy[i], copy[j]] = [copy[j]!, copy[i]!];
  }
  return copy.slice(0, n);
}

/** The ledger rows whose event is gone (purged). */
async function orphanEntries(db: Driver): Promise<number> {
  const [row] = await db.query(
    `SELECT count(*)::integer AS n FROM outbox_attempts AS a
    WHERE NOT EXISTS (SELECT 1 FROM outbox_all WHERE id = a.event_id)`,
  );
  return Number(row?.["n"]);
}

const ROUNDS = Number(Deno.env.get("PG_ADMIN_LOCK_ROUNDS") ?? 30);
const SEED = Number(Deno.env.get("PG_ADMIN_LOCK_SEED") ?? 7);

Deno.test("postgres: cancel, redrive and purge of shuffled ids on six connections beside claims, acknowledgements and acknowledgeAndClaim never deadlock", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = new ManualClock(1_000_000);
  const dbs: Wrapped[] = [];
  const outboxes: Outbox[] = [];
  for (let i = 0; i < 6; i++) {
    const db = new Wrapped(
      await connectPostgres(server.url, { schema, listen: false }),
    );
    dbs.push(db);
    outboxes.push(
      await Outbox.open(db, { now: clock.now, busyTimeoutMs: 30_000 }),
    );
  }
  const [cancelA, cancelB, acker, ackClaimer, redriver, purger] = outboxes as [
    Outbox,
    Outbox,
    Outbox,
    Outbox,
    Outbox,
    Outbox,
  ];
  const next = random(SEED);
  try {
    const known: number[] = [];
    const cancelled = new Set<number>();
    let shared: Lease<unknown>[] = [];
    let purged = 0;
    let enqueued = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const batch = await cancelA.enqueueBatch(
        Array.from({ length: 48 }, (_, i) => ({ payload: { round, i } })),
      );
      enqueued += batch.length;
      known.push(...batch.map((result) => result.eventId));
      clock.advance(1);
      const before = shared;
      const givenToOther = sample(next, before, Infinity);
      const [a, b, acked, other, , purgedNow] = await Promise.all([
        cancelA.cancel(sample(next, known, 40)),
        cancelB.cancel(sample(next, known, 40)),
        (async () => {
          const mine = await acker.claim({ max: 16 });
          const given = sample(next, [...mine, ...before], Infinity);
          const results = await acker.acknowledge(given);
          return new Map(given.map((lease, i) => [lease, results[i]!]));
        })(),
        ackClaimer.acknowledgeAndClaim(givenToOther, { max: 16 }),
        (async () => {
          await redriver.redrive({ ids: sample(next, known, 40) });
          await redriver.redrive({ ids: sample(next, known, 40) });
        })(),
        purger.purge({ olderThanMs: 0, states: ["done"] }),
      ]);
      purged += purgedNow;
      // An event both calls cancelled was redriven in between.
      for (const id of a.filter((id) => b.includes(id))) {
        const kinds = (await cancelA.explain(id))!.history
          .map((entry) =>
            entry.kind === "dead" && entry.detail === CANCELLED
              ? "cancelled"
              : entry.kind
          ).join(" ");
        assert.match(kinds, /cancelled retried cancelled/, `event ${id}`);
      }
      for (const id of [...a, ...b]) cancelled.add(id);
      // Each lease of the previous round is acknowledged by one call.
      givenToOther.forEach((lease, i) => {
        assert.notEqual(
          acked.get(lease),
          other.acknowledged[i],
          `lease of event ${lease.eventId} acknowledged once`,
        );
      });
      shared = other.leases;
    }
    const deadlocks = dbs.reduce((sum, db) => sum + db.deadlocks, 0);
    assert.equal(deadlocks, 0, `${deadlocks} deadlocks`);
    const raw = dbs[0]!.inner;
    const [counts] = await raw.query(
      `SELECT (SELECT count(*) FROM outbox_all)::integer AS events,
        (SELECT count(*) FROM outbox_keys)::integer AS keys,
        (SELECT count(*) FROM outbox_keys AS k WHERE NOT EXISTS
          (SELECT 1 FROM outbox_all WHERE id = k.event_id))::integer AS lost`,
    );
    assert.deepEqual(counts, {
      events: enqueued - purged,
      keys: enqueued - purged,
      lost: 0,
    });
    assert.equal(await orphanEntries(raw), 0);
    // A cancelled event still there is dead by cancel or was redriven
    // since; its ledger says it was cancelled.
    for (const id of sample(next, [...cancelled], 20)) {
      const explained = await cancelA.explain(id);
      if (explained === null) continue;
      assert.ok(
        explained.history.some((entry) =>
          entry.kind === "dead" && entry.detail === CANCELLED
        ),
        `event ${id}: ${JSON.stringify(explained.history)}`,
      );
    }
  } finally {
    for (const outbox of outboxes) await outbox.close();
  }
});

/** The three stale calls that write a ledger entry and change nothing. */
const STALE_CALLS: readonly [
  string,
  (outbox: Outbox, lease: Lease<unknown>) => Promise<unknown>,
][] = [
  ["acknowledge", (outbox, lease) => outbox.acknowledge(lease)],
  ["renew", (outbox, lease) => outbox.renew(lease, 1_000)],
  ["release", (outbox, lease) => outbox.release(lease, { error: "late" })],
];

interface PurgeRace extends AsyncDisposable {
  /** The stale caller, on a wrapped connection named `staleName`. */
  readonly stale: Outbox;
  readonly staleDb: Wrapped;
  readonly staleName: string;
  /** The purger, on a wrapped connection named `purgerName`. */
  readonly purger: Outbox;
  readonly purgerDb: Wrapped;
  readonly purgerName: string;
  /** A third connection, to watch the others and read the tables. */
  readonly watcher: PostgresDriver;
  /** A done event and its first lease, which the takeover made stale. */
  readonly eventId: number;
  readonly old: Lease<unknown>;
}

/**
 * A done event whose first lease lapsed and was taken over: that lease is
 * stale, and the event is purgeable.
 */
async function purgeRace(staleDialect?: Dialect): Promise<PurgeRace> {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = new ManualClock(1_000_000);
  const open = async (name: string, dialect?: Dialect) => {
    const db = new Wrapped(
      await connectPostgres(server.url, {
        schema,
        listen: false,
        applicationName: name,
      }),
      dialect,
    );
    return [db, await Outbox.open(db, { now: clock.now })] as const;
  };
  const purgerName = `purger-${crypto.randomUUID()}`;
  const staleName = `stale-${crypto.randomUUID()}`;
  const [purgerDb, purger] = await open(purgerName);
  const [staleDb, stale] = await open(staleName, staleDialect);
  const watcher = await connectPostgres(server.url, { schema, listen: false });
  const { eventId } = await purger.enqueue({ n: 1 });
  const old = await purger.claim({ leaseMs: 1_000 });
  assert.ok(old !== null);
  clock.advance(2_000);
  const current = await purger.claim();
  assert.equal(current?.eventId, eventId);
  assert.equal(await purger.acknowledge(current!), true);
  clock.advance(1_000);
  return {
    stale,
    staleDb,
    staleName,
    purger,
    purgerDb,
    purgerName,
    watcher,
    eventId,
    old,
    async [Symbol.asyncDispose]() {
      await stale.close();
      await purger.close();
      await watcher.close();
    },
  };
}

for (const [call, stale] of STALE_CALLS) {
  Deno.test(`postgres: a stale ${call} holding its event's row when a purge starts leaves no ledger entry once the purge is done`, async () => {
    await using r = await purgeRace();
    let purge: Promise<number> | undefined;
    // Right before the stale call's ledger entry: the purge starts on the
    // other connection and runs until it waits for the event's row.
    r.staleDb.arm(POSTGRES.stale, {
      before: async () => {
        purge = r.purger.purge({ olderThanMs: 0 });
        assert.equal(
          await waitingOrSettled(r.watcher, r.purgerName, purge),
          "waiting",
        );
      },
    });
    assert.equal(await stale(r.stale, r.old), false);
    assert.equal(await purge, 1);
    assert.equal(await r.stale.explain(r.eventId), null);
    assert.equal(await orphanEntries(r.watcher), 0);
  });

  Deno.test(`postgres: a stale ${call} that does not hold its event's row waits for a purge in flight and writes no ledger entry`, async () => {
    // Without lockEvents the call holds no lock on the row before its
    // ledger writes, as when an acknowledgement moved the event to
    // outbox_done while lockEvents waited for it.
    const { lockEvents: _, ...withoutLock } = POSTGRES;
    await using r = await purgeRace(withoutLock as Dialect);
    let call: Promise<unknown> | undefined;
    // After the purge deleted the event's ledger entries, before it
    // deletes the event: the stale call runs until it ends or waits.
    r.purgerDb.arm(POSTGRES.purgeLedger, {
      after: async () => {
        call = stale(r.stale, r.old);
        await waitingOrSettled(r.watcher, r.staleName, call);
      },
    });
    assert.equal(await r.purger.purge({ olderThanMs: 0 }), 1);
    assert.equal(await call, false);
    assert.equal(await r.stale.explain(r.eventId), null);
    assert.equal(await orphanEntries(r.watcher), 0);
  });
}

Deno.test("sqlite: a stale acknowledge, renew or release after a purge writes no ledger entry (writers are serialized, so a purge never interleaves with one)", async () => {
  const clock = new ManualClock(1_000_000);
  const db = await openSqliteWasm(":memory:");
  await using outbox = await Outbox.open(db, { now: clock.now });
  for (const [call, stale] of STALE_CALLS) {
    const { eventId } = await outbox.enqueue({ call });
    const old = await outbox.claim({ leaseMs: 1_000 });
    clock.advance(2_000);
    const current = await outbox.claim();
    assert.equal(current?.eventId, eventId);
    assert.equal(await outbox.acknowledge(current!), true);
    clock.advance(1_000);
    assert.equal(await outbox.purge({ olderThanMs: 0 }), 1);
    assert.equal(await stale(outbox, old!), false);
    assert.equal(await outbox.explain(eventId), null);
  }
  const [row] = await db.query("SELECT count(*) AS n FROM outbox_attempts");
  assert.equal(row?.["n"], 0);
});
