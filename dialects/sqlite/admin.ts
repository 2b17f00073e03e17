/**
 * SQLite's admin statements: listing, cancel, redrive, purge, queue
 * counts, activity and the dedup lookup (`admin.ts` maps their rows;
 * `core/admin.ts` runs them). Part of the `SQLITE` dialect.
 *
 * @module
 */
import { CANCELLED, PURGE_BATCH } from "../../admin.ts";

const LIST_COLUMNS =
  "id, identity, queue, state, attempt, max_attempts, due_at, lease_until, last_error, created_at, updated_at, payload, ordering_key, dedup_key";

// The enqueue time of a page's cursor ?3: that event's, or (gone) its
// nearest predecessor's by id, one seek either way; before every event
// when there is none.
const CURSOR_AT = `coalesce((SELECT created_at FROM outbox_events
      WHERE id <= ?3 ORDER BY id DESC LIMIT 1), -9223372036854775808)`;

// Every queue, by name, each by a seek past the last (a loose index scan
// of the state index, which leads with the queue).
const EVERY_QUEUE = `q(queue) AS (
      SELECT min(queue) FROM outbox_events
      UNION ALL
      SELECT (SELECT min(queue) FROM outbox_events WHERE queue > q.queue)
      FROM q WHERE q.queue IS NOT NULL)`;

/** The admin statements on SQLite, spread into `SQLITE`. */
export const ADMIN_SQL = {
  // Acknowledgements per queue since ?1; the retention index
  // (outbox_events_done) serves it. Named: left to itself, SQLite walked the
  // whole state index instead, for its order by queue.
  acknowledgedSince: `SELECT queue, count(*) AS n
    FROM outbox_events INDEXED BY outbox_events_done
    WHERE state = 'done' AND done_at >= ?1 GROUP BY queue`,
  // Events acknowledged (the retention index outbox_events_done) and
  // attempts failed (releases with an error, lapsed leases) since ?1, per
  // ?2 milliseconds.
  activity:
    `SELECT (at / ?2) * ?2 AS at, sum(done) AS done, sum(failed) AS failed
    FROM (SELECT done_at AS at, 1 AS done, 0 AS failed FROM outbox_events
        WHERE state = 'done' AND done_at >= ?1
      UNION ALL
      SELECT at, 0, 1 FROM outbox_attempts WHERE at >= ?1
        AND (kind = 'expired' OR kind = 'released' AND detail IS NOT NULL))
    GROUP BY 1 ORDER BY 1`,
  // The dedup index (queue, dedup_key) answers it with one seek.
  dedupKeyEvent:
    `SELECT id FROM outbox_events WHERE queue = ?1 AND dedup_key = ?2`,
  // ?1 NULL: the first queue by name holding key ?2, a seek of the dedup
  // index per queue (each queue by a seek past the last).
  dedupKeyEventAnyQueue: `WITH RECURSIVE ${EVERY_QUEUE}
    SELECT e.id AS id FROM q, outbox_events AS e
    WHERE q.queue IS NOT NULL AND ?1 IS NULL AND e.queue = q.queue
      AND e.dedup_key = ?2
    LIMIT 1`,
  // ?2 NULL: every queue. Paged by id, the primary key.
  list: `SELECT ${LIST_COLUMNS}
    FROM outbox_events
    WHERE state = ?1 AND (?2 IS NULL OR queue = ?2) AND id > ?3
    ORDER BY id LIMIT ?4`,
  // ?2 a JSON array of ids. Only a pending event: a leased one has a
  // holder whose acknowledgement would be refused without telling it why.
  cancel: `UPDATE outbox_events
    SET state = 'dead', done_at = ?1, updated_at = ?1,
      last_error = '${CANCELLED}'
    WHERE id IN (SELECT value FROM json_each(?2)) AND state = 'pending'
    RETURNING id, fence`,
  // ?2 NULL: every queue; ?3 NULL: every id, else a JSON array of ids.
  redrive: `UPDATE outbox_events
    SET state = 'pending', attempt = 0, due_at = ?1, updated_at = ?1,
      done_at = NULL
    WHERE state = 'dead' AND (?2 IS NULL OR queue = ?2)
      AND (?3 IS NULL OR id IN (SELECT value FROM json_each(?3)))
    RETURNING id, fence`,
  // ?3 the last event of the previous page (its enqueue time read by a
  // primary-key seek, or its predecessor's if it is gone): a page by
  // (created_at, id), the order of the state index (queue, state,
  // created_at) and its rowid, so it is one seek; ?2 is the queue.
  listEnqueuedInQueue: `SELECT ${LIST_COLUMNS} FROM outbox_events
    WHERE queue = ?2 AND state = ?1
      AND (created_at, id) > (${CURSOR_AT}, ?3)
    ORDER BY created_at, id LIMIT ?4`,
  // The same page over every queue (?2 unused): a merge of each queue's
  // seek, so a page reads at most ?4 entries per queue, never a walk of
  // the table (the state index leads with the queue). Each queue by a seek
  // past the last, as in queuesUpTo.
  listEnqueued: `WITH RECURSIVE ${EVERY_QUEUE},
    c(at) AS (SELECT ${CURSOR_AT})
    SELECT ${LIST_COLUMNS.replace(/(\w+)/g, "e.$1")}
    FROM q, outbox_events AS e
    WHERE q.queue IS NOT NULL AND ?2 IS NULL AND e.id IN (SELECT i.id
        FROM outbox_events AS i
        WHERE i.queue = q.queue AND i.state = ?1
          AND (i.created_at, i.id) > ((SELECT at FROM c), ?3)
        ORDER BY i.created_at, i.id LIMIT ?4)
    ORDER BY e.created_at, e.id LIMIT ?4`,
  // A page of queues for the overview: ?2 a name prefix ('' for all), ?3
  // the last queue of the previous page ('' for the first), ?4 queues at
  // most; counts up to ?1 (NULL: exact), as queuesUpTo. Each queue by a
  // seek past the last, so a page costs ?4 seeks whatever the number of
  // queues.
  queuesPage: `WITH RECURSIVE q(queue) AS (
      SELECT (SELECT min(queue) FROM outbox_events
        WHERE queue >= ?2 AND queue > ?3)
      UNION ALL
      SELECT (SELECT min(queue) FROM outbox_events WHERE queue > q.queue)
      FROM q WHERE q.queue IS NOT NULL
        AND substr(q.queue, 1, length(?2)) = ?2
      LIMIT ?4),
    s(state) AS (VALUES ('pending'), ('leased'), ('done'), ('dead'))
    SELECT * FROM (SELECT q.queue AS queue, s.state AS state,
        (SELECT count(*) FROM (SELECT 1 FROM outbox_events AS e
          WHERE e.queue = q.queue AND e.state = s.state
          LIMIT coalesce(?1, -1))) AS n,
        (SELECT min(created_at) FROM outbox_events AS e
          WHERE e.queue = q.queue AND e.state = s.state) AS oldest
      FROM q, s WHERE q.queue IS NOT NULL
        AND substr(q.queue, 1, length(?2)) = ?2)
    WHERE n > 0 ORDER BY queue`,
  // The number of queues whose name starts with ?1, up to ?2: a seek per
  // queue.
  queueCount: `WITH RECURSIVE q(queue) AS (
      SELECT (SELECT min(queue) FROM outbox_events WHERE queue >= ?1)
      UNION ALL
      SELECT (SELECT min(queue) FROM outbox_events WHERE queue > q.queue)
      FROM q WHERE q.queue IS NOT NULL
        AND substr(q.queue, 1, length(?1)) = ?1
      LIMIT ?2)
    SELECT count(*) AS n FROM q WHERE q.queue IS NOT NULL
      AND substr(q.queue, 1, length(?1)) = ?1`,
  // A done event's age counts from its done_at, as the outbox_events_done
  // index has it; a dead letter's likewise.
  purgeable: `SELECT id FROM outbox_events
    WHERE state = ?1 AND done_at < ?2 LIMIT ${PURGE_BATCH}`,
  purgeLedger: `DELETE FROM outbox_attempts
    WHERE event_id IN (SELECT value FROM json_each(?1))`,
  purge: `DELETE FROM outbox_events
    WHERE id IN (SELECT value FROM json_each(?1))`,
  // The state index (queue, state, created_at) covers it.
  queues: `SELECT queue, state, count(*) AS n, min(created_at) AS oldest
    FROM outbox_events GROUP BY queue, state ORDER BY queue`,
  // Each queue by a seek past the last (a loose index scan of the state
  // index), then each state's count up to ?1 and oldest event by seeks.
  queuesUpTo: `WITH RECURSIVE ${EVERY_QUEUE},
    s(state) AS (VALUES ('pending'), ('leased'), ('done'), ('dead'))
    SELECT * FROM (SELECT q.queue AS queue, s.state AS state,
        (SELECT count(*) FROM (SELECT 1 FROM outbox_events AS e
          WHERE e.queue = q.queue AND e.state = s.state LIMIT ?1)) AS n,
        (SELECT min(created_at) FROM outbox_events AS e
          WHERE e.queue = q.queue AND e.state = s.state) AS oldest
      FROM q, s WHERE q.queue IS NOT NULL)
    WHERE n > 0 ORDER BY queue`,
  // The claim index (queue, priority DESC, due_at, id) answers it with one
  // seek per priority in use: p walks the queue's distinct priorities, a
  // seek each (a queue without priorities has one), and each level's
  // first event due after now is a seek. Answers `now` (?2) and `due_at`
  // (null when nothing is scheduled).
  nextDue: `WITH RECURSIVE p(v) AS (
      SELECT (SELECT priority FROM outbox_events INDEXED BY outbox_events_claim
        WHERE queue = ?1 AND state IN ('pending', 'leased')
        ORDER BY priority DESC LIMIT 1)
      UNION ALL
      SELECT (SELECT priority FROM outbox_events INDEXED BY outbox_events_claim
        WHERE queue = ?1 AND state IN ('pending', 'leased') AND priority < p.v
        ORDER BY priority DESC LIMIT 1)
      FROM p WHERE p.v IS NOT NULL)
    SELECT ?2 AS now, (SELECT min((SELECT due_at
        FROM outbox_events INDEXED BY outbox_events_claim
        WHERE queue = ?1 AND state IN ('pending', 'leased') AND priority = p.v
          AND due_at > ?2
        ORDER BY due_at LIMIT 1)) FROM p WHERE p.v IS NOT NULL) AS due_at`,
} as const;
