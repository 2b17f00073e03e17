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
 * @module
 */
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
  accepted: "SELECT fence FROM inbox_accepted WHERE identity = $1",
  // The rows locked in one order first: two purges at once take the same
  // rows, which a plain DELETE locks in its scan's order.
  purge: `DELETE FROM inbox_accepted WHERE identity IN (SELECT identity
      FROM inbox_accepted WHERE accepted_at < $1
      ORDER BY identity COLLATE "C" FOR UPDATE)`,
};
