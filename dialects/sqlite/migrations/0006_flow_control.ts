/**
 * SQLite schema step 6, from version 6 to 7 (flow control and schedules):
 * an event's `priority` and `concurrency_key`; the claim index led by
 * priority, so "the best eligible event" stays one walk of one index
 * (highest priority first, then due time, then id); an index of the live
 * leases per concurrency key, which a claim under a per-key limit counts;
 * the queues' settings (pause, limits and the rate limit's token bucket)
 * and the schedules. The index and table texts are schema.sql's, so a
 * fresh database and an upgraded one read the same.
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 6 to 7, run in the opening transaction. */
export const MIGRATION_0006: string =
  `ALTER TABLE outbox_events ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_events ADD COLUMN concurrency_key TEXT;
DROP INDEX outbox_events_claim;
CREATE INDEX outbox_events_claim ON outbox_events (queue, priority DESC, due_at, id)
  WHERE state IN ('pending', 'leased');
CREATE INDEX outbox_events_concurrency ON outbox_events (queue, concurrency_key, due_at)
  WHERE state = 'leased' AND concurrency_key IS NOT NULL;
CREATE TABLE outbox_queues (
  queue TEXT PRIMARY KEY,
  paused INTEGER NOT NULL DEFAULT 0,
  per_key INTEGER,
  per_second INTEGER,
  tokens REAL,
  refilled_at INTEGER,
  updated_at INTEGER NOT NULL
) STRICT;
CREATE TABLE outbox_schedules (
  name TEXT PRIMARY KEY,
  cron TEXT NOT NULL,
  timezone TEXT,
  queue TEXT NOT NULL,
  payload ANY,
  options TEXT NOT NULL,
  missed TEXT NOT NULL,
  next_at INTEGER NOT NULL,
  last_at INTEGER,
  updated_at INTEGER NOT NULL
) STRICT`;
