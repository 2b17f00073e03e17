/**
 * Issue 39's upgrade: a PostgreSQL outbox at schema version 6, 7 or 8 (as
 * released, `tests/fixtures/postgres_schema_v6.sql`, `_v7.sql` and
 * `_v8.sql`; version 8's rows moved into its layout by `AS_VERSION_8`)
 * holding 100,000 events in every state opens with this release, which
 * upgrades it, and nothing is lost. A smaller version 8 outbox holds the
 * leases version 9 reads by marker: of ordering and concurrency keys, and
 * last attempts.
 *
 * The database is filled with set-based SQL on the older tables; what
 * each event should read as afterwards is taken from those tables before
 * the upgrade. After it, everything is read through the public API only
 * (`list`, `explain`, `queues`, `stats`, `claim`, `acknowledge`, `renew`,
 * `redrive`, `cancel`, `purge`, `OutboxReader`), so the test holds for any
 * storage layout the upgrade moves the events into.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  connectPostgres,
  openPostgres,
  type PostgresDriver,
} from "../drivers/postgres.ts";
import {
  type EventInfo,
  type Explanation,
  type Lease,
  type LedgerEntry,
  type Outbox,
  POSTGRES_SCHEMA_VERSION,
  type QueueCounts,
} from "../mod.ts";
import { OutboxReader } from "../reader.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { asPostgresVersion8, ManualClock } from "./helpers.ts";

const EVENTS = 100_000;
/** The outbox's clock at the upgrade, epoch milliseconds. */
const NOW = 1_900_000_000_000;
const MINUTE = 60_000;
const HOUR = 3_600_000;
const DAY = 86_400_000;

/**
 * One kind of event: `count` in 20 events are of it (by `(id / 4) % 20`,
 * the queue being `id % 4`, so every queue holds every kind). `event` gives
 * the state columns as SQL over `g` (the id), `created` and `fin` (when a
 * finished event finished); `ledger`, the entries written in
 * outbox_attempts, in order, as SQL over the event row `e`. The entries a
 * version 6 or 7 outbox left unwritten (a claim and an acknowledgement made in
 * one statement) come from the row, through the outbox_ledger view.
 */
interface Kind {
  readonly name: string;
  readonly buckets: readonly number[];
  readonly event: {
    readonly state: string;
    readonly attempt: number;
    readonly maxAttempts: number;
    readonly fence: number;
    readonly dueAt: string;
    readonly leaseUntil: string;
    readonly token: string;
    readonly lastError: string;
    readonly updatedAt: string;
    readonly doneAt: string;
    readonly claimedAt: string;
  };
  readonly ledger: readonly string[];
}

const NULL = "NULL";
const LIVE = `${NOW + DAY}`;
// Live at NOW, lapsed from NOW + 10 minutes (the test moves its clock
// there).
const LAPSING = `${NOW + 5 * MINUTE} + g % 1000`;
const claimed = (fence: number, at: string, until: string, token: string) =>
  `${fence}, 'claimed', ${at}, ${token}, ${until}, NULL`;
const entry = (fence: number, kind: string, at: string, detail: string) =>
  `${fence}, '${kind}', ${at}, NULL, NULL, ${detail}`;

const KINDS: readonly Kind[] = [{
  name: "pending",
  buckets: [0, 1, 2, 3, 4],
  event: {
    state: "pending",
    attempt: 0,
    maxAttempts: 5,
    fence: 0,
    dueAt: "created",
    leaseUntil: NULL,
    token: NULL,
    lastError: NULL,
    updatedAt: "created",
    doneAt: NULL,
    claimedAt: NULL,
  },
  ledger: [],
}, {
  name: "pending, delayed",
  buckets: [5],
  event: {
    state: "pending",
    attempt: 0,
    maxAttempts: 5,
    fence: 0,
    dueAt: `${NOW + HOUR} + g`,
    leaseUntil: NULL,
    token: NULL,
    lastError: NULL,
    updatedAt: "created",
    doneAt: NULL,
    claimedAt: NULL,
  },
  ledger: [],
}, {
  name: "pending after a failed attempt, its backoff over",
  buckets: [6],
  event: {
    state: "pending",
    attempt: 1,
    maxAttempts: 5,
    fence: 1,
    dueAt: `${NOW - HOUR} + g % 1000`,
    leaseUntil: NULL,
    token: NULL,
    lastError: "'boom ' || g",
    updatedAt: `${NOW - 2 * HOUR}`,
    doneAt: NULL,
    claimedAt: `${NOW - 3 * HOUR}`,
  },
  ledger: [
    claimed(1, "e.claimed_at", "e.claimed_at + 30000", "'first-' || e.id"),
    entry(1, "released", `${NOW - 2 * HOUR}`, "e.last_error"),
  ],
}, {
  name: "leased, live",
  buckets: [7],
  event: {
    state: "leased",
    attempt: 1,
    maxAttempts: 5,
    fence: 1,
    dueAt: LIVE,
    leaseUntil: LIVE,
    token: "'live-' || md5(g::text)",
    lastError: NULL,
    updatedAt: `${NOW - 1000}`,
    doneAt: NULL,
    claimedAt: `${NOW - 1000}`,
  },
  ledger: [],
}, {
  name: "leased, lapsing, attempts left",
  buckets: [8],
  event: {
    state: "leased",
    attempt: 2,
    maxAttempts: 5,
    fence: 2,
    dueAt: LAPSING,
    leaseUntil: LAPSING,
    token: "'lapse-' || md5(g::text)",
    lastError: "'boom ' || g",
    updatedAt: `${NOW - MINUTE}`,
    doneAt: NULL,
    claimedAt: `${NOW - MINUTE}`,
  },
  ledger: [
    claimed(1, `${NOW - HOUR}`, `${NOW - HOUR + 30_000}`, "'first-' || e.id"),
    entry(1, "released", `${NOW - HOUR + 1000}`, "e.last_error"),
  ],
}, {
  name: "leased, lapsing, on its last attempt",
  buckets: [9],
  event: {
    state: "leased",
    attempt: 3,
    maxAttempts: 3,
    fence: 3,
    dueAt: LAPSING,
    leaseUntil: LAPSING,
    token: "'last-' || md5(g::text)",
    lastError: "'boom ' || g",
    updatedAt: `${NOW - MINUTE}`,
    doneAt: NULL,
    claimedAt: `${NOW - MINUTE}`,
  },
  ledger: [claimed(3, "e.claimed_at", "e.lease_until", "e.token")],
}, {
  name: "leased, live, on its last attempt",
  buckets: [10],
  event: {
    state: "leased",
    attempt: 3,
    maxAttempts: 3,
    fence: 3,
    dueAt: LIVE,
    leaseUntil: LIVE,
    token: "'final-' || md5(g::text)",
    lastError: "'boom ' || g",
    updatedAt: `${NOW - 1000}`,
    doneAt: NULL,
    claimedAt: `${NOW - 1000}`,
  },
  ledger: [],
}, {
  name: "done, its ledger written",
  buckets: [11],
  event: {
    state: "done",
    attempt: 1,
    maxAttempts: 5,
    fence: 1,
    dueAt: "fin + 29500",
    leaseUntil: "fin + 29500",
    token: "'done-' || md5(g::text)",
    lastError: NULL,
    updatedAt: "fin",
    doneAt: "fin",
    claimedAt: "fin - 500",
  },
  ledger: [
    claimed(1, "e.claimed_at", "e.lease_until", "e.token"),
    "1, 'acknowledged', e.done_at, e.token, NULL, NULL",
  ],
}, {
  name: "done in one statement (its ledger from the row)",
  buckets: [12, 13, 14],
  event: {
    state: "done",
    attempt: 1,
    maxAttempts: 5,
    fence: 1,
    dueAt: "fin + 29500",
    leaseUntil: "fin + 29500",
    token: "'done-' || md5(g::text)",
    lastError: NULL,
    updatedAt: "fin",
    doneAt: "fin",
    claimedAt: "fin - 500",
  },
  ledger: [],
}, {
  name: "done after a failed attempt",
  buckets: [15],
  event: {
    state: "done",
    attempt: 2,
    maxAttempts: 5,
    fence: 2,
    dueAt: "fin + 29500",
    leaseUntil: "fin + 29500",
    token: "'again-' || md5(g::text)",
    lastError: "'boom ' || g",
    updatedAt: "fin",
    doneAt: "fin",
    claimedAt: "fin - 500",
  },
  ledger: [
    claimed(1, "e.fin - 60000", "e.fin - 30000", "'first-' || e.id"),
    entry(1, "released", "e.fin - 59000", "e.last_error"),
  ],
}, {
  name: "dead, its attempts spent",
  buckets: [16],
  event: {
    state: "dead",
    attempt: 3,
    maxAttempts: 3,
    fence: 3,
    dueAt: "fin",
    leaseUntil: NULL,
    token: NULL,
    lastError: "'failed ' || g",
    updatedAt: "fin",
    doneAt: "fin",
    claimedAt: "fin - 500",
  },
  ledger: [
    claimed(3, "e.claimed_at", "e.claimed_at + 30000", "'third-' || e.id"),
    entry(3, "released", "e.done_at", "e.last_error"),
    entry(3, "dead", "e.done_at", "e.last_error"),
  ],
}, {
  name: "dead, its last lease expired",
  buckets: [17],
  event: {
    state: "dead",
    attempt: 3,
    maxAttempts: 3,
    fence: 3,
    dueAt: "fin",
    leaseUntil: NULL,
    token: NULL,
    lastError: "'lease expired'",
    updatedAt: "fin + 10",
    doneAt: "fin",
    claimedAt: "fin - 30000",
  },
  ledger: [
    claimed(3, "e.claimed_at", "e.done_at", "'third-' || e.id"),
    entry(3, "expired", "e.updated_at", "e.last_error"),
    entry(3, "dead", "e.updated_at", "e.last_error"),
  ],
}, {
  name: "dead, cancelled",
  buckets: [18],
  event: {
    state: "dead",
    attempt: 0,
    maxAttempts: 5,
    fence: 0,
    dueAt: "created",
    leaseUntil: NULL,
    token: NULL,
    lastError: "'cancelled'",
    updatedAt: "fin",
    doneAt: "fin",
    claimedAt: NULL,
  },
  ledger: [entry(0, "dead", "e.done_at", "e.last_error")],
}, {
  name: "dead, released as a dead letter",
  buckets: [19],
  event: {
    state: "dead",
    attempt: 1,
    maxAttempts: 5,
    fence: 1,
    dueAt: "fin",
    leaseUntil: NULL,
    token: NULL,
    lastError: "'poison ' || g",
    updatedAt: "fin",
    doneAt: "fin",
    claimedAt: "fin - 500",
  },
  ledger: [
    claimed(1, "e.claimed_at", "e.claimed_at + 30000", "'first-' || e.id"),
    entry(1, "released", "e.done_at", "e.last_error"),
    entry(1, "dead", "e.done_at", "e.last_error"),
  ],
}];

/** The bucket of event `g` (see {@linkcode Kind}), as SQL. */
const BUCKET = (g: string) => `(${g} / 4) % 20`;
// Enqueue times from NOW - 8 days, a second apart; finished events from
// NOW - 7 days, 5 s apart (to NOW - 1.2 days).
const CREATED = (g: string) => `${NOW - 8 * DAY}::bigint + ${g} * 1000`;
const FIN = (g: string) => `${NOW - 7 * DAY}::bigint + ${g} * 5000`;

/**
 * The older tables filled: set-based, one INSERT per kind of event and
 * per ledger entry of a kind (each event's entries in order of their ids).
 * Payloads: JSON text, bytes for one in ten. Dedup keys on one in three;
 * ordering keys on half of q3's events, 25 keys.
 */
function fillSql(): string {
  const statements: string[] = [];
  for (const kind of KINDS) {
    const e = kind.event;
    const where = `${BUCKET("g")} IN (${kind.buckets.join(", ")})`;
    statements.push(`INSERT INTO outbox_events (id, queue, state, payload,
        payload_bytes, dedup_key, ordering_key, due_at, lease_until, token,
        fence, attempt, max_attempts, last_error, created_at, updated_at,
        done_at, claimed_at, identity)
      SELECT g, 'q' || g % 4, '${e.state}',
        CASE WHEN g % 10 <> 3 THEN '{"n": ' || g || ', "queue": "q' || g % 4
          || '", "pad": "' || repeat('x', g % 40) || '", "kind": "${kind.name}"}' END,
        CASE WHEN g % 10 = 3 THEN decode(md5('bytes' || g), 'hex') END,
        CASE WHEN g % 3 = 0 THEN 'dedup-' || g END,
        CASE WHEN g % 8 = 7 THEN 'key-' || (g / 8) % 25 END,
        ${e.dueAt}, ${e.leaseUntil}, ${e.token}, ${e.fence}, ${e.attempt},
        ${e.maxAttempts}, ${e.lastError}, created, ${e.updatedAt}, ${e.doneAt},
        ${e.claimedAt}, md5('event ' || g)::uuid
      FROM generate_series(1, ${EVENTS}) AS g,
        LATERAL (SELECT ${CREATED("g")} AS created, ${FIN("g")} AS fin) AS t
      WHERE ${where}`);
    for (const values of kind.ledger) {
      statements.push(`INSERT INTO outbox_attempts
          (event_id, fence, kind, at, token, lease_until, detail)
        SELECT e.id, ${values}
        FROM (SELECT *, ${FIN("id")} AS fin
          FROM outbox_events) AS e
        WHERE ${BUCKET("e.id")} IN (${kind.buckets.join(", ")})
        ORDER BY e.id`);
    }
  }
  // The ids were given here, not by the identity: later inserts follow.
  statements.push(
    `SELECT setval(pg_get_serial_sequence('outbox_events', 'id'), ${EVENTS})`,
    "ANALYZE outbox_events",
    "ANALYZE outbox_attempts",
  );
  return statements.join(";\n");
}

/** An event as read from its row before the upgrade. */
interface Before {
  readonly info: EventInfo;
  readonly fence: number;
  readonly token: string | null;
  readonly doneAt: number | null;
}

const hex = (bytes: Uint8Array) =>
  Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

/** One event's public fields as one line, for the digest. */
function line(event: EventInfo): string {
  const payload = event.payload instanceof Uint8Array
    ? `bytes:${hex(event.payload)}`
    : `json:${JSON.stringify(event.payload)}`;
  return JSON.stringify([
    event.id,
    event.identity,
    event.queue,
    event.state,
    event.attempt,
    event.maxAttempts,
    event.dueAt,
    event.leaseUntil,
    event.lastError,
    event.createdAt,
    event.updatedAt,
    payload,
    event.orderingKey,
    event.dedupKey,
  ]);
}

/** A SHA-256 of the events' lines, in id order. */
function digest(events: readonly EventInfo[]): string {
  const hash = createHash("sha256");
  for (const event of [...events].sort((a, b) => a.id - b.id)) {
    hash.update(line(event) + "\n");
  }
  return hash.digest("hex");
}

const nullableNumber = (value: unknown) =>
  value === null ? null : Number(value);
const nullableText = (value: unknown) => value === null ? null : String(value);

/** Every event as the older tables hold it, by id. */
async function readBefore(db: PostgresDriver): Promise<Map<number, Before>> {
  const rows = await db.query(`SELECT id, identity::text AS identity, queue,
      state, payload, payload_bytes, ordering_key, dedup_key, due_at,
      lease_until, token, fence, attempt, max_attempts, last_error,
      created_at, updated_at, done_at
    FROM outbox_events ORDER BY id`);
  const events = new Map<number, Before>();
  for (const row of rows) {
    const state = String(row["state"]) as EventInfo["state"];
    const bytes = row["payload_bytes"];
    const info: EventInfo = {
      id: Number(row["id"]),
      identity: String(row["identity"]),
      queue: String(row["queue"]),
      state,
      attempt: Number(row["attempt"]),
      maxAttempts: Number(row["max_attempts"]),
      dueAt: Number(row["due_at"]),
      leaseUntil: state === "leased" ? Number(row["lease_until"]) : null,
      lastError: nullableText(row["last_error"]),
      createdAt: Number(row["created_at"]),
      updatedAt: Number(row["updated_at"]),
      payload: bytes instanceof Uint8Array
        ? bytes
        : JSON.parse(String(row["payload"])),
      orderingKey: nullableText(row["ordering_key"]),
      dedupKey: nullableText(row["dedup_key"]),
    };
    events.set(info.id, {
      info,
      fence: Number(row["fence"]),
      token: nullableText(row["token"]),
      doneAt: nullableNumber(row["done_at"]),
    });
  }
  return events;
}

/** Every event of every state, through `list`, 10,000 a page. */
async function listAll(
  source: Pick<Outbox, "list"> | OutboxReader,
): Promise<EventInfo[]> {
  const events: EventInfo[] = [];
  for (const state of ["pending", "leased", "done", "dead"] as const) {
    for (let afterId = 0;;) {
      const page = await source.list({ state, limit: 10_000, afterId });
      events.push(...page);
      if (page.length < 10_000) break;
      afterId = page.at(-1)!.id;
    }
  }
  return events;
}

/** Counts per queue and state, as `queues()` reports them. */
function countsOf(events: Iterable<EventInfo>): QueueCounts[] {
  const byQueue = new Map<string, {
    queue: string;
    pending: number;
    leased: number;
    done: number;
    dead: number;
    oldestPendingAt: number | null;
  }>();
  for (const event of events) {
    const counts = byQueue.get(event.queue) ?? {
      queue: event.queue,
      pending: 0,
      leased: 0,
      done: 0,
      dead: 0,
      oldestPendingAt: null,
    };
    counts[event.state]++;
    if (
      event.state === "pending" &&
      (counts.oldestPendingAt === null ||
        event.createdAt < counts.oldestPendingAt)
    ) {
      counts.oldestPendingAt = event.createdAt;
    }
    byQueue.set(event.queue, counts);
  }
  return [...byQueue.values()].sort((a, b) => a.queue < b.queue ? -1 : 1);
}

/** What `explain` should answer for the sampled events, from the older rows. */
async function explanationsBefore(
  db: PostgresDriver,
  events: Map<number, Before>,
  ids: readonly number[],
): Promise<Map<number, Explanation>> {
  const rows = await db.query(
    `SELECT event_id, kind, fence, at, token, lease_until, detail
    FROM outbox_ledger
    WHERE event_id IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb))
    ORDER BY event_id, seq`,
    [JSON.stringify(ids)],
  );
  const history = new Map<number, LedgerEntry[]>(ids.map((id) => [id, []]));
  for (const row of rows) {
    history.get(Number(row["event_id"]))!.push({
      kind: row["kind"] as LedgerEntry["kind"],
      fence: Number(row["fence"]),
      at: Number(row["at"]),
      token: nullableText(row["token"]),
      leaseUntil: nullableNumber(row["lease_until"]),
      detail: nullableText(row["detail"]),
    });
  }
  return new Map(ids.map((id) => {
    const { info, fence } = events.get(id)!;
    return [id, {
      eventId: id,
      identity: info.identity,
      queue: info.queue,
      state: info.state,
      attempt: info.attempt,
      maxAttempts: info.maxAttempts,
      fence,
      lastError: info.lastError,
      history: history.get(id)!,
    }];
  }));
}

/** The first `n` events of each kind and queue, by id. */
function sample(events: Map<number, Before>, n: number): number[] {
  const taken = new Map<string, number>();
  const ids: number[] = [];
  for (const id of events.keys()) {
    const key = `${(id >> 2) % 20}:${id % 4}`;
    const count = taken.get(key) ?? 0;
    if (count < n) {
      ids.push(id);
      taken.set(key, count + 1);
    }
  }
  return ids;
}

/** The lease a worker of the older release holds on `event`. */
function heldLease(event: Before): Lease {
  const { info } = event;
  return {
    eventId: info.id,
    identity: info.identity,
    queue: info.queue,
    token: event.token!,
    fence: event.fence,
    attempt: info.attempt,
    maxAttempts: info.maxAttempts,
    leaseUntil: info.leaseUntil!,
    payload: info.payload,
    orderingKey: info.orderingKey,
    lastError: info.lastError,
  };
}

/**
 * The events a claim of `queue` at `now` takes, in order: due (pending, or
 * leased and lapsed), and of an ordering key only when no earlier event of
 * the key is pending or leased and no event of the key holds a live lease.
 */
function claimable(
  events: Iterable<EventInfo>,
  queue: string,
  now: number,
): number[] {
  const inQueue = [...events].filter((e) => e.queue === queue)
    .sort((a, b) => a.id - b.id);
  const open = inQueue.filter((e) =>
    e.state === "pending" || e.state === "leased"
  );
  const firstOpen = new Map<string, number>();
  const liveKeys = new Set<string>();
  for (const e of open) {
    if (e.orderingKey === null) continue;
    if (!firstOpen.has(e.orderingKey)) firstOpen.set(e.orderingKey, e.id);
    if (e.state === "leased" && e.dueAt > now) liveKeys.add(e.orderingKey);
  }
  return open.filter((e) =>
    e.dueAt <= now &&
    (e.orderingKey === null ||
      (firstOpen.get(e.orderingKey) === e.id && !liveKeys.has(e.orderingKey)))
  ).sort((a, b) => a.dueAt - b.dueAt || a.id - b.id).map((e) => e.id);
}

/** The set-up lock, as an opener upgrading the schema takes it. */
const SET_UP_LOCK =
  "SELECT pg_advisory_xact_lock(hashtext('leased_outbox:' || current_schema()))";

/** Resolves once `count` backends wait for an advisory lock (20 s at most). */
async function untilWaitingOnAdvisoryLock(
  db: PostgresDriver,
  count: number,
): Promise<void> {
  const deadline = performance.now() + 20_000;
  for (;;) {
    const [row] = await db.query(
      "SELECT count(*)::integer AS n FROM pg_stat_activity WHERE wait_event = 'advisory' AND datname = current_database()",
    );
    if (row?.["n"] === count) return;
    assert.ok(
      performance.now() < deadline,
      `${count} openers waiting for the set-up lock`,
    );
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/**
 * Version 8's layout of the rows `fillSql` wrote in version 7's: every
 * event's keys in outbox_keys, the done events in outbox_done.
 */
const AS_VERSION_8 =
  `INSERT INTO outbox_keys (identity, event_id, queue, dedup_key)
    SELECT identity, id, queue, dedup_key FROM outbox_events ORDER BY id;
  WITH moved AS (DELETE FROM outbox_events WHERE state = 'done' RETURNING *)
    INSERT INTO outbox_done SELECT * FROM moved;
  ANALYZE outbox_events`;

for (const version of [6, 7, 8]) {
  Deno.test(`postgres: a version ${version} outbox of 100,000 events in every state, opened by two outboxes queued for the set-up lock at once, upgrades once; every event lists, explains and counts as before, and leases, dedup, ordering keys, redrive, cancel and purge work on them`, async () => {
    const server = await sharedPostgres();
    const url = server.url;
    const schema = await server.createSchema();
    await using db = await connectPostgres(url, { schema, listen: false });
    await db.exec(
      await Deno.readTextFile(
        new URL(`./fixtures/postgres_schema_v${version}.sql`, import.meta.url),
      ),
    );
    await db.exec(fillSql());
    const before = await readBefore(db);
    assert.equal(before.size, EVENTS);
    const infos = [...before.values()].map((e) => e.info);
    const expectedCounts = countsOf(infos);
    // Every queue holds every state, and there is a ledger to keep.
    for (const counts of expectedCounts) {
      for (const state of ["pending", "leased", "done", "dead"] as const) {
        assert.ok(counts[state] >= 1_000, `${counts.queue} ${state}`);
      }
    }
    const [{ n: ledgerRows } = {}] = await db.query(
      "SELECT count(*)::integer AS n FROM outbox_attempts",
    );
    assert.equal(
      ledgerRows,
      KINDS.reduce((n, k) => n + k.ledger.length * k.buckets.length, 0) *
        EVENTS / 20,
    );
    const sampled = sample(before, 3);
    const explained = await explanationsBefore(db, before, sampled);
    if (version === 8) await db.exec(AS_VERSION_8);
    const versions = async () =>
      (await db.query("SELECT version FROM outbox_schema ORDER BY version"))
        .map((row) => row["version"]);
    assert.deepEqual(await versions(), [version]);
    const upgrades = version < POSTGRES_SCHEMA_VERSION;

    // A reader upgrades nothing: it refuses an older schema.
    if (upgrades) {
      await assert.rejects(
        OutboxReader.open(
          await connectPostgres(url, { schema, listen: false }),
        ),
        new RegExp(
          `outbox schema version ${version}, not \\d+: Outbox\\.open upgrades an older one`,
        ),
      );
      assert.deepEqual(await versions(), [version]);
    }

    // Two outboxes open the older schema at once: both find its version
    // and queue for the set-up lock (held here until both wait for it); the
    // first upgrades, the second must find the upgrade done and not run it
    // again.
    const clock = new ManualClock(NOW);
    const options = { schema, now: clock.now, listen: false };
    await using holder = await connectPostgres(url, { schema, listen: false });
    await holder.run("BEGIN");
    await holder.query(SET_UP_LOCK);
    const openers = [openPostgres(url, options), openPostgres(url, options)];
    openers.forEach((opener) => opener.catch(() => {}));
    // At this release's own version an opener takes no set-up lock.
    if (upgrades) await untilWaitingOnAdvisoryLock(db, 2);
    await holder.run("COMMIT");
    const [a, b] = await Promise.all(openers) as [Outbox, Outbox];
    await using _a = a;
    await using _b = b;
    await using reader = await OutboxReader.open(
      await connectPostgres(url, { schema, listen: false }),
    );
    assert.deepEqual(
      await versions(),
      upgrades ? [version, POSTGRES_SCHEMA_VERSION] : [version],
    );

    // Nothing lost, nothing changed: every event lists as it was, by both
    // outboxes and the reader, and the counts agree.
    const expectedDigest = digest(infos);
    const listed = await listAll(a);
    assert.equal(listed.length, EVENTS);
    if (digest(listed) !== expectedDigest) {
      const changed = listed.find((event) =>
        line(event) !== line(before.get(event.id)?.info ?? event)
      );
      assert.fail(
        `the events listed differ from version ${version}'s; the first: ${
          changed === undefined ? "none changed, some missing" : line(changed)
        } was ${line(before.get(changed?.id ?? 0)?.info ?? listed[0]!)}`,
      );
    }
    assert.equal(digest(await listAll(reader)), expectedDigest);
    assert.deepEqual(await a.queues(), expectedCounts);
    assert.deepEqual(await reader.queues(), expectedCounts);
    for (const counts of expectedCounts) {
      const { wal: _, ...stats } = await b.stats({ queue: counts.queue });
      assert.deepEqual(stats, {
        pending: counts.pending,
        leased: counts.leased,
        done: counts.done,
        dead: counts.dead,
        oldestPendingAgeMs: NOW - counts.oldestPendingAt!,
      });
    }

    // Each sampled event explains as before, fence and ledger included, by
    // id and by identity.
    for (const id of sampled) {
      const expected = explained.get(id)!;
      assert.ok(expected.history.length > 0 || expected.state === "pending");
      assert.deepEqual(await a.explain(id), expected);
      assert.deepEqual(await b.explain(expected.identity), expected);
      assert.deepEqual(await reader.explain(id), expected);
    }

    // Dedup: the keys and identities of done events and dead letters still
    // refuse a second event, one at a time and in a batch.
    const kinds = (bucket: number, queue: string) =>
      infos.filter((e) =>
        (e.id >> 2) % 20 === bucket && e.queue === queue && e.dedupKey !== null
      );
    const done = kinds(12, "q1")[0]!;
    const dead = kinds(16, "q2")[0]!;
    for (const event of [done, dead]) {
      assert.deepEqual(
        await a.enqueue({ again: true }, {
          queue: event.queue,
          dedupKey: event.dedupKey!,
        }),
        { eventId: event.id, identity: event.identity, deduplicated: true },
      );
      assert.deepEqual(
        await b.enqueue({ again: true }, { identity: event.identity }),
        { eventId: event.id, identity: event.identity, deduplicated: true },
      );
    }
    const batch = await b.enqueueBatch([
      { payload: 1, queue: done.queue, dedupKey: done.dedupKey! },
      { payload: 2, queue: "fresh", dedupKey: done.dedupKey! },
      { payload: 3, queue: dead.queue, dedupKey: dead.dedupKey! },
    ]);
    assert.deepEqual(batch.map((r) => [r.eventId, r.deduplicated]), [
      [done.id, true],
      [batch[1]!.eventId, false],
      [dead.id, true],
    ]);
    // A new event's id follows the older release's.
    assert.ok(batch[1]!.eventId > EVENTS);

    // Pending events are claimed in order (due time, then id), with the
    // fence after the older release's, and acknowledged.
    const order0 = claimable(infos, "q0", NOW);
    assert.equal(order0.length, 7_500);
    const leases0 = [
      ...await a.claim({ queue: "q0", max: 5_000, leaseMs: MINUTE }),
      ...await b.claim({ queue: "q0", max: 5_000, leaseMs: MINUTE }),
    ];
    assert.deepEqual(leases0.map((lease) => lease.eventId), order0);
    for (const lease of leases0) {
      const was = before.get(lease.eventId)!;
      assert.deepEqual(
        [lease.fence, lease.attempt, lease.identity, lease.lastError],
        [
          was.fence + 1,
          was.info.attempt + 1,
          was.info.identity,
          was.info.lastError,
        ],
      );
    }
    assert.deepEqual(leases0[0]!.payload, before.get(order0[0]!)!.info.payload);
    assert.equal(await b.claim({ queue: "q0" }), null);
    const acked = await b.acknowledge(leases0);
    assert.equal(acked.filter((ok) => ok).length, 7_500);

    // An ordering key's events: one in flight at a time, the earliest first,
    // none while one of the key holds a live lease.
    const order3 = claimable(infos, "q3", NOW);
    const leases3 = await a.claim({ queue: "q3", max: 10_000 });
    assert.deepEqual(leases3.map((lease) => lease.eventId), order3);
    const keyed = leases3.filter((lease) => lease.orderingKey !== null);
    assert.ok(keyed.length > 0);
    assert.equal(
      new Set(keyed.map((lease) => lease.orderingKey)).size,
      keyed.length,
    );
    assert.deepEqual(await a.claim({ queue: "q3", max: 10_000 }), []);
    assert.ok((await a.acknowledge(leases3)).every((ok) => ok));

    // A lease taken before the upgrade stays its holder's: renewed and
    // acknowledged with its older token and fence.
    const live = infos.find((e) => (e.id >> 2) % 20 === 7 && e.queue === "q1")!;
    const held = heldLease(before.get(live.id)!);
    assert.equal(await b.renew(held, 2 * DAY), NOW + 2 * DAY);
    assert.equal(await a.acknowledge(held), true);
    assert.equal(await b.acknowledge(held), false);

    // Twenty minutes on, the lapsing leases have lapsed: those with attempts
    // left are claimed again with a higher fence, and those on their last
    // attempt become dead letters ("lease expired") at the next call.
    clock.advance(20 * MINUTE);
    const lapsed = infos.filter((e) =>
      (e.id >> 2) % 20 === 8 && e.queue === "q1"
    );
    const leases1 = await b.claim({ queue: "q1", max: 10_000 });
    const retaken = new Map(
      leases1.filter((lease) => lapsed.some((e) => e.id === lease.eventId))
        .map((lease) => [lease.eventId, lease]),
    );
    assert.equal(retaken.size, lapsed.length);
    for (const event of lapsed) {
      const lease = retaken.get(event.id)!;
      assert.deepEqual(
        [lease.fence, lease.attempt, lease.lastError],
        [3, 3, "lease expired"],
      );
    }
    const history = (await a.explain(lapsed[0]!.id))!.history;
    assert.deepEqual(
      history.map((e) => `${e.kind}:${e.fence}`),
      ["claimed:1", "released:1", "claimed:2", "expired:2", "claimed:3"],
    );
    // The old holder's lease is stale now.
    assert.equal(
      await a.acknowledge(heldLease(before.get(lapsed[1]!.id)!)),
      false,
    );
    assert.ok((await b.acknowledge(leases1)).every((ok) => ok));
    const exhausted = infos.filter((e) => (e.id >> 2) % 20 === 9);
    for (const event of exhausted.slice(0, 8)) {
      const now = (await a.explain(event.id))!;
      assert.deepEqual(
        [now.state, now.lastError, now.history.at(-1)?.kind],
        ["dead", "lease expired", "dead"],
      );
    }

    // Dead letters redrive: q2's, with the expired ones and the cancelled.
    const dead2 = infos.filter((e) =>
      e.queue === "q2" && (e.state === "dead" || (e.id >> 2) % 20 === 9)
    );
    assert.equal(await a.redrive({ queue: "q2" }), dead2.length);
    assert.equal((await b.stats({ queue: "q2" })).dead, 0);
    const cancelled = dead2.find((e) => e.lastError === "cancelled")!;
    const redriven = (await b.explain(cancelled.id))!;
    assert.deepEqual(
      [redriven.state, redriven.attempt, redriven.history.at(-1)?.kind],
      ["pending", 0, "retried"],
    );

    // Cancel still turns pending events into dead letters.
    const delayed = infos.filter((e) =>
      (e.id >> 2) % 20 === 5 && e.queue === "q3"
    ).slice(0, 3).map((e) => e.id);
    assert.deepEqual(await b.cancel(delayed), delayed);

    // Purge: every done event and dead letter finished before the cutoff goes
    // (the older release's and none since), with its ledger and dedup key.
    const cutoff = NOW - 4 * DAY;
    const purged = [...before.values()].filter((e) =>
      e.doneAt !== null && e.doneAt < cutoff &&
      !(e.info.queue === "q2" && e.info.state === "dead")
    );
    assert.ok(purged.length > 20_000);
    assert.equal(
      await a.purge({ olderThanMs: clock.ms - cutoff }),
      purged.length,
    );
    const gone = purged.find((e) =>
      e.info.state === "done" && e.info.dedupKey !== null
    )!
      .info;
    assert.equal(await b.explain(gone.id), null);
    assert.equal(await reader.explain(gone.identity), null);
    assert.equal(
      (await a.enqueue("after purge", {
        queue: gone.queue,
        dedupKey: gone.dedupKey!,
      })).deduplicated,
      false,
    );
    const kept = [...before.values()].find((e) =>
      e.info.state === "done" && e.doneAt! >= cutoff && e.info.dedupKey !== null
    )!.info;
    assert.equal(
      (await b.enqueue("kept", { queue: kept.queue, dedupKey: kept.dedupKey! }))
        .eventId,
      kept.id,
    );
    const total = (await a.queues()).reduce(
      (sum, q) =>
        sum + q.pending + q.leased + q.done + q.dead,
      0,
    );
    // The two events enqueued since, less the purged.
    assert.equal(total, EVENTS + 2 - purged.length);
  });
}

Deno.test("postgres: a version 8 outbox holding keyed, last-attempt, lapsed, delayed, dead and done events upgrades to version 9; per-key FIFO, the per-key limit, renewals and lapsed last attempts hold on the leases it held, and claims after behave as before", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = new ManualClock(NOW);
  const options = { schema, now: clock.now, listen: false };
  await using db = await connectPostgres(server.url, { schema, listen: false });
  let ordered: Lease, concurrent: Lease, last: Lease, lapsing: Lease;
  let o2: number, c2: number, c3: number, delayed: number, dead: number;
  {
    await using old = await openPostgres(server.url, options);
    await old.setLimits("c", { perKey: 1 });
    // An ordering key's live lease and the event behind it.
    await old.enqueue("o1", { queue: "o", orderingKey: "k" });
    o2 = (await old.enqueue("o2", { queue: "o", orderingKey: "k" })).eventId;
    [ordered] = await old.claim({ queue: "o", max: 10, leaseMs: HOUR }) as [
      Lease,
    ];
    // A concurrency key's live lease (its limit 1), another of its events
    // and one of another key.
    await old.enqueue("c1", { queue: "c", concurrencyKey: "a" });
    c2 = (await old.enqueue("c2", { queue: "c", concurrencyKey: "a" }))
      .eventId;
    [concurrent] = await old.claim({ queue: "c", max: 1, leaseMs: HOUR }) as [
      Lease,
    ];
    c3 = (await old.enqueue("c3", { queue: "c", concurrencyKey: "b" }))
      .eventId;
    // A last attempt and a lease with attempts left, both to lapse.
    await old.enqueue("last", { queue: "l", maxAttempts: 1 });
    [last] = await old.claim({ queue: "l", max: 1, leaseMs: MINUTE }) as [
      Lease,
    ];
    await old.enqueue("lapsing", { queue: "r" });
    [lapsing] = await old.claim({ queue: "r", max: 1, leaseMs: MINUTE }) as [
      Lease,
    ];
    // Delayed, dead and done.
    delayed = (await old.enqueue("later", { queue: "p", delayMs: HOUR }))
      .eventId;
    dead = (await old.enqueue("dead", { queue: "p", maxAttempts: 1 }))
      .eventId;
    await old.enqueue("done", { queue: "p" });
    const [d, done] = await old.claim({ queue: "p", max: 2 }) as [Lease, Lease];
    assert.equal(d.eventId, dead);
    assert.equal(await old.release(d, { error: "boom" }), true);
    assert.equal(await old.acknowledge(done), true);
  }
  await asPostgresVersion8(db);
  const leasedBefore = await db.query(
    "SELECT id, due_at, lease_until FROM outbox_events WHERE state = 'leased' ORDER BY id",
  );
  assert.equal(leasedBefore.length, 4);
  assert.ok(leasedBefore.every((row) => row["due_at"] === row["lease_until"]));

  clock.advance(10 * MINUTE);
  await using outbox = await openPostgres(server.url, options);
  assert.deepEqual(
    (await db.query("SELECT version FROM outbox_schema ORDER BY version"))
      .map((row) => row["version"]),
    [8, 9],
  );
  const { wal: _, ...stats } = await outbox.stats({ queue: "p" });
  assert.deepEqual(stats, {
    pending: 1,
    leased: 0,
    done: 1,
    dead: 1,
    oldestPendingAgeMs: 10 * MINUTE,
  });
  // A lease's due time reads as its deadline, as before.
  const info = await outbox.explain(ordered.eventId);
  assert.equal(info?.state, "leased");
  assert.deepEqual(
    (await outbox.list({ state: "leased", queue: "o" })).map((e) => e.dueAt),
    [ordered.leaseUntil],
  );

  // The ordering key's live lease holds its next event back, renewed too.
  assert.deepEqual(await outbox.claim({ queue: "o", max: 10 }), []);
  assert.equal(await outbox.renew(ordered, 2 * HOUR), clock.ms + 2 * HOUR);
  assert.deepEqual(await outbox.claim({ queue: "o", max: 10 }), []);
  assert.equal(await outbox.acknowledge(ordered), true);
  assert.deepEqual(
    (await outbox.claim({ queue: "o", max: 10 })).map((l) => l.eventId),
    [o2],
  );

  // The per-key limit counts the lease version 8 took.
  assert.deepEqual(
    (await outbox.claim({ queue: "c", max: 10 })).map((l) => l.eventId),
    [c3],
  );
  assert.equal(await outbox.acknowledge(concurrent), true);
  assert.deepEqual(
    (await outbox.claim({ queue: "c", max: 10 })).map((l) => l.eventId),
    [c2],
  );

  // The lapsed last attempt is a dead letter; the lapsed lease with
  // attempts left is claimed again, its old holder's lease stale.
  const lastNow = (await outbox.explain(last.eventId))!;
  assert.deepEqual(
    [lastNow.state, lastNow.lastError, lastNow.history.at(-1)?.kind],
    ["dead", "lease expired", "dead"],
  );
  const [retaken] = await outbox.claim({ queue: "r", max: 10 });
  assert.deepEqual(
    [retaken?.eventId, retaken?.fence, retaken?.lastError],
    [lapsing.eventId, 2, "lease expired"],
  );
  assert.equal(await outbox.acknowledge(lapsing), false);

  // The delayed event waits for its time; the dead letter redrives.
  assert.deepEqual(await outbox.claim({ queue: "p", max: 10 }), []);
  assert.equal(await outbox.redrive({ queue: "p" }), 1);
  assert.deepEqual(
    (await outbox.claim({ queue: "p", max: 10 })).map((l) => l.eventId),
    [dead],
  );
  clock.advance(HOUR);
  assert.deepEqual(
    (await outbox.claim({ queue: "p", max: 10 })).map((l) => l.eventId),
    [delayed],
  );
});
