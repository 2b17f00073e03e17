/**
 * SQLite's dialect: the text of every statement the core runs on SQLite,
 * and nothing that runs them (the upgrade steps are sqlite/migrations/; the rules that
 * decide which statement runs, with what, are `lease.ts`'s; PostgreSQL's
 * text is `postgres.ts` beside this file).
 *
 * @module
 */
import { LEASE_EXPIRED } from "../admin.ts";
import { ADMIN_SQL } from "./sqlite/admin.ts";
import type { Dialect } from "../types.ts";
import { SQLITE_FLOW } from "./sqlite_flow.ts";
import { SQLITE_INBOX } from "./sqlite_inbox.ts";

const EVENT_COLUMNS =
  "id, identity, queue, state, payload, ordering_key, due_at, lease_until, token, fence, attempt, max_attempts, last_error, created_at, updated_at, done_at";
// What a claim changes, shared by the batch and the lone claim; #claim builds
// the lease from the candidate row plus exactly these changes.
const CLAIM_SET = `state = 'leased', fence = fence + 1, attempt = attempt + 1,
      lease_until = ?1, due_at = ?1, updated_at = ?2, claimed_at = ?2,
      last_error = CASE state WHEN 'leased' THEN '${LEASE_EXPIRED}' ELSE last_error END`;
export { UPGRADES, VERSION_TABLE_SQL } from "./sqlite/migrations/mod.ts";
// The live leases of a candidate's concurrency key (the index
// outbox_events_concurrency counts them).
const HELD = `(SELECT count(*) FROM outbox_events AS k
        WHERE k.queue = e.queue AND k.concurrency_key = e.concurrency_key
          AND k.state = 'leased' AND k.concurrency_key IS NOT NULL
          AND k.due_at > ?2)`;

// The id an enqueue's event takes: above the highest id and the highest id
// ever deleted (schema.sql's outbox_id_floor), so an id is never reused
// without AUTOINCREMENT's write of sqlite_sequence at every insert.
const NEXT_ID = `(SELECT max(coalesce((SELECT max(id) FROM outbox_events), 0),
      coalesce((SELECT seq FROM outbox_id_floor), 0)) + 1)`;
// A batch's ids: SQLite's own (the highest id plus one, row by row, so a
// skipped row takes none, as a lone enqueue's) unless purge() deleted the
// highest ids, when they start above the floor, NEXT_ID plus the event's
// index (evaluated once, before the first row is inserted).
const BATCH_ID = `CASE WHEN (SELECT coalesce(max(id), 0) FROM outbox_events)
      < (SELECT coalesce(max(seq), 0) FROM outbox_id_floor)
      THEN ${NEXT_ID} + e.key END`;

/** The statements of the core on SQLite (the admin calls' are `ADMIN_SQL`, in `sqlite/admin.ts`). */
export const SQL = {
  begin: "BEGIN IMMEDIATE",
  commit: "COMMIT",
  rollback: "ROLLBACK",
  savepoint: "SAVEPOINT acknowledge",
  releaseSavepoint: "RELEASE acknowledge",
  rollbackToSavepoint: "ROLLBACK TO acknowledge",
  // Inside an application's transaction: the outbox's statements as one
  // unit that a failure undoes without touching the application's writes.
  joinSavepoint: "SAVEPOINT outbox",
  releaseJoin: "RELEASE outbox",
  rollbackJoin: "ROLLBACK TO outbox",
  tables: `SELECT name FROM sqlite_schema
    WHERE type = 'table' AND name IN ('outbox_events', 'outbox_schema')`,
  // Answers `version`: the schema version the database holds.
  schemaVersion: "SELECT max(version) AS version FROM outbox_schema",
  // A reader's transaction (reader.ts): deferred, so it takes no write lock
  // and runs on a read-only connection.
  readBegin: "BEGIN",
  // Whether the database holds an outbox, read without writing.
  outboxPresent: `SELECT 1 AS present FROM sqlite_schema
    WHERE type = 'table' AND name = 'outbox_events'`,
  recordVersion: `INSERT INTO outbox_schema (version, applied_at)
    VALUES (?, CAST(unixepoch('subsec') * 1000 AS INTEGER))`,
  // Releases before outbox_schema kept the version in user_version; the
  // tables' shape tells it without trusting user_version: version 4 added
  // identity, version 3 claimed_at, version 2 dropped version 1's ledger
  // triggers.
  legacyShape: `SELECT
    (SELECT count(*) FROM pragma_table_info('outbox_events')
      WHERE name = 'identity') AS identity,
    (SELECT count(*) FROM pragma_table_info('outbox_events')
      WHERE name = 'claimed_at') AS claimed_at,
    (SELECT count(*) FROM sqlite_schema
      WHERE type = 'trigger' AND name = 'outbox_events_claimed') AS triggers`,
  // The columns of an outbox_events table found without outbox_schema.
  legacyColumns: "SELECT name FROM pragma_table_info('outbox_events')",
  userVersion: "PRAGMA user_version",
  resetUserVersion: "PRAGMA user_version = 0",
  // A conflict on the dedup key or the identity inserts nothing; the
  // targets name their indexes (outbox_events_dedup, a partial index whose
  // WHERE the target repeats, and outbox_events_identity), so any other
  // uniqueness the application adds refuses the insert with the engine's
  // error naming it, as on PostgreSQL, rather than pass for a dedup hit.
  // ?10: the payload when it is bytes (?2 when JSON text): PostgreSQL keeps
  // the two in columns of their own.
  // ?11: priority, ?12: concurrency key.
  insert: `INSERT INTO outbox_events
    (id, queue, state, payload, dedup_key, ordering_key, due_at, max_attempts, created_at, updated_at, identity, priority, concurrency_key)
    VALUES (${NEXT_ID}, ?1, 'pending', coalesce(?2, ?10), ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?11, ?12)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    ON CONFLICT (identity) DO NOTHING
    RETURNING id`,
  // The dedup key's event first: it is the one the caller's key names.
  existing: `SELECT id, identity FROM outbox_events
    WHERE (queue = ?1 AND dedup_key = ?2) OR identity = ?3
    ORDER BY dedup_key IS NOT ?2 LIMIT 1`,
  // A batch of enqueues in one statement, each row inserted or skipped as
  // `insert` would be, in array order, so ids follow it and a later row
  // meets the keys of earlier ones. ?1: now; ?2: a JSON array of [queue,
  // payload JSON text or null, payload bytes as hex or null, dedup key,
  // ordering key, delay in ms (due_at less now), max_attempts, identity,
  // priority, concurrency key]. (WHERE true: SQLite's upsert after INSERT … SELECT needs a WHERE
  // clause to parse.)
  insertAll: `INSERT INTO outbox_events
    (id, queue, state, payload, dedup_key, ordering_key, due_at, max_attempts, created_at, updated_at, identity, priority, concurrency_key)
    SELECT ${BATCH_ID}, e.value ->> 0, 'pending',
      coalesce(e.value ->> 1, unhex(e.value ->> 2)), e.value ->> 3,
      e.value ->> 4, ?1 + (e.value ->> 5), e.value ->> 6, ?1, ?1, e.value ->> 7,
      e.value ->> 8, e.value ->> 9
    FROM json_each(?2) AS e WHERE true ORDER BY e.key
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    ON CONFLICT (identity) DO NOTHING
    RETURNING id, identity, queue, dedup_key`,
  // `insertAll` for a batch whose events differ only in payload (JSON text)
  // and identity, the common case: two values to read per element rather
  // than eight, which halves the statement's cost in WASM. ?1: now; ?2: a
  // JSON array of [payload JSON text, identity]; ?3: queue; ?4: delay in ms;
  // ?5: max_attempts. No dedup key: the identity is its one conflict target.
  insertAlike: `INSERT INTO outbox_events
    (id, queue, state, payload, dedup_key, ordering_key, due_at, max_attempts, created_at, updated_at, identity)
    SELECT ${BATCH_ID}, ?3, 'pending', e.value ->> 0, NULL, NULL, ?1 + ?4, ?5, ?1, ?1,
      e.value ->> 1
    FROM json_each(?2) AS e WHERE true ORDER BY e.key
    ON CONFLICT (identity) DO NOTHING
    RETURNING id, identity, queue, dedup_key`,
  // `existing` for the skipped rows of a batch. ?1: a JSON array of [queue,
  // dedup key or null, identity or null]: a key the batch's later element
  // went in with is left out (null), as it was free at this element's
  // turn. Answers n, the element's index, with id and identity.
  existingAll: `SELECT d.key AS n, e.id, e.identity
    FROM json_each(?1) AS d
    JOIN outbox_events AS e ON e.id = (
      SELECT id FROM outbox_events
      WHERE (queue = d.value ->> 0 AND dedup_key = d.value ->> 1)
          OR identity = d.value ->> 2
      ORDER BY dedup_key IS NOT d.value ->> 1 LIMIT 1)`,
  // A lapsed lease on the last attempt is a dead letter from its deadline on
  // (SQS moves a message to its dead-letter queue when its receive count runs
  // out). Every transaction looks for them first, so once any call has seen
  // such a lease lapse, no call sees it alive again, even if the clock steps
  // back.
  exhausted: `SELECT id, fence FROM outbox_events
    WHERE state = 'leased' AND attempt >= max_attempts AND due_at <= ?1`,
  // ?2: a JSON array of event ids.
  expire: `UPDATE outbox_events
    SET state = 'dead', lease_until = NULL, token = NULL,
      last_error = '${LEASE_EXPIRED}', updated_at = ?1, done_at = due_at
    WHERE id IN (SELECT value FROM json_each(?2))`,
  // Only the first unfinished event of an ordering key passes the first NOT
  // EXISTS, and claiming it leaves it unfinished, so a batch never holds two
  // events of one key. The second passes over every event of a key another
  // event of which holds a live lease (PostgreSQL's rule): a redrive or a
  // retry can make an earlier event pending again while a later one is in
  // flight, and the earlier one waits for that lease to end. `+?1` and `+?3`: SQLite recompiles a statement each
  // time a parameter is bound anew when its plan compared that parameter
  // with a constant (the LIMIT; the partial indexes' WHERE clauses), which
  // cost every claim 18 µs on node:sqlite and 33 µs in WASM; the unary plus
  // keeps the parameters out of the planner's sight.
  // ?4: the claiming outbox's maxPayloadBytes. octet_length reads a
  // payload's size from its record header, so a payload too large to read
  // back is never loaded: its event becomes a dead letter instead.
  // ?5: the queue's per-key limit, or null: an event whose concurrency key
  // holds that many live leases is passed over (so other keys are not held
  // back), and `held` tells core/flow.ts how many each key holds. Highest
  // priority first; an ordering key's later events wait for its first
  // whatever their priority.
  candidates: `SELECT id, identity, state, fence, attempt, max_attempts,
      CASE WHEN octet_length(payload) <= ?4 THEN payload END AS payload,
      octet_length(payload) AS bytes, ordering_key, last_error,
      concurrency_key, CASE WHEN concurrency_key IS NOT NULL AND +?5 IS NOT NULL
        THEN ${HELD} END AS held
    FROM outbox_events AS e
    WHERE queue = +?1 AND state IN ('pending', 'leased') AND due_at <= ?2
      AND (ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM outbox_events AS p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key
          AND p.id < e.id AND p.state IN ('pending', 'leased'))
        AND NOT EXISTS (SELECT 1 FROM outbox_events AS o
          WHERE o.queue = e.queue AND o.ordering_key = e.ordering_key
            AND o.state = 'leased' AND o.due_at > ?2))
      AND (concurrency_key IS NULL OR +?5 IS NULL OR ${HELD} < +?5)
    ORDER BY priority DESC, due_at, id LIMIT +?3`,
  tokenUsed:
    "SELECT 1 FROM outbox_ledger WHERE event_id = ? AND kind = 'claimed' AND token = ?",
  // ?3: a JSON object from each candidate's id to its token: an object's
  // values need no extraction, which cost 0.7 µs per event in WASM. No
  // RETURNING: reading its rows back cost more than building the leases.
  claim: `UPDATE outbox_events AS e SET ${CLAIM_SET}, token = c.value
    FROM json_each(?3) AS c
    WHERE e.id = CAST(c.key AS INTEGER)`,
  // A lone claim without JSON, which would cost it twice the UPDATE itself.
  claimOne: `UPDATE outbox_events SET ${CLAIM_SET}, token = ?4 WHERE id = ?3`,
  ledger:
    `INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until, detail)
    VALUES (?, ?, ?, ?, ?, ?, ?)`,
  // Writes the entries the event rows still hold (schema.sql's
  // outbox_unwritten_attempts). ?1: a JSON array of event ids.
  writeUnwritten:
    `INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until, detail)
    SELECT event_id, fence, kind, at, token, lease_until, detail
    FROM outbox_unwritten_attempts
    WHERE event_id IN (SELECT value FROM json_each(?1))
    ORDER BY event_id, n`,
  // ?2: a JSON array of [event id, fence, kind, token, lease_until, detail]
  // entries, inserted in array order (explain() orders by seq, the id). Entries of
  // events that do not exist (purged, never enqueued) are skipped, as the
  // stale statement skips them.
  ledgerAll:
    `INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until, detail)
    SELECT l.value ->> 0, l.value ->> 1, l.value ->> 2, ?1, l.value ->> 3,
      l.value ->> 4, l.value ->> 5
    FROM json_each(?2) AS l
    WHERE EXISTS (SELECT 1 FROM outbox_events WHERE id = l.value ->> 0)
    ORDER BY l.key`,
  acknowledge: `UPDATE outbox_events
    SET state = 'done', updated_at = ?1, done_at = ?1
    WHERE id = ?2 AND token = ?3 AND fence = ?4 AND state = 'leased'`,
  // ?2: a JSON object from event id to `${fence}:${token}` (a token has no
  // colon): one comparison instead of two extractions, 0.8 µs per event in
  // WASM.
  acknowledgeAll: `UPDATE outbox_events AS e
    SET state = 'done', updated_at = ?1, done_at = ?1
    FROM json_each(?2) AS a
    WHERE e.id = CAST(a.key AS INTEGER)
      AND a.value = e.fence || ':' || e.token AND e.state = 'leased'`,
  renew: `UPDATE outbox_events
    SET lease_until = max(lease_until, ?1), due_at = max(lease_until, ?1), updated_at = ?2
    WHERE id = ?3 AND token = ?4 AND fence = ?5 AND state = 'leased'
      AND lease_until > ?2
    RETURNING lease_until`,
  // ?7: 1 makes it a dead letter whatever attempts are left. ?8: 1 takes
  // the claim's attempt back (a lease whose work never began).
  release: `UPDATE outbox_events
    SET state = CASE WHEN ?7 OR attempt - ?8 >= max_attempts THEN 'dead' ELSE 'pending' END,
      done_at = CASE WHEN ?7 OR attempt - ?8 >= max_attempts THEN ?1 END,
      attempt = attempt - ?8, token = NULL, lease_until = NULL, due_at = ?2, updated_at = ?1,
      last_error = coalesce(?3, last_error)
    WHERE id = ?4 AND token = ?5 AND fence = ?6 AND state = 'leased'
    RETURNING state`,
  stale: `INSERT INTO outbox_attempts (event_id, fence, kind, at, token)
    SELECT id, ?2, ?3, ?4, ?5 FROM outbox_events WHERE id = ?1`,
  deadLetters:
    `SELECT id, identity, queue, payload, attempt, last_error, created_at, done_at
    FROM outbox_events WHERE state = 'dead' AND queue = ? ORDER BY id LIMIT ?`,
  // An event a claim cannot hand out (payload too large, or text that is
  // not JSON): a dead letter with the reason, so the queue goes on.
  unclaimable: `UPDATE outbox_events
    SET state = 'dead', done_at = ?1, updated_at = ?1, lease_until = NULL,
      token = NULL, last_error = ?2
    WHERE id = ?3`,
  // A write that changes nothing: fails with SQLITE_READONLY on a read-only
  // connection, where BEGIN IMMEDIATE itself succeeds.
  writable: "UPDATE outbox_events SET id = id WHERE 0",
  tableCount: "SELECT count(*) AS n FROM sqlite_schema",
  // Only takes effect before the first table exists (sqlite.org/pragma.html).
  autoVacuum: "PRAGMA auto_vacuum = INCREMENTAL",
  freelistCount: "PRAGMA freelist_count",
  pageCount: "PRAGMA page_count",
  pageSize: "PRAGMA page_size",
  autoVacuumMode: "PRAGMA auto_vacuum",
  incrementalVacuum: "PRAGMA incremental_vacuum",
  stats: `SELECT state, count(*) AS n, min(created_at) AS oldest
    FROM outbox_events WHERE queue = ? GROUP BY state`,
  event: `SELECT ${EVENT_COLUMNS} FROM outbox_events WHERE id = ?`,
  eventByIdentity:
    `SELECT ${EVENT_COLUMNS} FROM outbox_events WHERE identity = ?`,
  history: `SELECT kind, fence, at, token, lease_until, detail
    FROM outbox_ledger WHERE event_id = ? ORDER BY seq`,
} as const;

/** SQLite's dialect: the core's statements and the admin calls'. */
export const SQLITE: Dialect = {
  ...SQL,
  ...ADMIN_SQL,
  oneWriter: true,
  flow: SQLITE_FLOW,
  inbox: SQLITE_INBOX,
  maintenance: {
    pageSize: SQL.pageSize,
    pageCount: SQL.pageCount,
    freelistCount: SQL.freelistCount,
    autoVacuumMode: SQL.autoVacuumMode,
    autoVacuum: SQL.autoVacuum,
    incrementalVacuum: SQL.incrementalVacuum,
  },
};
