/**
 * SQLite's text of the inbox's statements (`inbox.ts` runs them), and its
 * table, which the inbox creates itself when missing.
 *
 * @module
 */
import type { InboxStatements } from "../types.ts";

/** The inbox's statements on SQLite. */
export const SQLITE_INBOX: InboxStatements = {
  // One row per accepted identity, beside the application's tables; it
  // never touches `PRAGMA user_version` nor the outbox's version table.
  schema: `CREATE TABLE IF NOT EXISTS inbox_accepted (
  identity TEXT PRIMARY KEY,
  fence INTEGER NOT NULL,
  accepted_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_accepted_at ON inbox_accepted (accepted_at);`,
  // ?1 identity, ?2 fence, ?3 now. A row back: recorded; none: accepted
  // before (inside BEGIN IMMEDIATE, by a transaction that has committed).
  record: `INSERT INTO inbox_accepted (identity, fence, accepted_at)
    VALUES (?1, ?2, ?3) ON CONFLICT (identity) DO NOTHING RETURNING fence`,
  accepted: "SELECT fence FROM inbox_accepted WHERE identity = ?1",
  purge: "DELETE FROM inbox_accepted WHERE accepted_at < ?1",
};
