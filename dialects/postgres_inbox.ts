/**
 * PostgreSQL's text of the inbox's statements (`inbox.ts` runs them), and
 * its table, which the inbox creates itself when missing.
 *
 * What differs from SQLite, and why: transactions are `READ COMMITTED` and
 * run side by side, so no lock is taken before the identity is looked up.
 * The identity's unique index is the lock: `record` inserts first, and a
 * second transaction inserting the same identity waits on the index entry
 * until the first ends. When the first commits, the second's insert does
 * nothing and its `accepted` (a statement of its own, so a fresh snapshot
 * under `READ COMMITTED`) reads the committed fence; when the first rolls
 * back, the second's insert goes in and its effect runs. Either way the
 * effect commits once.
 *
 * An insert that returned no row met a row, or a `BEFORE INSERT` trigger
 * of the application's returned NULL and skipped it. Only the insert can
 * tell which: `accepted`, when it finds no row, inserts again, without
 * `ON CONFLICT DO NOTHING`'s silence, and fails the statement when that
 * insert too stored nothing.
 *
 * @module
 */
import {
  failWith,
  RACED_INSERT,
  SKIPPED_INSERT,
} from "../core/insert_or_find.ts";
import type { InboxStatements } from "../types.ts";

/** The inbox's statements on PostgreSQL. */
export const POSTGRES_INBOX: InboxStatements = {
  // Two sessions running CREATE TABLE IF NOT EXISTS at once can both miss
  // the table and one then fails on the catalog's unique index: a
  // transaction-scoped advisory lock, per schema, lines them up. Its own
  // table beside the application's; the outbox's version table is not
  // touched.
  schema:
    `SELECT pg_advisory_xact_lock(hashtext('leased_outbox_inbox:' || current_schema()));
CREATE TABLE IF NOT EXISTS inbox_accepted (
  identity text PRIMARY KEY,
  fence bigint NOT NULL,
  accepted_at bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS inbox_accepted_at ON inbox_accepted (accepted_at);`,
  // $1 identity, $2 fence, $3 now. A row back: recorded; none: accepted by
  // a transaction that has committed (the insert waited for it).
  record: `INSERT INTO inbox_accepted (identity, fence, accepted_at)
    VALUES ($1, $2, $3) ON CONFLICT (identity) DO NOTHING RETURNING fence`,
  // $1 identity, $2 fence, $3 now, after `record` inserted nothing. The
  // record's fence (`recorded` 0); when no row holds the identity (a purge
  // deleted the one `record` met, and committed), the identity recorded
  // now (`recorded` 1). Its insert met a row only if another transaction
  // recorded the identity since this statement's snapshot, which DO
  // UPDATE's WHERE sees (evaluated on a conflict alone, never true): the
  // statement fails (RACED_INSERT, a DedupRaceError). When it met none and
  // returned none, a trigger skipped it: the statement fails
  // (SKIPPED_INSERT, a ConstraintError), where one more round would skip
  // it again.
  accepted: `WITH a AS (SELECT fence FROM inbox_accepted WHERE identity = $1),
  r AS (INSERT INTO inbox_accepted (identity, fence, accepted_at)
    SELECT $1, $2, $3 WHERE NOT EXISTS (SELECT 1 FROM a)
    ON CONFLICT (identity) DO UPDATE SET fence = inbox_accepted.fence
      WHERE ${failWith(RACED_INSERT, "inbox_accepted.fence")} IS NULL
    RETURNING fence)
  SELECT fence, 0 AS recorded FROM a
  UNION ALL SELECT fence, 1 FROM r
  UNION ALL SELECT ${failWith(SKIPPED_INSERT, "c.n")}, NULL
    FROM (SELECT count(*) AS n FROM r) AS c
    WHERE c.n = 0 AND NOT EXISTS (SELECT 1 FROM a)`,
  // The rows locked in one order first: two purges at once take the same
  // rows, which a plain DELETE locks in its scan's order.
  purge: `DELETE FROM inbox_accepted WHERE identity IN (SELECT identity
      FROM inbox_accepted WHERE accepted_at < $1
      ORDER BY identity COLLATE "C" FOR UPDATE)`,
};
