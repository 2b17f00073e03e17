/**
 * SQLite schema step 2, from version 2 to 3: the claim time on the event row
 * (`claimed_at`) and the ledger views that read the entries a row still
 * holds. Version 2 wrote every entry as a row, so none is left unwritten.
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 2 to 3, run in the opening transaction. */
export const MIGRATION_0002: string =
  `ALTER TABLE outbox_events ADD COLUMN claimed_at INTEGER; CREATE VIEW outbox_unwritten_attempts AS
  SELECT e.id AS event_id, e.fence AS fence, k.kind AS kind,
    CASE k.n WHEN 1 THEN e.claimed_at ELSE e.done_at END AS at,
    e.token AS token,
    CASE k.n WHEN 1 THEN e.lease_until END AS lease_until,
    NULL AS detail, k.n AS n
  FROM outbox_events AS e
  JOIN (SELECT 1 AS n, 'claimed' AS kind UNION ALL SELECT 2, 'acknowledged') AS k
    ON e.state = 'done' OR (k.n = 1 AND e.state = 'leased')
  WHERE NOT EXISTS (SELECT 1 FROM outbox_attempts AS a
    WHERE a.event_id = e.id AND a.fence = e.fence AND a.kind = k.kind);

-- The whole ledger, what explain() reads: \`seq\` orders one event's entries
-- (a row's id; unwritten entries follow every written one). It orders one
-- event only: an unwritten entry's \`seq\` changes as rows are written.
CREATE VIEW outbox_ledger AS
  SELECT id AS seq, event_id, fence, kind, at, token, lease_until, detail
  FROM outbox_attempts
  UNION ALL
  SELECT (SELECT coalesce(max(id), 0) FROM outbox_attempts) + n, event_id,
    fence, kind, at, token, lease_until, detail
  FROM outbox_unwritten_attempts;

`;
