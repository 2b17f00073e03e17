/**
 * SQLite schema step 5, from version 5 to 6: `queues()` and the dashboard
 * read counts from an index (`outbox_events_state`); the dashboard's chart
 * reads the ledger by time (`outbox_attempts_at`).
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 5 to 6, run in the opening transaction. */
export const MIGRATION_0005: string =
  `CREATE INDEX outbox_events_state ON outbox_events (queue, state, created_at);
    CREATE INDEX outbox_attempts_at ON outbox_attempts (at)`;
