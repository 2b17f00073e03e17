/**
 * The admin side of an outbox: listing events, cancelling, redriving and
 * purging them, counting queues. This file holds their shapes, SQL and row
 * mapping, apart from the lease rules; {@linkcode Outbox} runs them under its
 * write lock and validates their arguments with the lease rules' helpers.
 *
 * The names follow the peers operators know: pg-boss's `redrive()` and SQS's
 * dead-letter redrive, and purge by age as a duration (`olderThanMs`), like
 * every other `…Ms` option.
 *
 * @module
 */
import { integerOf, type Row, type SqlValue } from "./driver.ts";
import type { EventState } from "./lease.ts";
import { checkInteger, checkName, checkOptions } from "./validate.ts";

/** Options of {@linkcode Outbox.list}. */
export interface ListOptions {
  /** Which events to list. */
  readonly state: EventState;
  /** Only this queue's events. @default {every queue} */
  readonly queue?: string;
  /** Most events to return, 1–10000. @default {100} */
  readonly limit?: number;
  /**
   * Paging cursor: only events with a larger id. Pass the last id of the
   * previous page. @default {0}
   */
  readonly afterId?: number;
}

/** One event as {@linkcode Outbox.list} reports it. */
export interface EventInfo<P = unknown> {
  /** The event's id. */
  readonly id: number;
  /** The event's identity (UUID text): what recipients dedupe on. */
  readonly identity: string;
  /** The queue it is in. */
  readonly queue: string;
  /** Its state. */
  readonly state: EventState;
  /** Attempts made since it was enqueued or redriven. */
  readonly attempt: number;
  /** Attempts allowed before it becomes a dead letter. */
  readonly maxAttempts: number;
  /**
   * When it can next be claimed, epoch milliseconds: the end of its delay or
   * backoff while pending, its lease deadline while leased.
   */
  readonly dueAt: number;
  /** The lease deadline while leased, else `null`. */
  readonly leaseUntil: number | null;
  /** The last error (a release's, `"lease expired"`, `"cancelled"`), or `null`. */
  readonly lastError: string | null;
  /** When it was enqueued, epoch milliseconds. */
  readonly createdAt: number;
  /** When its row last changed, epoch milliseconds. */
  readonly updatedAt: number;
  /**
   * The payload as enqueued; the stored text itself when it is not JSON
   * (written by another program), so a listing never fails on one row.
   */
  readonly payload: P;
  /** The ordering key, or `null`. */
  readonly orderingKey: string | null;
  /** The dedup key, or `null`. */
  readonly dedupKey: string | null;
}

/** Options of {@linkcode Outbox.redrive}. */
export interface RedriveOptions {
  /** Only this queue's dead letters. @default {every queue} */
  readonly queue?: string;
  /** Only these events (at most 10000 ids); others named here are left alone. @default {every dead letter} */
  readonly ids?: readonly number[];
}

/** Options of {@linkcode Outbox.purge}. */
export interface PurgeOptions {
  /**
   * Minimum age in milliseconds, counted from when an event was acknowledged
   * or became a dead letter: older ones are deleted. `0` deletes all of them.
   */
  readonly olderThanMs: number;
  /** Which finished events to delete. @default {["done", "dead"]} */
  readonly states?: readonly ("done" | "dead")[];
}

/** One queue's counts, from {@linkcode Outbox.queues}. */
export interface QueueCounts {
  /** The queue's name. */
  readonly queue: string;
  /** Events waiting to be claimed (due or delayed). */
  readonly pending: number;
  /** Events under a lease, live or lapsed. */
  readonly leased: number;
  /** Acknowledged events not yet purged. */
  readonly done: number;
  /** Dead letters. */
  readonly dead: number;
  /** When the oldest pending event was enqueued, epoch milliseconds, or `null`. */
  readonly oldestPendingAt: number | null;
  /** `true` while the queue is paused (`Outbox.pause`); absent otherwise. */
  readonly paused?: true;
  /** The queue's per-key concurrency limit (`Outbox.setLimits`), when set. */
  readonly perKey?: number;
  /** The queue's rate limit in claims per second, when set. */
  readonly perSecond?: number;
}

/** Options of {@linkcode Outbox.queues} and `OutboxReader.queues`. */
export interface QueuesOptions {
  /**
   * Counts stop at this many events per queue and state (a count equal to
   * it means "at least"), so the call costs the same on a table of any
   * size; the dashboard's overview passes 10,000. On PostgreSQL the counts
   * are exact whatever it says. 1 to 2^53 - 1.
   *
   * @default {exact counts}
   */
  readonly countUpTo?: number;
}

/** The statement and parameters of `queues(options)`. */
export function queuesStatement(
  sql: { readonly queues: string; readonly queuesUpTo?: string },
  options: QueuesOptions,
): [string, SqlValue[]] {
  const op = "count queues";
  checkOptions(op, options, ["countUpTo"]);
  const upTo = checkInteger(
    op,
    "countUpTo",
    options.countUpTo,
    1,
    Number.MAX_SAFE_INTEGER,
  );
  return upTo === undefined || sql.queuesUpTo === undefined
    ? [sql.queues, []]
    : [sql.queuesUpTo, [upTo]];
}

/** The last error of a cancelled event: a dead letter, so it stays listed and can be redriven. */
export const CANCELLED = "cancelled";

/** The last error of an event whose lease lapsed before it was acknowledged. */
export const LEASE_EXPIRED = "lease expired";

/**
 * Rows {@linkcode Outbox.purge} deletes per transaction: short write locks
 * keep claims on other connections fast while a large backlog is purged.
 */
export const PURGE_BATCH = 1_000;

/** The admin statements, exported for the query-plan tests only. */
export const ADMIN_SQL = {
  // Acknowledgements per queue since ?1; the retention index
  // (outbox_events_done) serves it.
  acknowledgedSince: `SELECT queue, count(*) AS n FROM outbox_events
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
  // ?2 NULL: every queue. Paged by id, the primary key.
  list:
    `SELECT id, identity, queue, state, attempt, max_attempts, due_at, lease_until,
      last_error, created_at, updated_at, payload, ordering_key, dedup_key
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
  queuesUpTo: `WITH RECURSIVE q(queue) AS (
      SELECT min(queue) FROM outbox_events
      UNION ALL
      SELECT (SELECT min(queue) FROM outbox_events WHERE queue > q.queue)
      FROM q WHERE q.queue IS NOT NULL),
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

/**
 * A stored payload read back for listing: decoded by `decode`, or the
 * stored text itself when that is not JSON (written by another program, or
 * an event a claim made a dead letter for it), so one row never fails a
 * listing.
 *
 * @param row A row with `payload` and `payload_bytes`.
 * @param decode Decodes a stored payload.
 * @returns The payload.
 */
export function storedPayload(
  row: Row,
  decode: (value: SqlValue | undefined) => unknown,
): unknown {
  try {
    return decode(row["payload_bytes"] ?? row["payload"]);
  } catch {
    return row["payload"];
  }
}

/**
 * Builds an {@linkcode EventInfo} from a row of `ADMIN_SQL.list`.
 *
 * @param row The row.
 * @param decode Decodes a stored payload; its errors leave the text as is.
 * @returns The event as listed.
 */
export function eventInfo<P>(
  row: Row,
  decode: (value: SqlValue | undefined) => unknown,
): EventInfo<P> {
  const state = String(row["state"]) as EventState;
  const payload = storedPayload(row, decode);
  return {
    id: integerOf(row, "id"),
    identity: String(row["identity"]),
    queue: String(row["queue"]),
    state,
    attempt: integerOf(row, "attempt"),
    maxAttempts: integerOf(row, "max_attempts"),
    dueAt: integerOf(row, "due_at"),
    // An acknowledgement keeps lease_until in the row (the ledger reads it).
    leaseUntil: state === "leased" ? integerOf(row, "lease_until") : null,
    lastError: text(row["last_error"]),
    createdAt: integerOf(row, "created_at"),
    updatedAt: integerOf(row, "updated_at"),
    payload: payload as P,
    orderingKey: text(row["ordering_key"]),
    dedupKey: text(row["dedup_key"]),
  };
}

/**
 * Folds `ADMIN_SQL.queues` rows (one per queue and state) into one entry per
 * queue, in name order.
 *
 * @param rows The rows.
 * @returns The counts per queue.
 */
export function queueCounts(rows: readonly Row[]): QueueCounts[] {
  const byQueue = new Map<string, {
    queue: string;
    pending: number;
    leased: number;
    done: number;
    dead: number;
    oldestPendingAt: number | null;
  }>();
  for (const row of rows) {
    const queue = String(row["queue"]);
    let counts = byQueue.get(queue);
    if (counts === undefined) {
      counts = {
        queue,
        pending: 0,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: null,
      };
      byQueue.set(queue, counts);
    }
    const state = String(row["state"]) as EventState;
    counts[state] = integerOf(row, "n");
    if (state === "pending") counts.oldestPendingAt = integerOf(row, "oldest");
  }
  return [...byQueue.values()];
}

function text(value: SqlValue | undefined): string | null {
  return value === null || value === undefined ? null : String(value);
}

/** One bucket of {@linkcode OutboxReader.activity}. */
export interface ActivityCount {
  /** The bucket's start, epoch milliseconds (a multiple of its width). */
  readonly at: number;
  /** Events acknowledged in it. */
  readonly done: number;
  /** Attempts failed in it: releases with an error, lapsed leases. */
  readonly failed: number;
}

/** Checks `activity()`'s arguments: `[sinceMs, bucketMs]` for its statement. */
export function activityParameters(
  sinceMs: unknown,
  bucketMs: unknown,
): [number, number] {
  const op = "count activity";
  return [
    checkInteger(op, "sinceMs", sinceMs, 0, Number.MAX_SAFE_INTEGER) ?? 0,
    checkInteger(op, "bucketMs", bucketMs, 1, 86_400_000) ?? 0,
  ];
}

/** Maps the `activity` statement's rows. */
export function activityCounts(rows: readonly Row[]): ActivityCount[] {
  return rows.map((row) => ({
    at: integerOf(row, "at"),
    done: integerOf(row, "done"),
    failed: integerOf(row, "failed"),
  }));
}

/** Checks `eventIdByDedupKey()`'s arguments, for its statement. */
export function dedupKeyParameters(
  queue: unknown,
  dedupKey: unknown,
): [string, string] {
  const op = "find event by dedup key";
  return [checkName(op, "queue", queue), checkName(op, "dedupKey", dedupKey)];
}
