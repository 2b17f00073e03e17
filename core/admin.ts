/**
 * The admin and inspection calls of an {@linkcode Outbox}: listing, dead
 * letters, cancel, redrive, purge, queue counts, activity, dedup lookup,
 * stats and explain. Each runs its dialect's statements through the
 * outbox's write path (under the write lock, after lapsed last-attempt
 * leases became dead letters); the row shapes are `admin.ts`'s.
 *
 * @module
 */
import { integerOf } from "../driver.ts";
import { BusyError } from "../errors.ts";
import { allFlows, flowOf, withFlows } from "./flow.ts";
import {
  checkEventId,
  checkIdentity,
  checkInteger,
  checkName,
  checkOptions,
  describe,
  missing,
} from "../validate.ts";
import {
  type ActivityCount,
  activityCounts,
  activityParameters,
  CANCELLED,
  type CountQueuesOptions,
  countQueuesStatement,
  decodePayload,
  dedupKeyParameters,
  dedupKeyStatement,
  type EventInfo,
  eventInfo,
  explanation,
  type ListOptions,
  nullableString,
  PURGE_BATCH,
  type PurgeOptions,
  type QueueCounts,
  queueCounts,
  type QueuesOptions,
  queuesStatement,
  type RedriveOptions,
  storedPayload,
} from "../admin.ts";
import { listStatement, PURGE_OPTIONS } from "./arguments.ts";
import type { OutboxCore } from "./context.ts";
import type { LedgerRow } from "./ledger.ts";
import {
  type DeadLetter,
  type Explanation,
  MAX_BATCH,
  type Stats,
} from "./shapes.ts";

/** Lists dead letters of a queue, oldest first (`Outbox.deadLetters`). */
export async function deadLetters<P>(
  core: OutboxCore,
  options: { readonly queue?: string; readonly limit?: number },
): Promise<DeadLetter<P>[]> {
  const op = "list dead letters";
  checkOptions(op, options, ["queue", "limit"]);
  const queue = options.queue === undefined
    ? core.queue
    : checkName(op, "queue", options.queue);
  const limit = checkInteger(op, "limit", options.limit, 1, MAX_BATCH) ?? 100;
  return await core.write(op, async () => {
    const rows = await core.driver.query(core.sql.deadLetters, [
      queue,
      limit,
    ]);
    return rows.map((row) => ({
      eventId: integerOf(row, "id"),
      identity: String(row["identity"]),
      queue: String(row["queue"]),
      payload: storedPayload(row, decodePayload) as P,
      attempts: integerOf(row, "attempt"),
      lastError: nullableString(row["last_error"]),
      createdAt: integerOf(row, "created_at"),
      deadAt: integerOf(row, "done_at"),
    }));
  });
}

/** Lists events in one state, a page at a time (`Outbox.list`). */
export async function list<P>(
  core: OutboxCore,
  options: ListOptions,
): Promise<EventInfo<P>[]> {
  const op = "list events";
  const [sql, params] = listStatement(core.sql, op, options);
  return await core.write(op, async () => {
    const rows = await core.driver.query(sql, params);
    return rows.map((row) => eventInfo<P>(row, decodePayload));
  });
}

/** Cancels pending events (`Outbox.cancel`). */
export async function cancel(
  core: OutboxCore,
  eventIds: number | readonly number[],
): Promise<boolean | number[]> {
  const op = "cancel";
  const many = Array.isArray(eventIds);
  if (many && eventIds.length > MAX_BATCH) {
    throw new TypeError(
      `Cannot ${op} as 'eventIds' must be an array of at most ${MAX_BATCH} event ids: current value has ${eventIds.length}`,
    );
  }
  const ids = JSON.stringify(
    many
      ? Array.from(
        eventIds,
        (id, i) => checkEventId(op, id, `eventIds[${i}]`),
      )
      : [checkEventId(op, eventIds as number)],
  );
  const cancelled = await core.write(op, async (now) => {
    const rows = await core.driver.query(core.sql.cancel, [now, ids]);
    const events = rows.map((row) =>
      [integerOf(row, "id"), integerOf(row, "fence")] as const
    ).sort(([a], [b]) => a - b);
    await core.ledger.all(
      events.map(([id, fence]): LedgerRow => [
        id,
        fence,
        "dead",
        null,
        null,
        CANCELLED,
      ]),
      now,
    );
    return events.map(([id]) => id);
  });
  return many ? cancelled : cancelled.length > 0;
}

/** Makes dead letters claimable again (`Outbox.redrive`). */
export async function redrive(
  core: OutboxCore,
  options: RedriveOptions,
): Promise<number> {
  const op = "redrive";
  checkOptions(op, options, ["queue", "ids"]);
  const queue = options.queue === undefined
    ? null
    : checkName(op, "queue", options.queue);
  let ids: string | null = null;
  if (options.ids !== undefined) {
    if (!Array.isArray(options.ids) || options.ids.length > MAX_BATCH) {
      throw new TypeError(
        `Cannot ${op} as 'ids' must be an array of at most ${MAX_BATCH} event ids: current value is ${
          describe(options.ids)
        }`,
      );
    }
    ids = JSON.stringify(
      Array.from(options.ids, (id, i) => checkEventId(op, id, `ids[${i}]`)),
    );
  }
  return await core.write(op, async (now) => {
    const rows = await core.driver.query(core.sql.redrive, [
      now,
      queue,
      ids,
    ]);
    await core.ledger.all(
      rows.map((row): LedgerRow => [
        integerOf(row, "id"),
        integerOf(row, "fence"),
        "retried",
        null,
        null,
        null,
      ]),
      now,
    );
    return rows.length;
  });
}

/** Deletes old done events and dead letters in batches (`Outbox.purge`). */
export async function purge(
  core: OutboxCore,
  options: PurgeOptions,
): Promise<number> {
  const op = "purge";
  checkOptions(op, options, PURGE_OPTIONS);
  const olderThanMs = checkInteger(
    op,
    "olderThanMs",
    options.olderThanMs,
    0,
    Number.MAX_SAFE_INTEGER,
  ) ?? missing(op, "olderThanMs");
  const states = options.states === undefined
    ? ["done", "dead"]
    : options.states;
  if (
    !Array.isArray(states) || states.length === 0 ||
    !states.every((state) => state === "done" || state === "dead")
  ) {
    throw new TypeError(
      `Cannot ${op} as 'states' must be a non-empty array of "done" and "dead": current value is ${
        describe(states)
      }`,
    );
  }
  let cutoff: number | undefined;
  let deleted = 0;
  for (const state of new Set(states)) {
    for (;;) {
      const n = await core.write(op, async (now) => {
        cutoff ??= now - olderThanMs;
        const rows = await core.driver.query(core.sql.purgeable, [
          state,
          cutoff,
        ]);
        if (rows.length === 0) return 0;
        const ids = JSON.stringify(rows.map((row) => integerOf(row, "id")));
        await core.driver.run(core.sql.purgeLedger, [ids]);
        return (await core.driver.run(core.sql.purge, [ids])).changes;
      });
      deleted += n;
      if (n < PURGE_BATCH) break;
    }
  }
  return deleted;
}

/** Counts the events of every queue per state (`Outbox.queues`). */
export async function queues(
  core: OutboxCore,
  options: QueuesOptions,
): Promise<QueueCounts[]> {
  const [sql, params] = queuesStatement(core.sql, options);
  return await core.write(
    "count queues",
    async () =>
      withFlows(
        queueCounts(await core.driver.query(sql, params)),
        await allFlows(core.driver, flowOf(core.sql)),
      ),
  );
}

/** Counts the queues by a name prefix (`Outbox.countQueues`). */
export async function countQueues(
  core: OutboxCore,
  options: CountQueuesOptions,
): Promise<number> {
  const [sql, params] = countQueuesStatement(core.sql, options);
  return await core.write("count queues", async () => {
    const [row] = await core.driver.query(sql, params);
    return row === undefined ? 0 : integerOf(row, "n");
  });
}

/** Counts acknowledgements and failures per time bucket (`Outbox.activity`). */
export async function activity(
  core: OutboxCore,
  sinceMs: number,
  bucketMs: number,
): Promise<ActivityCount[]> {
  const params = activityParameters(sinceMs, bucketMs);
  return await core.write(
    "count activity",
    async () =>
      activityCounts(await core.driver.query(core.sql.activity, params)),
  );
}

/** Finds the event a queue holds under a dedup key (`Outbox.eventIdByDedupKey`). */
export async function eventIdByDedupKey(
  core: OutboxCore,
  queue: string | undefined,
  dedupKey: string,
): Promise<number | null> {
  const params = dedupKeyParameters(queue, dedupKey);
  const [row] = await core.write(
    "find event by dedup key",
    () => core.driver.query(dedupKeyStatement(core.sql, params), params),
  );
  return row === undefined ? null : integerOf(row, "id");
}

/** Counts the events of a queue per state (`Outbox.stats`, without the WAL). */
export async function stats(
  core: OutboxCore,
  options: { readonly queue?: string },
): Promise<Stats> {
  const op = "read stats";
  checkOptions(op, options, ["queue"]);
  const queue = options.queue === undefined
    ? core.queue
    : checkName(op, "queue", options.queue);
  const stats: Stats = await core.write(op, async (now) => {
    const counts: Record<string, number> = {
      pending: 0,
      leased: 0,
      done: 0,
      dead: 0,
    };
    let oldestPendingAgeMs = 0;
    for (const row of await core.driver.query(core.sql.stats, [queue])) {
      counts[String(row["state"])] = integerOf(row, "n");
      if (row["state"] === "pending") {
        oldestPendingAgeMs = Math.max(0, now - integerOf(row, "oldest"));
      }
    }
    return {
      pending: counts["pending"] ?? 0,
      leased: counts["leased"] ?? 0,
      done: counts["done"] ?? 0,
      dead: counts["dead"] ?? 0,
      oldestPendingAgeMs,
    };
  });
  return stats;
}

/** One event's state and ledger (`Outbox.explain`). */
export async function explain(
  core: OutboxCore,
  event: number | string,
): Promise<Explanation | null> {
  const [sql, key] = typeof event === "string"
    ? [core.sql.eventByIdentity, checkIdentity("explain", "event", event)]
    : [
      core.sql.event,
      checkInteger("explain", "event", event, 1, Number.MAX_SAFE_INTEGER) ??
        missing("explain", "event"),
    ];
  return await core.write("explain", async () => {
    const [row] = await core.driver.query(sql, [key]);
    if (row === undefined) return null;
    const history = await core.driver.query(core.sql.history, [row["id"]!]);
    return explanation(row, history);
  });
}

/**
 * How long until the next not-yet-due event of a queue comes due, by the
 * outbox's clock (`Outbox.nextDueInMs`): one read outside a transaction,
 * falling back to the write path when the database is busy.
 */
export async function nextDueInMs(
  core: OutboxCore,
  options: { readonly queue?: string },
): Promise<number | null> {
  const op = "find the next due time";
  checkOptions(op, options, ["queue"]);
  const queue = options.queue === undefined
    ? core.queue
    : checkName(op, "queue", options.queue);
  const read = async (now: number | null) => {
    const [row] = await core.driver.query(core.sql.nextDue, [queue, now]);
    const at = core.checkNow(op, row?.["now"]);
    return row?.["due_at"] == null ? null : integerOf(row, "due_at") - at;
  };
  // A read alone: a lapsed last-attempt lease is due already, so making it
  // a dead letter first would not change the answer.
  return await core.write(op, read, {
    expire: false,
    inOne: (now) =>
      read(now).catch((error) => {
        if (error instanceof BusyError) return undefined;
        throw error;
      }),
  });
}
