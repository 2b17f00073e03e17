/**
 * PostgreSQL's one-statement claim and acknowledgement: the round trips
 * they cost, counted at the driver (node-postgres sends one statement and
 * waits for its answer before the next, so each `query`, `run` or `exec` is
 * one round trip; the counts are pinned so that they cannot creep back up),
 * and that they write what the core's general transactions write.
 */
import assert from "node:assert/strict";
import type { Driver, Row, RunResult, SqlValue } from "../driver.ts";
import { POSTGRES } from "../dialects/postgres.ts";
import { connectPostgres, type PostgresDriver } from "../drivers/postgres.ts";
import {
  type Dialect,
  type EnqueueResult,
  type Lease,
  Outbox,
} from "../mod.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { ManualClock, untilWaiting } from "./helpers.ts";

/** A connection that records every statement it sends. */
class CountingDriver implements Driver {
  readonly sent: string[] = [];
  constructor(
    readonly inner: PostgresDriver,
    readonly dialect: Dialect = inner.dialect,
  ) {}

  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]> {
    this.sent.push(sql);
    return this.inner.query(sql, params);
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult> {
    this.sent.push(sql);
    return this.inner.run(sql, params);
  }

  exec(sql: string): Promise<void> {
    this.sent.push(sql);
    return this.inner.exec(sql);
  }

  inTransaction(): boolean {
    return this.inner.inTransaction();
  }

  close(): Promise<void> {
    return this.inner.close();
  }

  /** The statements sent while `fn` ran. */
  async during(fn: () => Promise<unknown>): Promise<string[]> {
    const start = this.sent.length;
    await fn();
    return this.sent.slice(start);
  }
}

/** PostgreSQL's dialect without its one-statement forms. */
const GENERAL = Object.fromEntries(
  Object.entries(POSTGRES).filter(([name]) => !name.endsWith("InOne")),
) as unknown as Dialect;

async function open(
  options: { now?: () => number; maxAttempts?: number } = {},
  dialect?: Dialect,
): Promise<{ outbox: Outbox; db: CountingDriver }> {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const db = new CountingDriver(
    await connectPostgres(server.url, { schema, listen: false }),
    dialect,
  );
  const outbox = await Outbox.open(db, options);
  return { outbox, db };
}

for (
  const [clock, options] of [
    ["the server's clock", {}],
    ["an injected clock", { now: () => 1_000_000 }],
  ] as const
) {
  Deno.test(`postgres round trips (${clock}): a single claim is one, its acknowledgement one`, async () => {
    const { outbox, db } = await open(options);
    try {
      await outbox.enqueue({ n: 1 });
      let lease;
      const claim = await db.during(async () => lease = await outbox.claim());
      const ack = await db.during(() => outbox.acknowledge(lease!));
      assert.deepEqual([claim.length, ack.length], [1, 1]);
      assert.equal((await outbox.stats()).done, 1);
    } finally {
      await outbox.close();
    }
  });

  Deno.test(`postgres round trips (${clock}): a batch of 256 is one to claim and one to acknowledge`, async () => {
    const { outbox, db } = await open(options);
    try {
      await outbox.transaction(async (tx) => {
        for (let i = 0; i < 256; i++) await tx.enqueue({ i });
      });
      let leases: Lease[] = [];
      const claim = await db.during(async () =>
        leases = await outbox.claim({ max: 256 })
      );
      assert.equal(leases.length, 256);
      let acked: boolean[] = [];
      const ack = await db.during(async () =>
        acked = await outbox.acknowledge(leases)
      );
      assert.ok(acked.every((ok) => ok));
      assert.deepEqual([claim.length, ack.length], [1, 1]);
      assert.equal((await outbox.stats()).done, 256);
    } finally {
      await outbox.close();
    }
  });

  Deno.test(`postgres round trips (${clock}): an enqueue is one statement, and so is a group of concurrent ones`, async () => {
    const { outbox, db } = await open(options);
    try {
      const lone = await db.during(() => outbox.enqueue({ n: 0 }));
      let results: EnqueueResult[] = [];
      const group = await db.during(async () =>
        results = await Promise.all(
          Array.from({ length: 20 }, (_, n) => outbox.enqueue({ n: n + 1 })),
        )
      );
      assert.deepEqual([lone.length, group.length], [1, 1]);
      assert.deepEqual(
        results.map((r) => [r.eventId, r.deduplicated]),
        Array.from({ length: 20 }, (_, n) => [n + 2, false]),
      );
      assert.deepEqual(
        (await db.inner.query(
          "SELECT payload FROM outbox_events ORDER BY id",
        )).map((row) => JSON.parse(String(row["payload"]))),
        Array.from({ length: 21 }, (_, n) => ({ n })),
      );
    } finally {
      await outbox.close();
    }
  });

  Deno.test(`postgres round trips (${clock}): a batch enqueue is one statement (two when some met earlier events' keys) and answers and writes what the general transaction does`, async () => {
    const identity = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
    const run = async (dialect?: Dialect) => {
      const { outbox, db } = await open(options, dialect);
      try {
        await outbox.enqueueBatch([
          { payload: { n: 0 }, dedupKey: "k0" },
          { payload: { n: 1 }, identity },
        ]);
        let minted: EnqueueResult[] = [];
        const alike = await db.during(async () =>
          minted = await outbox.enqueueBatch(
            Array.from({ length: 256 }, (_, i) => ({ payload: { i } })),
          )
        );
        // Minted identities' keys go in without the conflict check, and
        // still find their events.
        const last = minted[255]!;
        assert.equal(
          (await outbox.explain(last.identity))?.eventId,
          last.eventId,
        );
        let mixed: EnqueueResult[] = [];
        const met = await db.during(async () =>
          mixed = await outbox.enqueueBatch([
            { payload: { n: 2 }, dedupKey: "k0" },
            { payload: { n: 3 }, dedupKey: "k1", delayMs: 5_000 },
            { payload: { n: 4 }, identity },
            { payload: { n: 5 }, dedupKey: "k1" },
            { payload: new Uint8Array([1, 2]), queue: "b", maxAttempts: 2 },
          ])
        );
        const rows = await db.inner.query(
          `SELECT id, queue, payload, payload_bytes, dedup_key, max_attempts,
              due_at - created_at AS delay, created_at = updated_at AS same
            FROM outbox_events ORDER BY id`,
        );
        const [keys] = await db.inner.query(
          `SELECT count(*)::integer AS n,
              count(*) FILTER (WHERE k.identity = e.identity)::integer AS same
            FROM outbox_keys AS k JOIN outbox_events AS e ON e.id = k.event_id`,
        );
        return {
          keys,
          sent: [alike.length, met.length],
          answered: mixed.map((r) => [r.eventId, r.deduplicated]),
          rows,
        };
      } finally {
        await outbox.close();
      }
    };
    const general = await run(GENERAL);
    const inOne = await run();
    assert.deepEqual(inOne.sent, [1, 2]);
    // BEGIN, the server's clock when it is the lease clock, the insert and
    // COMMIT; the lookup of the events met.
    const begun = clock === "an injected clock" ? 3 : 4;
    assert.deepEqual(general.sent, [begun, begun + 1]);
    // Each element takes an id, also one skipped.
    assert.deepEqual(inOne.answered, [
      [1, true],
      [260, false],
      [2, true],
      [260, true],
      [263, false],
    ]);
    assert.deepEqual(inOne.answered, general.answered);
    assert.equal(inOne.rows.length, 260);
    assert.deepEqual(inOne.keys, { n: 260, same: 260 });
    assert.deepEqual(inOne.rows, general.rows);
  });

  Deno.test(`postgres round trips (${clock}): acknowledging a batch of 256 and claiming the next is one`, async () => {
    const { outbox, db } = await open(options);
    try {
      await outbox.transaction(async (tx) => {
        for (let i = 0; i < 512; i++) await tx.enqueue({ i });
      });
      const first = await outbox.claim({ max: 256 });
      let next: Awaited<ReturnType<Outbox["acknowledgeAndClaim"]>>;
      const fused = await db.during(async () =>
        next = await outbox.acknowledgeAndClaim(first, { max: 256 })
      );
      assert.equal(fused.length, 1);
      assert.ok(next!.acknowledged.every((ok) => ok));
      assert.deepEqual(
        next!.leases.map((lease) => lease.payload),
        Array.from({ length: 256 }, (_, i) => ({ i: 256 + i })),
      );
      const stats = await outbox.stats();
      assert.deepEqual([stats.done, stats.leased], [256, 256]);
    } finally {
      await outbox.close();
    }
  });

  Deno.test(`postgres round trips (${clock}): under a per-key limit and a rate limit, a claim, a batch claim and acknowledgeAndClaim are one each`, async () => {
    const { outbox, db } = await open(options);
    try {
      await outbox.setLimits("default", { perKey: 2, perSecond: 1_000 });
      await outbox.enqueueBatch(
        Array.from({ length: 12 }, (_, i) => ({
          payload: { i },
          concurrencyKey: `k${i % 4}`,
        })),
      );
      let lease: Lease | null = null;
      const claim = await db.during(async () => lease = await outbox.claim());
      let batch: Lease[] = [];
      const claimBatch = await db.during(async () =>
        batch = await outbox.claim({ max: 4 })
      );
      let next: Awaited<ReturnType<Outbox["acknowledgeAndClaim"]>>;
      const fused = await db.during(async () =>
        next = await outbox.acknowledgeAndClaim([lease!], { max: 4 })
      );
      assert.deepEqual([claim.length, claimBatch.length, fused.length], [
        1,
        1,
        1,
      ]);
      // k0's second lease beside the first in the batch; the acknowledged
      // one no longer counts, so k0 takes another.
      assert.deepEqual(
        [lease!, ...batch, ...next!.leases].map((l) => l.payload),
        [0, 1, 2, 3, 4, 5, 6, 7, 8].map((i) => ({ i })),
      );
      assert.deepEqual(next!.acknowledged, [true]);
      // Every key holds two leases: the next claim takes nothing.
      assert.equal(await outbox.claim(), null);
    } finally {
      await outbox.close();
    }
  });

  Deno.test(`postgres round trips (${clock}): the next due time is one read, outside a transaction`, async () => {
    const { outbox, db } = await open(options);
    try {
      let dueInMs: number | null = 0;
      const none = await db.during(async () =>
        dueInMs = await outbox.nextDueInMs()
      );
      assert.deepEqual([none, dueInMs], [[POSTGRES.nextDue], null]);
      await outbox.enqueue({ n: 1 }, { delayMs: 60_000 });
      const one = await db.during(async () =>
        dueInMs = await outbox.nextDueInMs()
      );
      assert.deepEqual(one, [POSTGRES.nextDue]);
      // The server's clock has moved on since the enqueue read it.
      assert.ok(dueInMs! <= 60_000 && dueInMs! > 50_000, String(dueInMs));
    } finally {
      await outbox.close();
    }
  });
}

/**
 * A run through takeovers, lapsed last attempts, ordering keys, stale and
 * repeated leases in batches: what each call answered, every event row and
 * its ledger, tokens masked (they are random).
 */
async function scenario(dialect?: Dialect): Promise<unknown> {
  let t = 1_000_000;
  const { outbox, db } = await open({ now: () => t, maxAttempts: 2 }, dialect);
  const seen: unknown[] = [];
  const leaseOf = (lease: Lease) => [lease.eventId, lease.fence, lease.attempt];
  try {
    for (const orderingKey of [undefined, undefined, "k", "k", undefined]) {
      await outbox.enqueue(
        { orderingKey: orderingKey ?? null },
        orderingKey ? { orderingKey } : {},
      );
    }
    const first = await outbox.claim({ max: 2, leaseMs: 100 });
    seen.push(first.map(leaseOf));
    t += 200;
    const second = await outbox.claim({ max: 3, leaseMs: 100 });
    seen.push(second.map(leaseOf));
    // Event 1's first lease was taken over: stale amid current ones.
    seen.push(
      await outbox.acknowledge([first[0]!, first[1]!, ...second.slice(0, 2)]),
    );
    t += 200;
    // Event 1's second lease has lapsed on its last attempt.
    const third = await outbox.claim({ max: 3, leaseMs: 100 });
    seen.push(third.map(leaseOf));
    seen.push(await outbox.acknowledge(first[1]!));
    seen.push(await outbox.acknowledge([third[0]!, third[0]!]));
    seen.push(await outbox.acknowledge(third.slice(1)));
    seen.push(await outbox.acknowledge(second[2]!));
    // Acknowledge-then-claim: an ordering key's next event once its first
    // is acknowledged in the same call; a stale lease amid current ones; a
    // lapsed lease (a candidate of its own claim) acknowledged.
    for (const orderingKey of ["j", "j", undefined, "j", undefined]) {
      await outbox.enqueue(
        { orderingKey: orderingKey ?? null },
        orderingKey ? { orderingKey } : {},
      );
    }
    const fourth = await outbox.claim({ max: 2, leaseMs: 100 });
    const fifth = await outbox.acknowledgeAndClaim(fourth, {
      max: 1,
      leaseMs: 100,
    });
    seen.push(
      fourth.map(leaseOf),
      fifth.acknowledged,
      fifth.leases.map(leaseOf),
    );
    const sixth = await outbox.acknowledgeAndClaim(
      [fourth[0]!, ...fifth.leases],
      { max: 2, leaseMs: 100 },
    );
    seen.push(sixth.acknowledged, sixth.leases.map(leaseOf));
    t += 200;
    const seventh = await outbox.acknowledgeAndClaim(sixth.leases, { max: 2 });
    seen.push(seventh.acknowledged, seventh.leases.map(leaseOf));
    const rows = await db.query(
      "SELECT id, state, fence, attempt, due_at, lease_until, last_error, done_at, claimed_at FROM outbox_events ORDER BY id",
    );
    const ledger = await db.query(
      "SELECT event_id, fence, kind, at, token IS NULL AS no_token, lease_until, detail FROM outbox_ledger ORDER BY seq",
    );
    return { seen, rows, ledger };
  } finally {
    await outbox.close();
  }
}

Deno.test("postgres: the one-statement claim and acknowledgements answer and write what the general transactions do", async () => {
  const general = await scenario(GENERAL);
  assert.deepEqual(await scenario(), general);
  // The run exercises what it is meant to.
  const { ledger } = general as { ledger: Row[] };
  const kinds = new Set(ledger.map((row) => row["kind"]));
  for (const kind of ["expired", "dead", "stale_acknowledge", "claimed"]) {
    assert.ok(kinds.has(kind), kind);
  }
});

/**
 * A run under flow control: priorities, concurrency keys at their per-key
 * limit within a batch and across calls, an ordering key, the token bucket
 * running dry and refilling by the injected clock, a pause: what each call
 * answered and the queue's bucket after each.
 */
async function flowScenario(dialect?: Dialect): Promise<unknown> {
  let t = 1_000_000;
  const { outbox, db } = await open({ now: () => t }, dialect);
  const seen: unknown[] = [];
  const ids = (leases: readonly Lease[]) =>
    leases.map((lease) => [lease.eventId, lease.fence, lease.attempt]);
  const bucket = async () =>
    seen.push(
      await db.inner.query(
        "SELECT tokens, refilled_at FROM outbox_queues WHERE queue = 'f'",
      ),
    );
  try {
    await outbox.setLimits("f", { perKey: 2, perSecond: 5 });
    const keys = ["a", "a", "a", "b", null, "a", "b", "b", "c", "c", "c"];
    for (const [i, key] of keys.entries()) {
      await outbox.enqueue({ i }, {
        queue: "f",
        priority: i === 3 ? 1 : 0,
        ...key === null ? { orderingKey: "o" } : { concurrencyKey: key },
      });
    }
    const one = await outbox.claim({ queue: "f" });
    seen.push(ids([one!]));
    await bucket();
    // The batch takes a's first two events, passes over its third and
    // takes the next in its place.
    const batch = await outbox.claim({ queue: "f", max: 4 });
    seen.push(ids(batch));
    await bucket();
    // Half a token: none to spend.
    t += 100;
    const more = await outbox.claim({ queue: "f", max: 4 });
    seen.push(ids(more));
    await bucket();
    t += 500;
    const next = await outbox.acknowledgeAndClaim([one!, ...batch], {
      queue: "f",
      max: 4,
    });
    seen.push(next.acknowledged, ids(next.leases));
    await bucket();
    await outbox.pause("f");
    seen.push(await outbox.claim({ queue: "f" }));
    await outbox.resume("f");
    t += 1_000;
    seen.push(ids(await outbox.claim({ queue: "f", max: 8 })));
    await bucket();
    seen.push(await outbox.stats({ queue: "f" }));
    return seen;
  } finally {
    await outbox.close();
  }
}

Deno.test("postgres: under flow control the one-statement claims answer and write what the general transactions do", async () => {
  const general = await flowScenario(GENERAL);
  assert.deepEqual(await flowScenario(), general);
});

/**
 * Connects to a fresh schema on the shared server, the connection named
 * `applicationName`.
 */
async function connector(): Promise<
  (applicationName?: string) => Promise<PostgresDriver>
> {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  return (applicationName = "leased-outbox") =>
    connectPostgres(server.url, { schema, listen: false, applicationName });
}

Deno.test("postgres: acknowledgeAndClaim takes its leases' row locks before it locks a candidate, so two at once never wait for each other", async () => {
  const connect = await connector();
  const outbox = await Outbox.open(await connect("w1"));
  const holder = await connect();
  const watcher = await connect();
  try {
    await outbox.enqueue({ n: "held" }, { queue: "q2" });
    const [lease] = await outbox.claim({ queue: "q2", max: 1 });
    const { eventId: candidate } = await outbox.enqueue({ n: "next" });
    // Another transaction holds the lease's row (as a concurrent claim
    // that finds it lapsed does): the call waits for it.
    await holder.run("BEGIN");
    await holder.query("SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", [
      lease!.eventId,
    ]);
    const call = outbox.acknowledgeAndClaim([lease!], { max: 1 });
    await untilWaiting(watcher, "w1", call);
    // While it waits it holds no candidate: had it locked the next event,
    // a holder waiting for that row would wait for it, each for the other.
    const free = await holder.query(
      "SELECT id FROM outbox_events WHERE id = $1 FOR UPDATE SKIP LOCKED",
      [candidate],
    );
    assert.deepEqual(free.map((row) => Number(row["id"])), [candidate]);
    await holder.run("ROLLBACK");
    const { acknowledged, leases } = await call;
    assert.deepEqual(acknowledged, [true]);
    assert.deepEqual(leases.map((l) => l.eventId), [candidate]);
  } finally {
    await holder.close();
    await watcher.close();
    await outbox.close();
  }
});

for (const call of ["acknowledge", "acknowledgeAndClaim"] as const) {
  Deno.test(`postgres: a one-statement ${call} locks no lease while a lapsed last attempt waits to become a dead letter, so it never deadlocks with a stale acknowledgement's transaction`, async () => {
    const connect = await connector();
    let t = 1_000_000;
    const w1 = await Outbox.open(await connect("w1"), { now: () => t });
    const w2 = await Outbox.open(await connect("w2"), { now: () => t });
    const holder = await connect();
    const watcher = await connect();
    try {
      const { eventId: y } = await w1.enqueue({ n: "y" }, { queue: "a" });
      const { eventId: z } = await w1.enqueue({ n: "z" }, { queue: "b" });
      await w1.enqueue({ n: "x" }, { queue: "c", maxAttempts: 1 });
      const staleY = (await w2.claim({ queue: "a", leaseMs: 100 }))!;
      t += 150;
      const y1 = (await w1.claim({ queue: "a" }))!;
      const z1 = (await w1.claim({ queue: "b" }))!;
      const x1 = (await w1.claim({ queue: "c", leaseMs: 100 }))!;
      t += 150; // x1 lapsed on its last attempt
      assert.deepEqual([y1.eventId, z1.eventId], [y, z]);
      // z's row held elsewhere: w1's call waits for it holding what it
      // locked before; then w2's stale acknowledgement falls back to its
      // transaction, which first locks the lapsed last attempt.
      await holder.run("BEGIN");
      await holder.query(
        "SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE",
        [z],
      );
      const first = call === "acknowledge"
        ? w1.acknowledge([y1, z1, x1])
        : w1.acknowledgeAndClaim([y1, z1, x1], { max: 1, queue: "d" }).then(
          ({ acknowledged }) => acknowledged,
        );
      await untilWaiting(watcher, "w1", first);
      const stale = w2.acknowledge(staleY);
      await untilWaiting(watcher, "w2", stale);
      await holder.run("COMMIT");
      assert.deepEqual(await first, [true, true, false]);
      assert.equal(await stale, false);
      assert.deepEqual(
        (await w1.queues()).map(({ queue, done, dead }) => [queue, done, dead]),
        [["a", 1, 0], ["b", 1, 0], ["c", 0, 1]],
      );
    } finally {
      await holder.close();
      await watcher.close();
      await w1.close();
      await w2.close();
    }
  });
}

/**
 * A connection whose first COMMIT after `hold()` waits until `commit()` is
 * called.
 */
class HeldCommit extends CountingDriver {
  #holding = false;
  #release: () => void = () => {};
  #held = new Promise<void>((resolve) => this.#release = resolve);
  #reached: () => void = () => {};
  /** Resolves when the COMMIT is held. */
  readonly reached = new Promise<void>((resolve) => this.#reached = resolve);

  hold(): void {
    this.#holding = true;
  }

  commit(): void {
    this.#holding = false;
    this.#release();
  }

  async #hold(sql: string): Promise<void> {
    if (!this.#holding || sql !== this.dialect.commit) return;
    this.#reached();
    await this.#held;
  }

  override async query(sql: string, params?: readonly SqlValue[]) {
    await this.#hold(sql);
    return await super.query(sql, params);
  }

  override async run(sql: string, params?: readonly SqlValue[]) {
    await this.#hold(sql);
    return await super.run(sql, params);
  }

  override async exec(sql: string) {
    await this.#hold(sql);
    return await super.exec(sql);
  }
}

Deno.test("postgres: a one-statement claim that waited for its queue's row while a general-path claim of the queue took a lease counts that lease, so its key at its limit stays held back", async () => {
  const connect = await connector();
  const outbox = await Outbox.open(await connect("w1"));
  const general = new HeldCommit(await connect(), GENERAL);
  const other = await Outbox.open(general);
  const watcher = await connect();
  try {
    await outbox.setLimits("default", { perKey: 1 });
    await outbox.enqueue({ n: 1 }, { concurrencyKey: "k" });
    await outbox.enqueue({ n: 2 }, { concurrencyKey: "k" });
    // A claim of the queue in flight: it holds the queue's row, its lease
    // taken but not committed.
    general.hold();
    const first = other.claim();
    await general.reached;
    // The call's snapshot predates that lease: it counts none for k.
    const call = outbox.claim();
    await untilWaiting(watcher, "w1", call);
    general.commit();
    assert.deepEqual((await first)?.payload, { n: 1 });
    assert.equal(await call, null);
    assert.equal((await outbox.stats()).leased, 1);
  } finally {
    await watcher.close();
    await other.close();
    await outbox.close();
  }
});

/**
 * An acknowledgement's lookup of its leases' rows: by id, as one array in
 * the primary key, never through the claim index (PostgreSQL 18's skip
 * scan took it for the ids while the state was among the lookup's
 * conditions, a third of a batch acknowledgement of 256), nor one lookup
 * per lease with the whole array beside its id. `scanned`: whether a
 * table small enough may be read whole instead, once.
 */
function assertLookups(
  plans: Record<string, string>,
  scanned: "by key" | "by key or whole" = "by key",
): void {
  for (const [name, text] of Object.entries(plans)) {
    assert.doesNotMatch(text, /outbox_events_(claim_priority|ready)/, name);
    assert.doesNotMatch(text, /Index Cond: \(\(id = \w+\.id\) AND/, name);
    if (scanned === "by key") {
      assert.match(text, /Index Scan using outbox_events_pkey/, name);
    }
  }
}

/** Each statement's plan (EXPLAIN's text) on `db`. */
async function planOf(
  db: Driver,
  sql: string,
  params: SqlValue[],
): Promise<string> {
  return (await db.query(`EXPLAIN ${sql}`, params))
    .map((row) => Object.values(row)[0]).join("\n");
}

Deno.test("postgres: on a table of two batches, as a processing loop keeps it, the one-statement acknowledgements look their leases' rows up once, not through the claim index nor lease by lease", async () => {
  const { outbox, db } = await open();
  try {
    const batch = () =>
      outbox.enqueueBatch(
        Array.from({ length: 256 }, (_, i) => ({ payload: { i } })),
      );
    await batch();
    const leases = await outbox.claim({ max: 256 });
    await batch();
    const json = JSON.stringify(
      leases.map((l) => [l.eventId, l.fence, l.token]),
    );
    assertLookups({
      acknowledgeAllInOne: await planOf(
        db.inner,
        POSTGRES.acknowledgeAllInOne!,
        [null, json],
      ),
      acknowledgeInOne: await planOf(db.inner, POSTGRES.acknowledgeInOne!, [
        null,
        leases[0]!.eventId,
        leases[0]!.token,
        leases[0]!.fence,
      ]),
    }, "by key or whole");
    assert.equal((await outbox.stats()).leased, 256);
  } finally {
    await outbox.close();
  }
});

Deno.test("postgres: with leases in flight at the last ANALYZE, the one-statement claim and acknowledgements look for a lapsed last-attempt lease in its partial index, not by scanning outbox_events, and the acknowledgements look their leases' rows up by id in the primary key", async () => {
  const { outbox, db } = await open();
  try {
    // 10,000 leases in flight and a backlog of 8,192 when the statistics
    // were taken: the planner guesses about 1,100 leases past their last
    // attempt, and the shipped NOT EXISTS form scanned the table for the
    // first (the batch acknowledgement's plan failed this test).
    const n = 10_000;
    await outbox.enqueueBatch(
      Array.from({ length: n }, (_, i) => ({ payload: { i } })),
    );
    const leases = await outbox.claim({ max: n });
    assert.equal(leases.length, n);
    // A backlog of another queue: more pages for a scan.
    for (let b = 0; b < 32; b++) {
      await outbox.enqueueBatch(
        Array.from({ length: 256 }, (_, i) => ({ payload: { i }, queue: "e" })),
      );
    }
    await outbox.enqueueBatch([{ payload: { i: n } }]);
    await db.inner.run("ANALYZE outbox_events");
    const plan = (sql: string, params: SqlValue[]) =>
      planOf(db.inner, sql, params);
    const json = JSON.stringify(
      leases.slice(0, 256).map((l) => [l.eventId, l.fence, l.token]),
    );
    // now, queue, max, the largest payload, leaseMs, tokens.
    const claim = [null, "default", 256, 1 << 20, 30_000, "ab".repeat(4096)];
    const plans = {
      claimInOne: await plan(POSTGRES.claimInOne, claim),
      acknowledgeAllInOne: await plan(POSTGRES.acknowledgeAllInOne, [
        null,
        json,
      ]),
      acknowledgeInOne: await plan(POSTGRES.acknowledgeInOne, [
        null,
        leases[0]!.eventId,
        leases[0]!.token,
        leases[0]!.fence,
      ]),
      acknowledgeAndClaimInOne: await plan(POSTGRES.acknowledgeAndClaimInOne, [
        ...claim,
        json,
      ]),
      // The general path's, which lock such leases in id order.
      exhausted: await plan(POSTGRES.exhausted, [Date.now()]),
      nowExhausted: await plan(POSTGRES.nowExhausted, []),
    };
    for (const [name, text] of Object.entries(plans)) {
      assert.match(text, /outbox_events_last_leases/, name);
      assert.doesNotMatch(text, /Seq Scan on outbox_events/, name);
    }
    assertLookups({
      acknowledgeAllInOne: plans.acknowledgeAllInOne,
      acknowledgeInOne: plans.acknowledgeInOne,
    });
    // Nothing above ran: the leases are all still in flight.
    assert.equal((await outbox.stats()).leased, n);
  } finally {
    await outbox.close();
  }
});

Deno.test("postgres: the one-statement claim leaves a lapsed lease to the general path only when the claim would take it, in its deadline's order: one lapsing after the batch's last event does not refuse the batch", async () => {
  const clock = new ManualClock(1_000);
  const { outbox, db } = await open({ now: clock.now });
  try {
    // Event 1, due at 1,000, leased until 6,000; events 2 to 5 due at
    // 2,000 and event 6 at 8,000.
    await outbox.enqueue("first");
    assert.equal((await outbox.claim({ leaseMs: 5_000 }))?.leaseUntil, 6_000);
    clock.set(2_000);
    await outbox.enqueueBatch(
      Array.from({ length: 4 }, (_, i) => ({ payload: { i } })),
    );
    await outbox.enqueue("late", { delayMs: 6_000 });
    // Each claim at 10,000 (the lease lapsed at 6,000), rolled back.
    const claim = async (max: number) => {
      await db.inner.run("BEGIN");
      try {
        const rows = await db.inner.query(POSTGRES.claimInOne, [
          10_000,
          "default",
          max,
          1 << 20,
          30_000,
          "ab".repeat(16 * max),
        ]);
        return {
          refused: rows[0]?.["refused"],
          ids: rows.filter((row) => row["id"] !== null).map((row) =>
            Number(row["id"])
          ),
        };
      } finally {
        await db.inner.run("ROLLBACK");
      }
    };
    // The lease's deadline is past the batch's last event: not taken.
    assert.deepEqual(await claim(2), { refused: 0, ids: [2, 3] });
    assert.deepEqual(await claim(4), { refused: 0, ids: [2, 3, 4, 5] });
    // Before event 6, or the batch short: the general path takes it over.
    assert.deepEqual(await claim(5), { refused: 1, ids: [] });
    assert.deepEqual(await claim(10), { refused: 1, ids: [] });
    clock.set(10_000);
    assert.deepEqual(
      (await outbox.claim({ max: 10 })).map((lease) => lease.eventId),
      [2, 3, 4, 5, 1, 6],
    );
  } finally {
    await outbox.close();
  }
});
