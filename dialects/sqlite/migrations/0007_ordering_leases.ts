/**
 * SQLite schema step 7, from version 7 to 8: an index of the live leases
 * per ordering key, so a claim passes over every event of a key while
 * another event of it holds a live lease (PostgreSQL's rule, its index
 * `outbox_events_ordering_leased`): a redriven or retried earlier event
 * waits for a later one's lease to end, one event of a key in flight at a
 * time. For a leased event `due_at` is its lease's deadline. The index text
 * is schema.sql's, so a fresh database and an upgraded one read the same.
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 7 to 8, run in the opening transaction. */
export const MIGRATION_0007: string =
  `CREATE INDEX outbox_events_ordering_leased ON outbox_events (queue, ordering_key, due_at)
  WHERE state = 'leased' AND ordering_key IS NOT NULL`;
