/**
 * The admin side of an outbox: listing events, cancelling, redriving and
 * purging them, counting queues. This file holds their shapes, constants
 * and row mapping; each dialect holds their SQL (SQLite's in
 * `dialects/sqlite/admin.ts`), and `core/admin.ts` runs them under the
 * outbox's write lock.
 *
 * The names follow the peers operators know: pg-boss's `redrive()` and SQS's
 * dead-letter redrive, and purge by age as a duration (`olderThanMs`), like
 * every other `…Ms` option.
 *
 * @module
 */
import { integerOf, type Row, type SqlValue } from "./driver.ts";
import type { EventState } from "./types.ts";
import type { Explanation, LedgerEntry } from "./core/shapes.ts";
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
   * Paging cursor: the last id of the previous page. By id, only events
   * with a larger id; by enqueue time, only events after that one in that
   * order (an event since purged stands at its nearest predecessor's
   * place). @default {0}
   */
  readonly afterId?: number;
  /**
   * The listing's order: `"id"`, or `"enqueued"` (enqueue time, then id),
   * which on SQLite reads a page with one seek per queue of the state index
   * however large the table, as the dashboard's pages do.
   *
   * @default {"id"}
   */
  readonly order?: "id" | "enqueued";
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
  /** Only queues whose name starts with this. @default {every queue} */
  readonly prefix?: string;
  /**
   * Paging cursor: only queues named after this one (in the engine's
   * order of names). Pass the last queue of the previous page.
   *
   * @default {from the first queue}
   */
  readonly after?: string;
  /** Most queues to return, 1–10000. @default {every queue} */
  readonly limit?: number;
}

/** Options of {@linkcode Outbox.countQueues} and `OutboxReader.countQueues`. */
export interface CountQueuesOptions {
  /** Only queues whose name starts with this. @default {every queue} */
  readonly prefix?: string;
  /**
   * The count stops here (a count equal to it means "at least"), so the
   * call costs the same however many queues there are. 1 to 2^53 - 1.
   *
   * @default {exact}
   */
  readonly upTo?: number;
}

/** The most queues one page of `queues()` may ask for. */
const MAX_QUEUES_PAGE = 10_000;

/** The statement and parameters of `queues(options)`. */
export function queuesStatement(
  sql: {
    readonly queues: string;
    readonly queuesUpTo?: string;
    readonly queuesPage: string;
  },
  options: QueuesOptions,
): [string, SqlValue[]] {
  const op = "count queues";
  checkOptions(op, options, ["countUpTo", "prefix", "after", "limit"]);
  const upTo = checkInteger(
    op,
    "countUpTo",
    options.countUpTo,
    1,
    Number.MAX_SAFE_INTEGER,
  );
  const prefix = prefixOf(op, options.prefix);
  const after = options.after === undefined
    ? ""
    : checkName(op, "after", options.after);
  const limit = checkInteger(op, "limit", options.limit, 1, MAX_QUEUES_PAGE);
  if (prefix !== "" || after !== "" || limit !== undefined) {
    return [sql.queuesPage, [
      upTo ?? null,
      prefix,
      after,
      limit ?? Number.MAX_SAFE_INTEGER,
    ]];
  }
  return upTo === undefined || sql.queuesUpTo === undefined
    ? [sql.queues, []]
    : [sql.queuesUpTo, [upTo]];
}

/** The statement and parameters of `countQueues(options)`. */
export function countQueuesStatement(
  sql: { readonly queueCount: string },
  options: CountQueuesOptions,
): [string, SqlValue[]] {
  const op = "count queues";
  checkOptions(op, options, ["prefix", "upTo"]);
  return [sql.queueCount, [
    prefixOf(op, options.prefix),
    checkInteger(op, "upTo", options.upTo, 1, Number.MAX_SAFE_INTEGER) ??
      Number.MAX_SAFE_INTEGER,
  ]];
}

/** A queue name prefix: `""` for every queue, else a valid name's start. */
function prefixOf(op: string, prefix: unknown): string {
  return prefix === undefined || prefix === ""
    ? ""
    : checkName(op, "prefix", prefix);
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
 * Builds an {@linkcode EventInfo} from a row of `Dialect.list`.
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
 * Folds `Dialect.queues` rows (one per queue and state) into one entry per
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
): [string | null, string] {
  const op = "find event by dedup key";
  return [
    queue === undefined ? null : checkName(op, "queue", queue),
    checkName(op, "dedupKey", dedupKey),
  ];
}

/** The statement of `eventIdByDedupKey(queue, key)`: one queue, or any. */
export function dedupKeyStatement(
  sql: {
    readonly dedupKeyEvent: string;
    readonly dedupKeyEventAnyQueue: string;
  },
  params: readonly [string | null, string],
): string {
  return params[0] === null ? sql.dedupKeyEventAnyQueue : sql.dedupKeyEvent;
}

/**
 * An event row (`Dialect.event`) and its ledger rows (`Dialect.history`) as an
 * {@linkcode Explanation}.
 *
 * @ignore
 * @param row The event's row.
 * @param history Its ledger rows, oldest first.
 * @returns The explanation.
 */
export function explanation(row: Row, history: readonly Row[]): Explanation {
  return {
    eventId: integerOf(row, "id"),
    identity: String(row["identity"]),
    queue: String(row["queue"]),
    state: row["state"] as EventState,
    attempt: integerOf(row, "attempt"),
    maxAttempts: integerOf(row, "max_attempts"),
    fence: integerOf(row, "fence"),
    lastError: nullableString(row["last_error"]),
    // An entry another program's row leaves without a time (a done row
    // written with no claimed_at) has nothing to tell: left out.
    history: history.filter((entry) => entry["at"] != null).map((entry) => ({
      kind: entry["kind"] as LedgerEntry["kind"],
      fence: integerOf(entry, "fence"),
      at: integerOf(entry, "at"),
      token: nullableString(entry["token"]),
      leaseUntil: entry["lease_until"] === null
        ? null
        : integerOf(entry, "lease_until"),
      detail: nullableString(entry["detail"]),
    })),
  };
}

/**
 * A stored payload as enqueued: JSON text parsed, a BLOB as a `Uint8Array`.
 *
 * @ignore
 * @param value The `payload` column.
 * @returns The payload.
 */
export function decodePayload(value: SqlValue | undefined): unknown {
  if (value instanceof Uint8Array) return value;
  if (typeof value === "string") return JSON.parse(value);
  return value === undefined ? null : value;
}

/** A nullable column as a string or `null`. */
export function nullableString(value: SqlValue | undefined): string | null {
  return value === null || value === undefined ? null : String(value);
}
