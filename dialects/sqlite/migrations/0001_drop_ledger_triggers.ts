/**
 * SQLite schema step 1, from version 1 to 2: lease.ts writes the ledger
 * itself; left in place, version 1's triggers would write the entries of
 * claims and acknowledgements again.
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 1 to 2, run in the opening transaction. */
export const MIGRATION_0001: string =
  `DROP TRIGGER IF EXISTS outbox_events_claimed;
    DROP TRIGGER IF EXISTS outbox_events_acknowledged`;
