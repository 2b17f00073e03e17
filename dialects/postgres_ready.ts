/**
 * PostgreSQL's schema version 9 (issue 39): a claim and a renewal that the
 * server writes as HOT updates, a new row version in the same page and no
 * index entry.
 *
 * @module
 */

/**
 * `statements` (PL/pgSQL) in a block that runs them only while the schema
 * recorded in `outbox_schema` (none: 0) is older than `version`: a step's
 * one-time upgrade of the rows, which the step's idempotent DDL around it
 * cannot say.
 *
 * @ignore
 */
export const belowVersion = (version: number, statements: string): string =>
  `DO $$
DECLARE
  found integer := 0;
BEGIN
  IF to_regclass('outbox_schema') IS NOT NULL THEN
    EXECUTE 'SELECT coalesce(max(version), 0) FROM outbox_schema' INTO found;
  END IF;
  IF found < ${version} THEN${statements}  END IF;
END $$;`;

/**
 * Version 9, frozen as shipped and idempotent. An update is HOT only when
 * no column any index of the table names (in its key or its predicate)
 * changes, and when the page has room for the new version. So:
 *
 * - `outbox_events` at fillfactor 40: a claim of 256 rewrites every row of
 *   a page in one transaction, whose old versions no prune can take back
 *   before it commits, and the new version is larger than the inserted one
 *   (token, deadline, claim time): a page needs more than half its space
 *   free. 40 leaves room beside that for a renewal's version, pruned by
 *   then. Pages written before the upgrade keep their fill until rewritten
 *   (`VACUUM FULL outbox_events`, or as the backlog drains).
 * - One ready index, `outbox_events_ready` (queue, priority DESC, due_at,
 *   id) over the events not finished (`done_at IS NULL`: pending and
 *   leased; dead letters have a `done_at`, done events live in
 *   `outbox_done`). A claim leaves `due_at` alone (the lease's deadline is
 *   `lease_until`), so a lease keeps its entry: a claim takes a pending
 *   event or a lapsed lease, a heap test past the index, and scans past the
 *   live leases in front of it.
 * - `keyed_lease`: set by a claim of an event with an ordering or
 *   concurrency key, `last_lease` by a claim of an event's last attempt,
 *   both cleared by a release and a redrive, null otherwise. A claim of
 *   another event sets them from null to null, which is no change: such a
 *   claim stays HOT. The indexes of per-key FIFO (`outbox_events_key_order`
 *   over the unfinished events of an ordering key, `outbox_events_key_leases`
 *   over the keyed leases), of the per-key limit
 *   (`outbox_events_concurrency_leases`) and of the lapsed last-attempt
 *   test (`outbox_events_last_leases`) select by these and by `done_at`;
 *   whether such a lease is live (`state`, `lease_until`) is a heap test.
 *   A keyed claim or a last attempt's is a new row version, as every claim
 *   was in version 8.
 *
 * Upgrading a version 8 (or older) database, once, under the set-up lock:
 * the unfinished events' `done_at` is cleared and the dead letters' set
 * (the invariant the indexes' predicates rest on), the leases' markers are
 * set, the new indexes are built and the five that name `state` are
 * dropped. A version 8 lease keeps its deadline in `due_at` too, which
 * reads and claims the same. Workers of version 8 must be stopped first:
 * their claims would set no marker.
 *
 * @ignore
 */
export const POSTGRES_READY_STEP = `
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS keyed_lease boolean;
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS last_lease boolean;
ALTER TABLE outbox_events SET (fillfactor = 40);

${
  belowVersion(
    9,
    `
    UPDATE outbox_events SET done_at = updated_at
      WHERE state = 'dead' AND done_at IS NULL;
    UPDATE outbox_events SET done_at = NULL
      WHERE state IN ('pending', 'leased') AND done_at IS NOT NULL;
    UPDATE outbox_events
      SET keyed_lease = CASE WHEN ordering_key IS NOT NULL
          OR concurrency_key IS NOT NULL THEN true END,
        last_lease = CASE WHEN attempt >= max_attempts THEN true END
      WHERE state = 'leased';
`,
  )
}

CREATE INDEX IF NOT EXISTS outbox_events_ready
  ON outbox_events (queue, priority DESC, due_at, id)
  WHERE done_at IS NULL;

CREATE INDEX IF NOT EXISTS outbox_events_key_order
  ON outbox_events (queue, ordering_key, id)
  WHERE ordering_key IS NOT NULL AND done_at IS NULL;

CREATE INDEX IF NOT EXISTS outbox_events_key_leases
  ON outbox_events (queue, ordering_key)
  WHERE keyed_lease AND ordering_key IS NOT NULL AND done_at IS NULL;

CREATE INDEX IF NOT EXISTS outbox_events_concurrency_leases
  ON outbox_events (queue, concurrency_key)
  WHERE keyed_lease AND concurrency_key IS NOT NULL AND done_at IS NULL;

CREATE INDEX IF NOT EXISTS outbox_events_last_leases
  ON outbox_events (id)
  WHERE last_lease AND done_at IS NULL;

DROP INDEX IF EXISTS outbox_events_claim_priority;
DROP INDEX IF EXISTS outbox_events_last_attempt;
DROP INDEX IF EXISTS outbox_events_ordering;
DROP INDEX IF EXISTS outbox_events_ordering_leased;
DROP INDEX IF EXISTS outbox_events_concurrency;
`;
