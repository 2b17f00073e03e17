/**
 * SQLite schema step 3, from version 3 to 4: every event gets an identity,
 * existing ones a UUIDv7 stamped with their `created_at` (74 random bits
 * from `randomblob()`, so they sort by enqueue time as minted ones do; the
 * subquery, correlated with the row, draws new bits for each row).
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 3 to 4, run in the opening transaction. */
export const MIGRATION_0003: string =
  `ALTER TABLE outbox_events ADD COLUMN identity TEXT;
    UPDATE outbox_events SET identity = (
      SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 1, 3)
        || '-' || substr('89ab89ab89ab89ab', instr('0123456789abcdef', substr(r, 4, 1)), 1)
        || substr(r, 5, 3) || '-' || substr(r, 8, 12)
      FROM (SELECT printf('%012x', created_at & 0xffffffffffff) AS t,
        lower(hex(randomblob(10))) AS r));
    CREATE UNIQUE INDEX outbox_events_identity ON outbox_events (identity)`;
