/**
 * The PostgreSQL dialect: how the core's statements are spelled on
 * PostgreSQL (13 or later). SQL text only, no I/O: `lease.ts` decides which
 * statement runs and with what, as it does on SQLite; each statement here
 * takes the same parameters, in the same order, as its SQLite twin.
 *
 * What differs from SQLite, and why:
 * - Transactions are `READ COMMITTED`, so claimers run side by side: the
 *   candidates of a claim are locked with `FOR UPDATE SKIP LOCKED`, so two
 *   claimers never wait for or take the same event, and a row locked by a
 *   call in flight (an acknowledgement, a release) is left to the next claim.
 * - The lapsed last-attempt leases a transaction first makes dead letters
 *   are locked in id order and waited for, not skipped: a call reading
 *   after that step (stats, dead letters, purge, explain) must see such a
 *   lease dead, as a serial order would, even while another transaction is
 *   making it so. In id order, two of these steps never deadlock.
 * - Every lease transition is still one conditional `UPDATE` whose `WHERE`
 *   carries the fence (id, token, fence, state, deadline): when it waits for
 *   a row lock, PostgreSQL re-checks that `WHERE` against the row as the
 *   other transaction left it, so a stale call changes nothing.
 * - The ledger entries an event row holds are written with
 *   `ON CONFLICT DO NOTHING` on a unique index of claims and
 *   acknowledgements per fence, and only while the transaction holds the
 *   event's row (`lockEvents`): two transactions writing one event's
 *   entries write them once, one after the other, and never wait for each
 *   other's entries while holding the row the other needs.
 * - A statement that locks several event rows and may wait for them takes
 *   them in one order, `outbox_events`' by id then `outbox_done`'s
 *   (`lockedRows`): acknowledgements, cancel, redrive and purge, whatever
 *   order the caller gave, so two of them never deadlock. A ledger entry is
 *   written only under the event's row lock (or a key-share lock), and
 *   purge locks its events before it deletes their entries: no entry
 *   outlives its purged event.
 * - JSON parameters are `jsonb`, read with `jsonb_each_text` and
 *   `jsonb_array_elements`.
 * - A payload is text (JSON, kept as written) or `bytea`, in two columns.
 *
 * @module
 */

import { CANCELLED, LEASE_EXPIRED, PURGE_BATCH } from "../admin.ts";
import type { Dialect } from "../types.ts";
import { claimGate, held, POSTGRES_FLOW, spend } from "./postgres_flow.ts";
import { failWith, SKIPPED_INSERT } from "../core/insert_or_find.ts";
import { POSTGRES_INBOX } from "./postgres_inbox.ts";
import {
  ALL_COLUMNS,
  POSTGRES_SCHEMA,
  POSTGRES_SCHEMA_VERSION,
} from "./postgres_schema.ts";

export { POSTGRES_SCHEMA_VERSION };

/**
 * The rows of `deleted` (event rows an acknowledgement took out of
 * `outbox_events`) into `outbox_done`, done at `now`: the insert that ends
 * an acknowledging statement. A done event's `due_at` is its last lease's
 * deadline, as when the claim wrote it there (version 8).
 */
const intoDone = (deleted: string, now: string) =>
  `INSERT INTO outbox_done (${ALL_COLUMNS})
    SELECT d.id, d.queue, 'done', d.payload, d.payload_bytes, d.dedup_key,
      d.ordering_key, coalesce(d.lease_until, d.due_at), d.lease_until, d.token, d.fence, d.attempt,
      d.max_attempts, d.last_error, d.created_at, ${now}, ${now},
      d.claimed_at, d.identity, d.priority, d.concurrency_key
    FROM ${deleted} AS d`;

// A lease's due time is its deadline: version 9's claim leaves `due_at`
// as it was (a HOT update) and keeps the deadline in `lease_until`.
const DUE_AT =
  "CASE WHEN state = 'leased' THEN lease_until ELSE due_at END AS due_at";
const EVENT_COLUMNS =
  `id, identity, queue, state, payload, payload_bytes, ordering_key, ${DUE_AT}, lease_until, token, fence, attempt, max_attempts, last_error, created_at, updated_at, done_at`;
const LIST_COLUMNS =
  `id, identity, queue, state, attempt, max_attempts, ${DUE_AT}, lease_until, last_error, created_at, updated_at, payload, payload_bytes, ordering_key, dedup_key`;
// The enqueue time of a page's cursor $3: that event's, or (gone) its
// nearest predecessor's by id.
const CURSOR_AT = `coalesce((SELECT created_at FROM outbox_all
      WHERE id <= $3 ORDER BY id DESC LIMIT 1), -9223372036854775808)`;
/**
 * The events in state `state` (a parameter) may be in: `outbox_done` for
 * done ones, `outbox_events` for the others, so a read of one state scans
 * one table (the other branch's one-time filter skips it).
 */
const inState = (state: string) =>
  `(SELECT ${ALL_COLUMNS} FROM outbox_events WHERE ${state} <> 'done'
    UNION ALL
    SELECT ${ALL_COLUMNS} FROM outbox_done WHERE ${state} = 'done') AS e`;
// The sequence of event ids, which an enqueue draws from before its keys'
// insert (the keys name the event).
const ID_SEQUENCE =
  "s AS MATERIALIZED (SELECT pg_get_serial_sequence('outbox_events', 'id')::regclass AS seq)";
// The elements of the JSON array $2 of an enqueue batch, in order, each
// with the id its event will have.
const BATCH = `d AS MATERIALIZED (SELECT e.value, e.n,
      nextval((SELECT seq FROM s)) AS id
    FROM json_array_elements($2::json) WITH ORDINALITY AS e (value, n)
    ORDER BY e.n)`;
// A claim changes no column an index names (schema version 9): `due_at`
// stays, and the markers stay null but for an event of an ordering or
// concurrency key (`keyed_lease`) or on its last attempt (`last_lease`).
const claimSet = (leaseUntil: string, now: string) =>
  `state = 'leased', fence = e.fence + 1,
      attempt = e.attempt + 1, lease_until = ${leaseUntil},
      updated_at = ${now}, claimed_at = ${now},
      keyed_lease = CASE WHEN e.ordering_key IS NOT NULL
        OR e.concurrency_key IS NOT NULL THEN true END,
      last_lease = CASE WHEN e.attempt + 1 >= e.max_attempts THEN true END,
      last_error = CASE e.state WHEN 'leased' THEN '${LEASE_EXPIRED}' ELSE e.last_error END`;
const CLAIM_SET = claimSet("$1", "$2");
const IDS = "SELECT value::bigint FROM jsonb_array_elements_text";
// An event row whose id is in the JSON array `p`: an index lookup per id
// in each table (an IN of the array was planned as a walk of a table when
// its rows were to be locked in id order, or read through a view).
const idIn = (p: string) => `id = ANY (ARRAY(${IDS}(${p}::jsonb)))`;
const PAYLOAD_BYTES =
  "coalesce(octet_length(payload), octet_length(payload_bytes), 0)";
const NOW = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/**
 * The ids of the event rows `where` selects (a condition on either table's
 * columns; `done`, when given, on `outbox_done`'s instead, null for none of
 * them), locked `mode` in one order: `outbox_events`' by id, then
 * `outbox_done`'s by id. Every statement that locks several event rows and
 * may wait for them takes them in this order, so two such statements never
 * each hold a row the other waits for (a deadlock the server breaks after
 * `deadlock_timeout`, a second; the write path reruns its victim, which can
 * meet another, until `busyTimeoutMs`). A row another transaction changed
 * meanwhile is locked as it is now and checked against `where` again.
 */
const lockedRows = (
  where: string,
  mode = "UPDATE",
  done: string | null = where,
) =>
  `SELECT id FROM (SELECT id FROM outbox_events WHERE ${where}
      ORDER BY id FOR ${mode}) AS locked_e${
    done === null ? "" : `
    UNION ALL
    SELECT id FROM (SELECT id FROM outbox_done WHERE ${done}
      ORDER BY id FOR ${mode}) AS locked_d`
  }`;

/**
 * Whether a candidate `e` of an ordering key may be claimed at `now`: no
 * earlier event of its key is pending or leased, and no event of its key
 * holds a live lease. Ids are given at insert, before commit, so an event
 * can commit after a later one of its key was claimed: without the second,
 * both would be in flight at once. `except`: the ids of leases the same
 * statement acknowledges, which the snapshot still shows leased.
 */
const claimableInOrder = (now: string, except = "") =>
  `(e.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM outbox_events AS p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key
          AND p.id < e.id AND p.done_at IS NULL
          AND p.state IN ('pending', 'leased')${except}
        UNION ALL SELECT 1 FROM outbox_events AS p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key
          AND p.keyed_lease AND p.done_at IS NULL
          AND p.state = 'leased' AND p.lease_until > ${now}${except}))`;

/**
 * Whether the candidate `c` (its columns `queue` and `ordering_key`) may be
 * taken: one without an ordering key, or one whose key no other claim is
 * taking an event of at this moment, which a claim's snapshot cannot see
 * yet. Applied to the candidates a claim chose, after its LIMIT, so it
 * locks no key it does not take. The lock (held to the end of the claim's
 * transaction) is per outbox table, by its oid, whatever search_path led
 * to it, and per key, the queue's length keeping "ab" + "c" apart from
 * "a" + "bc".
 */
const freeKey = (c: string) =>
  `(${c}.ordering_key IS NULL OR pg_try_advisory_xact_lock(
      'outbox_events'::regclass::oid::integer,
      hashtext(length(${c}.queue) || ':' || ${c}.queue || ${c}.ordering_key)))`;
// The largest integer a JavaScript number holds exactly (2^53 - 1).
const MAX_SAFE = "9007199254740991";
// The live leases of a candidate's concurrency key.
const HELD = held("$2");
// The clock of a one-statement call: $1, or the server's when $1 is null.
const CLOCK = `n AS MATERIALIZED (SELECT coalesce($1::bigint, ${NOW}) AS now)`;
// A lapsed last-attempt lease the core's transaction would first make a
// dead letter: a one-statement call leaves that to the general path. One
// row at most, the first, so the planner walks the partial index
// outbox_events_last_leases (version 9; outbox_events_last_attempt before): written as EXISTS (which drops ORDER BY and
// LIMIT), it was planned as a scan of the table for the first match once
// leases were in flight at the last ANALYZE (it guesses a ninth of them
// match: a comparison's default selectivity, twice), in every batch
// acknowledgement (7c9fba9; postgres_one_statement_test's plan test).
const EXHAUSTED_DUE = `(SELECT 1 FROM outbox_events
    WHERE last_lease AND done_at IS NULL
      AND state = 'leased' AND attempt >= max_attempts
      AND lease_until <= (SELECT now FROM n)
    ORDER BY id LIMIT 1)`;

// The leases of the CTE `l` (id, fence, token) that are current, their rows
// locked in id order (lockedRows: the planner may join in the array's
// order); none while a lapsed last-attempt lease waits to become a dead
// letter. That condition is evaluated once, before any row is locked: the
// general path's transaction locks such leases first and its own lease rows
// after, so locking lease rows and then finding such a lease would take
// locks in the opposite order (a deadlock with a stale acknowledgement
// falling back). The rows are looked up by id alone, as one array in the
// primary key, and locked before their fence, token and state are checked
// (against the versions locked): with the state among the conditions, the
// planner walked the claim index for the ids (PostgreSQL 18's skip scan,
// 89 to 161 descents for 256 leases) and joined, which cost a batch of 256
// about a third of the statement. A stale lease's row is locked too, until
// the statement refuses. OFFSET 0 keeps the checks out of the locking scan.
const MATCHED = `matched AS MATERIALIZED (SELECT m.id FROM (SELECT e.id,
        e.token, e.fence, e.state
      FROM outbox_events AS e
      WHERE e.id = ANY (ARRAY(SELECT id FROM l))
        AND ${EXHAUSTED_DUE} IS NULL
      ORDER BY e.id FOR UPDATE OF e OFFSET 0) AS m
    JOIN l ON m.id = l.id AND m.token = l.token AND m.fence = l.fence
    WHERE m.state = 'leased')`;
// Some lease of `l` is stale, or listed twice.
const INCOMPLETE =
  "(SELECT count(DISTINCT id) FROM matched) <> (SELECT count(*) FROM l)";

/** The leases given as the JSON array `$n` of [event id, fence, token]. */
const leasesOf = (n: number) =>
  `SELECT (a.v ->> 0)::bigint AS id, (a.v ->> 1)::bigint AS fence,
      a.v ->> 2 AS token
    FROM jsonb_array_elements($${n}::jsonb) AS a (v)`;

/**
 * The fenced acknowledgement of the leases `leases` selects (id, fence,
 * token) in one statement, all or none: when every lease is current and no
 * lapsed last-attempt lease waits to become a dead letter, they become
 * done; otherwise (a stale lease, or one listed twice) nothing changes.
 * Answers `now` and `acknowledged`, the count.
 */
function acknowledgeInOne(leases: string): string {
  return `WITH ${CLOCK},
  l AS MATERIALIZED (${leases}),
  ${MATCHED},
  acked AS (DELETE FROM outbox_events AS e
    WHERE e.id = ANY (ARRAY(SELECT id FROM matched)) AND NOT ${INCOMPLETE}
    RETURNING e.*),
  moved AS (${intoDone("acked", "(SELECT now FROM n)")} RETURNING id)
  SELECT n.now, (SELECT count(*) FROM moved)::integer AS acknowledged FROM n`;
}

/**
 * The claim as one statement: see `claimInOne` below. With `acknowledge`
 * (a query of the leases' id, fence and token), the statement first
 * acknowledges those leases, all or none, and refuses when it cannot.
 */
function claimInOne(acknowledge?: string): string {
  const acknowledged = acknowledge === undefined ? "" : `
  l AS MATERIALIZED (${acknowledge}),
  ${MATCHED},`;
  // The leases the statement acknowledges, which its snapshot still shows
  // leased.
  const except = (p: string) =>
    acknowledge === undefined ? "" : `
          AND ${p}.id NOT IN (SELECT id FROM matched)`;
  const now = "(SELECT now FROM n)";
  const perKey = "(SELECT per_key FROM g)";
  // What makes an event of the queue a candidate, but its state and due
  // time.
  const eligible = `${claimableInOrder(now, except("p"))}
      AND (e.concurrency_key IS NULL OR ${perKey} IS NULL
        OR ${held(now, except("k"))} < ${perKey})`;
  // A lapsed lease the claim would take in its deadline's order (the
  // general path's takeover): one due before the batch's last candidate
  // (its index entry, at the due time it was claimed at, is no later), or
  // any when the batch is short. Read from the part of the ready index the
  // candidates' scan walked, so a lapsed lease behind the batch costs a
  // claim no sort of the backlog and no refusal.
  const lapsedIn = (range: string) => `
    UNION ALL (SELECT 1 FROM outbox_events AS e
      WHERE e.queue = $2 AND e.done_at IS NULL AND ${range}
        AND e.state = 'leased' AND e.lease_until <= ${now} AND ${eligible}
      LIMIT 1)`;
  const lapsed = lapsedIn(`e.due_at <= ${now}
        AND NOT coalesce((SELECT filled FROM last), false)`) +
    lapsedIn(`e.priority > (SELECT priority FROM last)
        AND e.due_at <= ${now} AND (SELECT filled FROM last)`) +
    lapsedIn(`e.priority = (SELECT priority FROM last)
        AND (e.due_at, e.id) < ((SELECT due_at FROM last), (SELECT id FROM last))
        AND (e.lease_until, e.id)
          < ((SELECT due_at FROM last), (SELECT id FROM last))`);
  // The LIMIT is computed before the scan locks a row, so the queue's row
  // lock (which may wait) and, before it, the leases' (likewise; in the
  // order the general path takes them: its acknowledgement, then its
  // claim) are all taken before the candidates', which never wait (SKIP
  // LOCKED). Taken while holding candidates, they let two such statements
  // wait for each other when each one's lapsed lease was the other's
  // candidate (a deadlock PostgreSQL broke after a second).
  //
  // The per-key limit: a candidate whose key's live leases (the held
  // column, counted in the snapshot, which `moved` vouches for) and the
  // batch's earlier leases of it (r) reach the limit is passed over; when
  // that leaves the batch short, the statement refuses, and the general
  // path's next round claims others in place of those.
  return `WITH ${CLOCK},${acknowledged}
  ${
    claimGate(
      acknowledge === undefined ? "" : `
      AND (SELECT count(*) FROM matched) >= 0`,
    )
  },
  candidates AS MATERIALIZED (
    SELECT e.id, e.state, e.fence, e.due_at, ${PAYLOAD_BYTES} AS bytes,
      e.queue, e.ordering_key, e.priority, e.concurrency_key,
      CASE WHEN e.concurrency_key IS NOT NULL AND ${perKey} IS NOT NULL
        THEN ${held(now, except("k"))} END AS held
    FROM outbox_events AS e
    WHERE e.queue = $2 AND e.done_at IS NULL AND e.due_at <= ${now}
      AND e.state = 'pending' AND ${eligible}
    ORDER BY e.priority DESC, e.due_at, e.id LIMIT (SELECT allowed FROM g)
    FOR UPDATE OF e SKIP LOCKED),
  last AS MATERIALIZED (SELECT priority, due_at, id,
      (SELECT count(*) FROM candidates) >= (SELECT allowed FROM g) AS filled
    FROM candidates ORDER BY priority, due_at DESC, id DESC LIMIT 1),
  t AS MATERIALIZED (SELECT decode($6, 'hex') AS bytes),
  free AS MATERIALIZED (SELECT c.*, row_number() OVER (
        PARTITION BY c.concurrency_key
        ORDER BY c.priority DESC, c.due_at, c.id) AS r
    FROM candidates AS c WHERE ${freeKey("c")}),
  numbered AS MATERIALIZED (SELECT f.*,
      row_number() OVER (ORDER BY f.priority DESC, f.due_at, f.id) AS k
    FROM free AS f WHERE f.held IS NULL OR f.held + f.r <= ${perKey}),
  refused AS MATERIALIZED (SELECT 1 FROM free
    WHERE state = 'leased' OR bytes > $4 OR id > ${MAX_SAFE}
      OR fence >= ${MAX_SAFE}
    UNION ALL ${EXHAUSTED_DUE}${lapsed}
    UNION ALL SELECT 1 FROM g WHERE moved
    UNION ALL SELECT 1 WHERE (SELECT count(*) FROM numbered) < $3
      AND (SELECT count(*) FROM numbered) < (SELECT count(*) FROM free)${
    acknowledge === undefined ? "" : `
    UNION ALL SELECT 1 WHERE ${INCOMPLETE}`
  }
    LIMIT 1),${
    acknowledge === undefined ? "" : `
  acked AS (DELETE FROM outbox_events AS e
    WHERE e.id = ANY (ARRAY(SELECT id FROM matched))
      AND NOT EXISTS (SELECT 1 FROM refused)
    RETURNING e.*),
  moved AS (${intoDone("acked", "(SELECT now FROM n)")}),`
  }
  spent AS (${
    spend(
      "(SELECT count(*) FROM numbered)",
      "EXISTS (SELECT 1 FROM numbered) AND NOT EXISTS (SELECT 1 FROM refused)",
    )
  }),
  claimed AS (UPDATE outbox_events AS e
    SET ${claimSet("n.now + $5", "n.now")},
      token = encode(substring(t.bytes FROM c.k::integer * 16 - 15 FOR 16), 'hex')
    FROM numbered AS c, n, t
    WHERE e.id = c.id AND e.id = ANY (ARRAY(SELECT id FROM numbered ORDER BY id))
      AND NOT EXISTS (SELECT 1 FROM refused)
    RETURNING c.k, e.id, e.identity, e.fence, e.attempt, e.max_attempts,
      e.lease_until, e.token, e.payload, e.payload_bytes, e.ordering_key,
      e.last_error)
  SELECT n.now, (EXISTS (SELECT 1 FROM refused))::integer AS refused, c.*
  FROM n LEFT JOIN claimed AS c ON true
  WHERE c.payload IS NULL OR c.payload::json IS NOT NULL
  ORDER BY c.k`;
}

/**
 * An expression that fails the statement with `SKIPPED_INSERT` when it is
 * evaluated (`failWith`). An enqueue's statement evaluates it when a key it
 * inserted has no event, as when a `BEFORE INSERT` trigger on
 * `outbox_events` returned NULL: the statement fails, its keys with it, and
 * the call with a `ConstraintError` (`insertOrFind`), instead of a key left
 * to dedup later calls to an event never stored.
 */
const skippedInsert = (at: string) => failWith(SKIPPED_INSERT, at);

/**
 * The rows a batch's events insert `e` returned, and none but a failure
 * (`skippedInsert`) when fewer than the keys `k` inserted.
 */
const INSERTED = `SELECT id, identity, queue, dedup_key FROM e
  UNION ALL SELECT ${skippedInsert("c.n")}, NULL, NULL, NULL
    FROM (SELECT count(*) AS n FROM k) AS c
    WHERE c.n <> (SELECT count(*) FROM e)`;

/**
 * The order a batch inserts its keys rows in, of the CTE `d`'s elements:
 * by queue and dedup key, and those without one by identity, the elements
 * of one key in array order (`d.n`), so a later one meets an earlier one's
 * key. The rows' entries in the unique indexes of `outbox_keys` are the
 * locks two batches holding the same keys wait on, until commit: taken in
 * array order, two batches with keys in opposite orders each held one the
 * other waited for, a deadlock the server broke after `deadlock_timeout`
 * (a second) and the write path reran. Taken in this one order (text by
 * bytes, `COLLATE "C"`: the database's collation compares slower), two
 * batches sharing dedup keys, or identities without dedup keys, never wait
 * for each other both ways; rows that share an identity but not a dedup
 * key with another batch's can still meet out of order, and such a
 * deadlock is rerun as before. When `sorted` is false the order is the
 * array's.
 */
const keyOrder = (
  queue: string,
  dedupKey: string,
  identity: string,
  sorted = "true",
) =>
  `ORDER BY CASE WHEN ${sorted} THEN ${queue} END COLLATE "C",
      CASE WHEN ${sorted} THEN ${dedupKey} END COLLATE "C",
      CASE WHEN ${sorted} AND ${dedupKey} IS NULL THEN ${identity} END,
      d.n`;

/**
 * The enqueue of a batch whose events differ only in payload and identity
 * ($2: a JSON array of [payload, identity]; $3 queue, $4 delay, $5
 * max_attempts): the keys go in with ON CONFLICT DO NOTHING, in `keyOrder`
 * (by identity), and only the events whose keys went in follow.
 */
const ALIKE = `WITH ${CLOCK}, ${ID_SEQUENCE}, ${BATCH},
  k AS (INSERT INTO outbox_keys (identity, event_id, queue, dedup_key)
    SELECT (d.value ->> 1)::uuid, d.id, $3::text, NULL
    FROM d
    ${keyOrder("$3::text", "NULL::text", "(d.value ->> 1)::uuid")}
    ON CONFLICT DO NOTHING
    RETURNING event_id),
  e AS (INSERT INTO outbox_events
    (id, queue, state, payload, dedup_key, ordering_key, due_at,
      max_attempts, created_at, updated_at, identity)
    SELECT d.id, $3::text, 'pending', d.value ->> 0, NULL, NULL,
      (SELECT now FROM n) + $4::bigint, $5::integer, (SELECT now FROM n),
      (SELECT now FROM n), (d.value ->> 1)::uuid
    FROM d WHERE d.id IN (SELECT event_id FROM k)
    ORDER BY d.n
    RETURNING id, identity, queue, dedup_key)
  ${INSERTED}`;

/**
 * `ALIKE` when the outbox minted every identity, which no other batch
 * holds ($2: the payloads' JSON texts as one JSON array, each element as
 * written; $6: the identities, a `uuid[]` in the same order). No conflict
 * to check for (the keys' primary key still refuses a repeat): the events
 * go in first, their ids from the column's default in array order, and
 * their keys from what that insert returned. One row, `ids`: the ids,
 * ascending (so in array order), comma-separated.
 *
 * Why this shape (bench/README.md, "Batch enqueue"): an element of `json`
 * is its text as written, so no payload is escaped as a JSON string by the
 * client and unescaped by `->>` (which parses the element again) on the
 * server, and each identity is parsed once; one row back instead of 256.
 * Fewer events than elements (a trigger skipped some) fail it
 * (`skippedInsert`).
 */
const MINTED = `WITH ${CLOCK},
  e AS (INSERT INTO outbox_events
    (queue, state, payload, due_at, max_attempts, created_at, updated_at,
      identity)
    SELECT $3::text, 'pending', d.payload::text,
      (SELECT now FROM n) + $4::bigint, $5::integer, (SELECT now FROM n),
      (SELECT now FROM n), d.identity
    FROM ROWS FROM (json_array_elements($2::json), unnest($6::uuid[]))
      WITH ORDINALITY AS d (payload, identity, n)
    ORDER BY d.n
    RETURNING id, identity, queue),
  k AS (INSERT INTO outbox_keys (identity, event_id, queue)
    SELECT identity, id, queue FROM e)
  SELECT CASE WHEN count(*) = cardinality($6::uuid[])
      THEN string_agg(id::text, ',' ORDER BY id)
      ELSE ${skippedInsert("count(*)")}::text END AS ids
  FROM e`;

/** The statements of the core on PostgreSQL. */
export const POSTGRES = {
  // Whatever the database's default_transaction_isolation: at REPEATABLE
  // READ an opener's snapshot predates its wait for the set-up lock, and it
  // ran the upgrade a second time; claims there fail to serialize.
  begin: "BEGIN ISOLATION LEVEL READ COMMITTED",
  commit: "COMMIT",
  rollback: "ROLLBACK",
  savepoint: "SAVEPOINT acknowledge",
  releaseSavepoint: "RELEASE SAVEPOINT acknowledge",
  rollbackToSavepoint: "ROLLBACK TO SAVEPOINT acknowledge",
  // Inside the application's own transaction on this connection.
  joinSavepoint: "SAVEPOINT outbox",
  releaseJoin: "RELEASE SAVEPOINT outbox",
  rollbackJoin: "ROLLBACK TO SAVEPOINT outbox",
  // One outbox opening at a time per schema creates or upgrades it. The
  // others wait for it however long an upgrade takes (rewriting a big
  // table, version 5), not busyTimeoutMs (the lock_timeout) nor
  // statementTimeoutMs nor a transaction_timeout (PostgreSQL 17 and later;
  // current_setting(…, true) is NULL before). The set-up then runs without
  // them, so a rewrite is not cut off, but its waits for table locks (which
  // an older release's process, a dump or a report may hold) stay bounded:
  // by the lock_timeout it had, or when that is 0 (none), by the statement
  // timeout it had, both kept in placeholder settings.
  lock: [
    `SELECT set_config('leased_outbox.lock_timeout', current_setting('lock_timeout'), true),
      set_config('leased_outbox.statement_timeout', current_setting('statement_timeout'), true)`,
    "SET LOCAL statement_timeout = 0",
    "SET LOCAL lock_timeout = 0",
    `SELECT set_config('transaction_timeout', '0', true)
      WHERE current_setting('transaction_timeout', true) IS NOT NULL`,
    "SELECT pg_advisory_xact_lock(hashtext('leased_outbox:' || current_schema()))",
    `SELECT set_config('lock_timeout',
      CASE current_setting('leased_outbox.lock_timeout') WHEN '0'
        THEN current_setting('leased_outbox.statement_timeout')
        ELSE current_setting('leased_outbox.lock_timeout') END, true)`,
  ],
  setup: POSTGRES_SCHEMA,
  schemaPresent: `SELECT to_regclass('outbox_schema') IS NOT NULL AS present,
    to_regclass('outbox_events') IS NOT NULL AS events`,
  schemaVersion: "SELECT max(version) AS version FROM outbox_schema",
  // One snapshot for all of a reader's reads, which write nothing.
  readBegin: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
  outboxPresent:
    "SELECT 1 AS present WHERE to_regclass('outbox_events') IS NOT NULL",
  acknowledgedSince: `SELECT queue, count(*) AS n FROM outbox_done
    WHERE done_at >= $1 GROUP BY queue`,
  activity:
    `SELECT (at / $2::bigint) * $2::bigint AS at, sum(done)::integer AS done,
      sum(failed)::integer AS failed
    FROM (SELECT done_at AS at, 1 AS done, 0 AS failed FROM outbox_done
        WHERE done_at >= $1
      UNION ALL
      SELECT at, 0, 1 FROM outbox_attempts WHERE at >= $1
        AND (kind = 'expired' OR kind = 'released' AND detail IS NOT NULL)) AS a
    GROUP BY 1 ORDER BY 1`,
  // $1 NULL: any queue holding key $2 (the dedup index leads with the
  // queue: a scan).
  dedupKeyEventAnyQueue: `SELECT event_id AS id FROM outbox_keys
    WHERE $1::text IS NULL AND dedup_key = $2 ORDER BY queue LIMIT 1`,
  dedupKeyEvent:
    "SELECT event_id AS id FROM outbox_keys WHERE queue = $1 AND dedup_key = $2",
  version: POSTGRES_SCHEMA_VERSION,
  now: `SELECT ${NOW} AS now`,
  nowExhausted: `SELECT n.now, e.id, e.fence
    FROM (SELECT ${NOW} AS now) AS n
    LEFT JOIN LATERAL (SELECT id, fence FROM outbox_events
      WHERE last_lease AND done_at IS NULL AND state = 'leased'
        AND attempt >= max_attempts AND lease_until <= n.now
      ORDER BY id FOR UPDATE) AS e ON true`,
  // The event's keys first (its identity and dedup key, whose unique
  // indexes are the dedup's lock, also after the event is done), then the
  // event, only when its keys went in; a key without its event fails it
  // (skippedInsert).
  insert: `WITH ${ID_SEQUENCE},
  k AS (INSERT INTO outbox_keys (identity, event_id, queue, dedup_key)
    SELECT $9::uuid, nextval(s.seq), $1::text, $3::text FROM s
    ON CONFLICT DO NOTHING
    RETURNING event_id),
  e AS (INSERT INTO outbox_events
    (id, queue, state, payload, payload_bytes, dedup_key, ordering_key,
      due_at, max_attempts, created_at, updated_at, identity, priority,
      concurrency_key)
    SELECT k.event_id, $1::text, 'pending', $2::text, $10::bytea, $3::text,
      $4::text, $5::bigint, $6::integer, $7::bigint, $8::bigint, $9::uuid,
      $11::integer, $12::text
    FROM k
    RETURNING id)
  SELECT CASE WHEN e.id IS NULL THEN ${skippedInsert("k.event_id")}
      ELSE e.id END AS id
  FROM k LEFT JOIN e ON true`,
  existing: `SELECT event_id AS id, identity FROM outbox_keys
    WHERE (queue = $1 AND dedup_key = $2) OR identity = $3
    ORDER BY dedup_key IS DISTINCT FROM $2 LIMIT 1`,
  // Each element's keys in keyOrder, so a later element meets an earlier
  // one's, then the events whose keys went in (ids in array order). While
  // the batch repeats an identity, whose elements may hold different dedup
  // keys, the keys go in array order: sorting could let a later one win.
  insertAll: `WITH ${CLOCK}, ${ID_SEQUENCE}, ${BATCH},
  u AS MATERIALIZED (SELECT
      count(DISTINCT (d.value ->> 7)::uuid) = count(*) AS sorted
    FROM d),
  k AS (INSERT INTO outbox_keys (identity, event_id, queue, dedup_key)
    SELECT (d.value ->> 7)::uuid, d.id, d.value ->> 0, d.value ->> 3
    FROM d, u
    ${
    keyOrder(
      "d.value ->> 0",
      "d.value ->> 3",
      "(d.value ->> 7)::uuid",
      "u.sorted",
    )
  }
    ON CONFLICT DO NOTHING
    RETURNING event_id),
  e AS (INSERT INTO outbox_events
    (id, queue, state, payload, payload_bytes, dedup_key, ordering_key,
      due_at, max_attempts, created_at, updated_at, identity, priority,
      concurrency_key)
    SELECT d.id, d.value ->> 0, 'pending', d.value ->> 1,
      decode(d.value ->> 2, 'hex'), d.value ->> 3, d.value ->> 4,
      (SELECT now FROM n) + (d.value ->> 5)::bigint,
      (d.value ->> 6)::integer, (SELECT now FROM n), (SELECT now FROM n),
      (d.value ->> 7)::uuid, (d.value ->> 8)::integer,
      d.value ->> 9
    FROM d WHERE d.id IN (SELECT event_id FROM k)
    ORDER BY d.n
    RETURNING id, identity, queue, dedup_key)
  ${INSERTED}`,
  insertAlike: ALIKE,
  insertMinted: MINTED,
  // The batch statements above run outside a transaction too, on the
  // server's clock when $1 is null.
  insertAllInOne: true,
  existingAll: `SELECT d.n - 1 AS n, e.id, e.identity
    FROM json_array_elements($1::json) WITH ORDINALITY AS d (value, n)
    JOIN LATERAL (SELECT event_id AS id, identity FROM outbox_keys
      WHERE (queue = d.value ->> 0 AND dedup_key = d.value ->> 1)
          OR identity = (d.value ->> 2)::uuid
      ORDER BY dedup_key IS DISTINCT FROM d.value ->> 1 LIMIT 1) AS e ON true`,
  exhausted: `SELECT id, fence FROM outbox_events
    WHERE last_lease AND done_at IS NULL AND state = 'leased'
      AND attempt >= max_attempts AND lease_until <= $1
    ORDER BY id FOR UPDATE`,
  // The dead letter's due time and end are its lease's deadline.
  expire: `UPDATE outbox_events
    SET state = 'dead', lease_until = NULL, token = NULL,
      last_error = '${LEASE_EXPIRED}', updated_at = $1,
      done_at = lease_until, due_at = lease_until
    WHERE id IN (${IDS}($2::jsonb))`,
  // Only a payload within $4 bytes is read; a bigger one's size says why
  // the event is unclaimable.
  // $5: the queue's per-key limit or null, as on SQLite.
  // A lapsed lease is due at its deadline (lease_until), which the ready
  // index does not hold (version 9): the due events are sorted, not read in
  // the index's order. The one-statement claim reads them in that order and
  // refuses when a lapsed lease is among its candidates, which the same
  // candidates in the deadline's order would not always hold.
  candidates: `SELECT c.id, c.identity, c.state, c.fence, c.attempt,
      c.max_attempts, c.payload, c.payload_bytes, c.bytes, c.ordering_key,
      c.last_error, c.concurrency_key, c.held
    FROM (SELECT id, identity, state, fence, attempt, max_attempts,
        CASE WHEN ${PAYLOAD_BYTES} <= $4 THEN payload END AS payload,
        CASE WHEN ${PAYLOAD_BYTES} <= $4 THEN payload_bytes END AS payload_bytes,
        ${PAYLOAD_BYTES} AS bytes, queue, ordering_key, last_error,
        CASE WHEN state = 'leased' THEN lease_until ELSE due_at END AS due,
        priority, concurrency_key,
        CASE WHEN concurrency_key IS NOT NULL AND $5::integer IS NOT NULL
          THEN ${HELD} END AS held
      FROM outbox_events AS e
      WHERE queue = $1 AND done_at IS NULL AND due_at <= $2
        AND (state = 'pending' OR state = 'leased' AND lease_until <= $2)
        AND ${claimableInOrder("$2")}
        AND (concurrency_key IS NULL OR $5::integer IS NULL
          OR ${HELD} < $5::integer)
      ORDER BY priority DESC,
        CASE WHEN state = 'leased' THEN lease_until ELSE due_at END, id
      LIMIT $3
      FOR UPDATE OF e SKIP LOCKED) AS c
    WHERE ${freeKey("c")}
    ORDER BY c.priority DESC, c.due, c.id`,
  // $1 now or null (the server's clock), $2 queue, $3 max, $4 the largest
  // payload in bytes, $5 leaseMs, $6 one 32-character token per lease, in
  // claim order. Refuses (claims nothing) when a candidate is a lapsed
  // lease to take over, is unclaimable by size or is past 2^53, or when a
  // lapsed last-attempt lease waits to become a dead letter: the ledger
  // entries those need are the general path's. Flow control as the general
  // path's gate (core/flow.ts) applies it, after the queue's row is locked
  // (claimGate in dialects/postgres_flow.ts); refuses when the per-key limit
  // left a batch short, or when a claim of the queue committed after the
  // statement's snapshot, whose leases that snapshot cannot count. The cast in the last WHERE
  // makes the server refuse the whole statement (refusedInOne) when a
  // claimed text payload is not JSON. The `= ANY` repeats the join, so the
  // rows are looked up by id rather than the table scanned, whatever the
  // planner guesses of the batch's size. Its ids are sorted: looking the
  // rows up one by one, the server sorts the array at each lookup, which
  // cost a claim of 256 a tenth of its time in arbitrary order (an array
  // already in order sorts in one pass). The tokens are
  // cut from $6 decoded to bytes once: substr on text counts characters
  // from the start in a UTF-8 database, which cost a claim of 256 about
  // 6 ms (bench/README.md).
  claimInOne: claimInOne(),
  // The same, after the fenced acknowledgement of $7 (a JSON array of
  // [event id, fence, token]) in the same statement, all or none: a stale
  // lease (or one listed twice) refuses the whole statement, as does
  // whatever refuses the claim. A lapsed lease to acknowledge is a
  // candidate of the claim too (a leased one), which refuses.
  acknowledgeAndClaimInOne: claimInOne(leasesOf(7)),
  // The server's JSON parser refusing a payload, or its nesting too deep;
  // a serialization failure or deadlock (at a default isolation of
  // repeatable read or serializable, a concurrent update of a row the
  // statement locks fails it).
  refusedInOne: ["22P02", "54001", "40001", "40P01"],
  // A deadlock's victim; a serialization failure (at the session's
  // default isolation, for a statement outside the outbox's transactions).
  rerun: ["40P01", "40001"],
  // Any statement's error leaves the transaction failed (status E).
  errorFailsTransaction: true,
  tokenUsed:
    "SELECT 1 FROM outbox_ledger WHERE event_id = $1 AND kind = 'claimed' AND token = $2",
  claim: `UPDATE outbox_events AS e SET ${CLAIM_SET}, token = c.value
    FROM jsonb_each_text($3::jsonb) AS c
    WHERE e.id = c.key::bigint`,
  claimOne:
    `UPDATE outbox_events AS e SET ${CLAIM_SET}, token = $4 WHERE e.id = $3`,
  ledger:
    `INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until, detail)
    VALUES ($1, $2, $3, $4, $5, $6, $7)`,
  lockEvents: lockedRows(idIn("$1")),
  // Only for events whose row it holds, or holds a key-share lock on after
  // waiting for a purge in flight (which then leaves none): an entry
  // written for an event a purge deletes after its ledger outlives it.
  writeUnwritten: `WITH k AS MATERIALIZED (${
    lockedRows(idIn("$1"), "KEY SHARE")
  })
  INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until, detail)
    SELECT event_id, fence, kind, at, token, lease_until, detail
    FROM outbox_unwritten_attempts
    WHERE event_id = ANY (ARRAY(SELECT id FROM k))
    ORDER BY event_id, n
    ON CONFLICT (event_id, fence, kind)
      WHERE kind IN ('claimed', 'acknowledged') DO NOTHING`,
  ledgerAll:
    `INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until, detail)
    SELECT (l.value ->> 0)::bigint, (l.value ->> 1)::bigint, l.value ->> 2,
      $1::bigint,
      l.value ->> 3, (l.value ->> 4)::bigint, l.value ->> 5
    FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS l (value, n)
    WHERE EXISTS (SELECT 1 FROM outbox_all
      WHERE id = (l.value ->> 0)::bigint)
    ORDER BY l.n`,
  // The acknowledged event leaves outbox_events for outbox_done.
  acknowledge: `WITH acked AS (DELETE FROM outbox_events
    WHERE id = $2 AND token = $3 AND fence = $4 AND state = 'leased'
    RETURNING *)
  ${intoDone("acked", "$1::bigint")}`,
  // $1 now or null (the server's clock), $2 event id, $3 token, $4 fence.
  acknowledgeInOne: acknowledgeInOne(
    "SELECT $2::bigint AS id, $4::bigint AS fence, $3::text AS token",
  ),
  // $1 now or null, $2 a JSON array of [event id, fence, token].
  acknowledgeAllInOne: acknowledgeInOne(leasesOf(2)),
  // The current leases locked in id order first (lockedRows).
  acknowledgeAll: `WITH l AS MATERIALIZED (SELECT e.id FROM outbox_events AS e
      JOIN jsonb_each_text($2::jsonb) AS a ON e.id = a.key::bigint
      WHERE a.value = e.fence || ':' || e.token AND e.state = 'leased'
      ORDER BY e.id FOR UPDATE OF e),
  acked AS (DELETE FROM outbox_events AS e
    WHERE e.id IN (SELECT id FROM l) AND e.state = 'leased'
    RETURNING e.*)
  ${intoDone("acked", "$1::bigint")}`,
  // Changes no indexed column: a HOT update (version 9).
  renew: `UPDATE outbox_events
    SET lease_until = greatest(lease_until, $1), updated_at = $2
    WHERE id = $3 AND token = $4 AND fence = $5 AND state = 'leased'
      AND lease_until > $2
    RETURNING lease_until`,
  // $8: 1 takes the claim's attempt back (a lease whose work never began).
  release: `UPDATE outbox_events
    SET state = CASE WHEN $7::int = 1 OR attempt - $8::int >= max_attempts
        THEN 'dead' ELSE 'pending' END,
      done_at = CASE WHEN $7::int = 1 OR attempt - $8::int >= max_attempts
        THEN $1::bigint END,
      attempt = attempt - $8::int, token = NULL, lease_until = NULL, due_at = $2, updated_at = $1,
      last_error = coalesce($3, last_error), keyed_lease = NULL,
      last_lease = NULL
    WHERE id = $4 AND token = $5 AND fence = $6 AND state = 'leased'
    RETURNING state`,
  // Under a key-share lock on the event's row (writeUnwritten's reason).
  stale: `INSERT INTO outbox_attempts (event_id, fence, kind, at, token)
    SELECT id, $2::bigint, $3::text, $4::bigint, $5::text
    FROM (${lockedRows("id = $1", "KEY SHARE")}) AS e`,
  deadLetters:
    `SELECT id, identity, queue, payload, payload_bytes, attempt, last_error, created_at, done_at
    FROM outbox_events WHERE state = 'dead' AND queue = $1 ORDER BY id LIMIT $2`,
  unclaimable: `UPDATE outbox_events
    SET state = 'dead', done_at = $1, updated_at = $1, lease_until = NULL,
      token = NULL, last_error = $2
    WHERE id = $3`,
  list: `SELECT ${LIST_COLUMNS}
    FROM ${inState("$1::text")}
    WHERE state = $1 AND ($2::text IS NULL OR queue = $2) AND id > $3
    ORDER BY id LIMIT $4`,
  // The dashboard's pages by (created_at, id), as on SQLite: $3 the last
  // event of the previous page. An index seek each once an index of
  // (queue, state, created_at, id) exists; until then a scan.
  listEnqueuedInQueue: `SELECT ${LIST_COLUMNS} FROM ${inState("$1::text")}
    WHERE queue = $2 AND state = $1 AND (created_at, id) > (${CURSOR_AT}, $3)
    ORDER BY created_at, id LIMIT $4`,
  listEnqueued: `SELECT ${LIST_COLUMNS} FROM ${inState("$1::text")}
    WHERE $2::text IS NULL AND state = $1
      AND (created_at, id) > (${CURSOR_AT}, $3)
    ORDER BY created_at, id LIMIT $4`,
  // The events locked in id order first (lockedRows), as below.
  cancel: `WITH l AS MATERIALIZED (${
    lockedRows(
      `${idIn("$2")} AND state = 'pending'`,
      "UPDATE",
      null,
    )
  })
  UPDATE outbox_events AS e
    SET state = 'dead', done_at = $1, updated_at = $1,
      last_error = '${CANCELLED}'
    FROM l WHERE e.id = l.id AND e.state = 'pending'
    RETURNING e.id, e.fence`,
  redrive: `WITH l AS MATERIALIZED (${
    lockedRows(
      `state = 'dead' AND ($2::text IS NULL OR queue = $2)
        AND ($3::jsonb IS NULL OR id IN (${IDS}($3::jsonb)))`,
      "UPDATE",
      null,
    )
  })
  UPDATE outbox_events AS e
    SET state = 'pending', attempt = 0, due_at = $1, updated_at = $1,
      done_at = NULL, keyed_lease = NULL, last_lease = NULL
    FROM l WHERE e.id = l.id AND e.state = 'dead'
    RETURNING e.id, e.fence`,
  // A batch of candidates, then those still purgeable locked in id order
  // (lockedRows): purge deletes only these, so it neither deletes an event
  // a redrive made pending since, nor deletes its ledger before a call
  // holding its row wrote there. ORDER BY id in the first step would walk
  // the primary key of outbox_done instead of its BRIN index; the `= ANY`
  // makes the locks look the batch up by id (an IN was planned as a walk
  // of either table, the whole of it when nothing was purgeable). A row of
  // outbox_done never changes: only its id is checked again.
  purgeable: `WITH c AS MATERIALIZED (SELECT id FROM ${inState("$1::text")}
      WHERE state = $1 AND done_at < $2 LIMIT ${PURGE_BATCH})
  ${
    lockedRows(
      `id = ANY (ARRAY(SELECT id FROM c)) AND state = $1::text
        AND done_at < $2::bigint`,
      "UPDATE",
      "id = ANY (ARRAY(SELECT id FROM c))",
    )
  }`,
  purgeLedger:
    `DELETE FROM outbox_attempts WHERE event_id IN (${IDS}($1::jsonb))`,
  // The events (in either table) and their keys; answers a row per event.
  purge: `WITH e AS (DELETE FROM outbox_events
      WHERE id IN (${IDS}($1::jsonb)) RETURNING identity),
    f AS (DELETE FROM outbox_done
      WHERE id IN (${IDS}($1::jsonb)) RETURNING identity),
    k AS (DELETE FROM outbox_keys
      WHERE identity IN (SELECT identity FROM e
        UNION ALL SELECT identity FROM f))
    SELECT 1 FROM e UNION ALL SELECT 1 FROM f`,
  queues: `SELECT queue, state, count(*) AS n, min(created_at) AS oldest
    FROM outbox_all GROUP BY queue, state ORDER BY queue`,
  // A page of queues ($2 a name prefix, $3 the last queue of the previous
  // page, $4 queues at most); the counts are exact, whatever $1 says.
  queuesPage: `SELECT queue, state, count(*) AS n, min(created_at) AS oldest
    FROM outbox_all
    WHERE queue IN (SELECT DISTINCT queue FROM outbox_all
        WHERE starts_with(queue, $2) AND queue > $3 ORDER BY queue LIMIT $4)
      AND coalesce($1::bigint, 0) >= 0
    GROUP BY queue, state ORDER BY queue`,
  queueCount: `SELECT count(*) AS n FROM (SELECT DISTINCT queue
      FROM outbox_all WHERE starts_with(queue, $1) LIMIT $2) AS q`,
  // $2 now or null (the server's clock): one statement outside a
  // transaction, one round trip.
  // One seek per priority in use, as on SQLite: p walks the queue's
  // distinct priorities down the ready index. A lease (version 9) keeps the
  // due time it was claimed at, past by then: the live leases' deadlines
  // are read from the due part of the index (a version 8 lease's due time
  // is its deadline, which the seeks find).
  nextDue: `WITH RECURSIVE p(v) AS (
      SELECT (SELECT priority FROM outbox_events
        WHERE queue = $1 AND done_at IS NULL
        ORDER BY priority DESC LIMIT 1)
      UNION ALL
      SELECT (SELECT priority FROM outbox_events
        WHERE queue = $1 AND done_at IS NULL AND priority < p.v
        ORDER BY priority DESC LIMIT 1)
      FROM p WHERE p.v IS NOT NULL)
    SELECT n.now, least((SELECT min((SELECT due_at FROM outbox_events
        WHERE queue = $1 AND done_at IS NULL AND priority = p.v
          AND due_at > n.now AND state IN ('pending', 'leased')
        ORDER BY due_at LIMIT 1)) FROM p WHERE p.v IS NOT NULL),
      (SELECT min(lease_until) FROM outbox_events
        WHERE queue = $1 AND done_at IS NULL AND due_at <= n.now
          AND state = 'leased' AND lease_until > n.now)) AS due_at
    FROM (SELECT coalesce($2::bigint, ${NOW}) AS now) AS n`,
  stats: `SELECT state, count(*) AS n, min(created_at) AS oldest
    FROM outbox_all WHERE queue = $1 GROUP BY state`,
  event: `SELECT ${EVENT_COLUMNS} FROM outbox_all WHERE id = $1`,
  eventByIdentity: `SELECT ${EVENT_COLUMNS} FROM outbox_all
    WHERE id = (SELECT event_id FROM outbox_keys WHERE identity = $1)`,
  history: `SELECT kind, fence, at, token, lease_until, detail
    FROM outbox_ledger WHERE event_id = $1 ORDER BY seq`,
  flow: POSTGRES_FLOW,
  inbox: POSTGRES_INBOX,
} as const satisfies Dialect;
