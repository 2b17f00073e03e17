/**
 * PostgreSQL's text of the flow-control and schedule statements
 * (`core/flow.ts`, `core/schedules.ts` run them), and the frozen schema
 * step that adds what they read and write.
 *
 * @module
 */
import type { FlowStatements } from "../types.ts";

const NOW = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/**
 * The flow-control step, frozen as shipped and idempotent (each statement
 * creates only what is missing), so it can run after whatever step came
 * before it: an event's `priority` and `concurrency_key`; the claim index
 * led by priority (`outbox_events_claim_priority`, replacing
 * `outbox_events_claim`), so "the best eligible event" stays one walk of
 * one index; the live leases per concurrency key, which a claim under a
 * per-key limit counts; the queues' settings (pause, limits, the rate
 * limit's token bucket) and the schedules.
 *
 * @ignore
 */
export const POSTGRES_FLOW_STEP = `
ALTER TABLE outbox_events
  ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0;
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS concurrency_key text;

CREATE INDEX IF NOT EXISTS outbox_events_claim_priority
  ON outbox_events (queue, priority DESC, due_at, id)
  WHERE state IN ('pending', 'leased');
DROP INDEX IF EXISTS outbox_events_claim;

CREATE INDEX IF NOT EXISTS outbox_events_concurrency
  ON outbox_events (queue, concurrency_key, due_at)
  WHERE state = 'leased' AND concurrency_key IS NOT NULL;

CREATE TABLE IF NOT EXISTS outbox_queues (
  queue text PRIMARY KEY,
  paused integer NOT NULL DEFAULT 0,
  per_key integer,
  per_second integer,
  tokens double precision,
  refilled_at bigint,
  updated_at bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS outbox_schedules (
  name text PRIMARY KEY,
  cron text NOT NULL,
  timezone text,
  queue text NOT NULL,
  payload text,
  options text NOT NULL,
  missed text NOT NULL,
  next_at bigint NOT NULL,
  last_at bigint,
  updated_at bigint NOT NULL
);
`;

/**
 * The live leases of a candidate `e`'s concurrency key at `now`, but those
 * of `except` (a condition on `k`, the lease: the leases the same
 * statement acknowledges, which its snapshot still shows leased). Read
 * from `outbox_events_concurrency_leases` (schema version 9: the keyed
 * leases, whether live a test of the row), which no claim of an event
 * without a key writes to.
 *
 * @ignore
 */
export const held = (now: string, except = "") =>
  `(SELECT count(*) FROM outbox_events AS k
          WHERE k.queue = e.queue AND k.concurrency_key = e.concurrency_key
            AND k.keyed_lease AND k.concurrency_key IS NOT NULL
            AND k.done_at IS NULL AND k.state = 'leased'
            AND k.lease_until > ${now}${except})`;

/**
 * The gate of a one-statement claim (core/one_statement.ts) from the queue
 * $2 at the clock of the CTE `n`, as two CTEs: `q`, the queue's settings
 * row locked (waiting for a claim of the queue in flight, as the general
 * path's `settings` does), after `after` (a condition that takes the
 * statement's earlier locks first); and `g`, one row: `allowed` (how many
 * the claim may take: 0 paused, else $3 or the bucket's whole tokens,
 * refilled by `n`'s clock as `openGate` refills them), `per_key`,
 * `per_second`, `bucket` and `refilled_at` (what a claim that takes leases
 * leaves in the row, less its leases' tokens), and `moved`.
 *
 * `moved`: the row locked is not the version the statement's snapshot
 * shows. A claim that took leases from a queue with flow control wrote its
 * row (`spend`, `take`) and committed after this statement's snapshot, so
 * the live leases the snapshot counts may be short; the statement then
 * refuses and the general path, whose statements each read afresh after
 * the lock, claims. The snapshot keeps the version it shows from vacuum, so
 * a later version never has its `ctid`.
 *
 * @ignore
 */
export const claimGate = (after: string) =>
  `q AS MATERIALIZED (SELECT ctid, paused, per_key, per_second, tokens,
      refilled_at
    FROM outbox_queues WHERE queue = $2${after} FOR UPDATE),
  g AS MATERIALIZED (SELECT
      (SELECT s.ctid FROM outbox_queues AS s WHERE s.queue = $2)
        IS DISTINCT FROM q.ctid AS moved,
      q.per_key, q.per_second, b.bucket,
      greatest(n.now, coalesce(q.refilled_at, n.now)) AS refilled_at,
      CASE WHEN q.paused = 1 THEN 0
        ELSE least($3::bigint, floor(b.bucket)::bigint) END AS allowed
    FROM n LEFT JOIN q ON true
    CROSS JOIN LATERAL (SELECT CASE WHEN q.per_second IS NOT NULL
        THEN least(q.per_second::double precision,
          coalesce(q.tokens, q.per_second::double precision)
            + greatest(0, n.now - coalesce(q.refilled_at, n.now))
              ::double precision * q.per_second / 1000)
        END AS bucket) AS b)`;

/**
 * Spends the tokens of the `count` leases a one-statement claim took
 * (`claimGate`'s `g`) when `when` holds; without a rate limit it writes
 * the row as it is, so that `moved` sees the claim.
 *
 * @ignore
 */
export const spend = (count: string, when: string) =>
  `UPDATE outbox_queues AS q
    SET tokens = CASE WHEN g.per_second IS NULL THEN q.tokens
        ELSE g.bucket - ${count} END,
      refilled_at = CASE WHEN g.per_second IS NULL THEN q.refilled_at
        ELSE g.refilled_at END
    FROM g
    WHERE q.queue = $2 AND ${when}`;

/** The flow statements on PostgreSQL. */
export const POSTGRES_FLOW: FlowStatements = {
  // Locked: claims from a queue with flow control take turns, so the live
  // leases they count and the tokens they spend are exact.
  settings: `SELECT paused, per_key, per_second, tokens, refilled_at
    FROM outbox_queues WHERE queue = $1 FOR UPDATE`,
  allSettings: `SELECT queue, paused, per_key, per_second
    FROM outbox_queues ORDER BY queue`,
  pause: `INSERT INTO outbox_queues (queue, paused, updated_at)
    VALUES ($1, $2::integer, $3::bigint)
    ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused,
      updated_at = excluded.updated_at`,
  limits: `INSERT INTO outbox_queues AS q
      (queue, per_key, per_second, tokens, refilled_at, updated_at)
    VALUES ($1, $3::integer, $5::integer, $5::double precision, $6::bigint,
      $6::bigint)
    ON CONFLICT (queue) DO UPDATE SET
      per_key = CASE WHEN $2::integer = 1 THEN $3::integer ELSE q.per_key END,
      per_second = CASE WHEN $4::integer = 1 THEN $5::integer
        ELSE q.per_second END,
      tokens = CASE WHEN $4::integer = 1 THEN $5::double precision
        ELSE q.tokens END,
      refilled_at = CASE WHEN $4::integer = 1 THEN $6::bigint
        ELSE q.refilled_at END,
      updated_at = $6::bigint`,
  prune: `DELETE FROM outbox_queues
    WHERE queue = $1 AND paused = 0 AND per_key IS NULL AND per_second IS NULL`,
  // Run by every claim that took leases under a limit, with a rate limit
  // or not: the new row version tells a one-statement claim waiting for
  // the row that its snapshot missed these leases (claimGate's `moved`).
  take: `UPDATE outbox_queues
    SET tokens = $2::double precision, refilled_at = $3::bigint
    WHERE queue = $1`,
  schedule: `INSERT INTO outbox_schedules
      (name, cron, timezone, queue, payload, options, missed, next_at,
        updated_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8::bigint, $9::bigint)
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron,
      timezone = excluded.timezone, queue = excluded.queue,
      payload = excluded.payload, options = excluded.options,
      missed = excluded.missed, next_at = excluded.next_at,
      updated_at = excluded.updated_at`,
  unschedule: "DELETE FROM outbox_schedules WHERE name = $1 RETURNING name",
  schedules: `SELECT name, cron, timezone, queue, payload, options, missed,
      next_at, last_at
    FROM outbox_schedules ORDER BY name`,
  anyDue: `SELECT n.now, EXISTS (SELECT 1 FROM outbox_schedules
      WHERE next_at <= n.now)::integer AS due
    FROM (SELECT coalesce($1::bigint, ${NOW}) AS now) AS n`,
  // Another runner's schedules are skipped: it enqueues their ticks.
  due: `SELECT name, cron, timezone, queue, payload, options, missed,
      next_at, last_at
    FROM outbox_schedules WHERE next_at <= $1::bigint ORDER BY name
    FOR UPDATE SKIP LOCKED`,
  advance: `UPDATE outbox_schedules
    SET next_at = $2::bigint, last_at = $3::bigint, updated_at = $4::bigint
    WHERE name = $1`,
};
