/**
 * Flow control of a queue, stored in the database so every connection and
 * process honours it at once: pause and resume, a per-key concurrency
 * limit, and a rate limit kept as a token bucket (its state in the queue's
 * row of `outbox_queues`, judged by the outbox's clock). `lease.ts`'s
 * claim asks {@linkcode openGate} what it may take; the dialects spell the
 * statements ({@linkcode FlowStatements}).
 *
 * @module
 */
import type { Driver, Row, SqlValue } from "../driver.ts";
import type { QueueCounts } from "../admin.ts";
import { checkName, checkOptions, describe } from "../validate.ts";

import type { FlowStatements } from "../types.ts";
export type { FlowStatements };

/** The largest accepted `priority` (and the negated smallest). */
export const MAX_PRIORITY = 2_147_483_647;
/** The largest accepted `perKey` or `perSecond`. */
export const MAX_LIMIT = 1_000_000;

/** Limits of a queue, for {@linkcode Outbox.setLimits}. */
export interface QueueLimits {
  /**
   * Most events of one `concurrencyKey` leased at once, across every
   * connection and process; `null` clears it. Events without a key are not
   * limited. Absent: unchanged.
   */
  readonly perKey?: number | null;
  /**
   * Most claims per second from the queue, across every connection and
   * process (a token bucket of that many tokens, refilled continuously,
   * by the outbox's clock); `null` clears it. Absent: unchanged.
   */
  readonly perSecond?: number | null;
}

/** What flow control a queue has, as {@linkcode Outbox.queues} and `limits()` tell. */
export interface QueueFlow {
  /** Whether claims from the queue return nothing. */
  readonly paused: boolean;
  /** The per-key concurrency limit, or `null`. */
  readonly perKey: number | null;
  /** The rate limit in claims per second, or `null`. */
  readonly perSecond: number | null;
}

/** A queue's flow when nothing is set. */
export const UNLIMITED: QueueFlow = {
  paused: false,
  perKey: null,
  perSecond: null,
};

/**
 * Validates a priority: an integer from -2147483647 to 2147483647.
 *
 * @ignore
 */
export function checkPriority(op: string, field: string, value: unknown) {
  if (value === undefined) return 0;
  if (typeof value !== "number") {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be an integer: current value is ${
        describe(value)
      }`,
    );
  }
  if (!Number.isInteger(value) || Math.abs(value) > MAX_PRIORITY) {
    throw new RangeError(
      `Cannot ${op} as '${field}' must be an integer from -${MAX_PRIORITY} to ${MAX_PRIORITY}: current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

/** A checked `setLimits` call: which limits change, to what. */
export interface CheckedLimits {
  readonly queue: string;
  readonly perKey?: number | null;
  readonly perSecond?: number | null;
}

/**
 * Validates `setLimits`'s arguments.
 *
 * @ignore
 */
export function checkLimits(
  op: string,
  queue: unknown,
  limits: unknown,
): CheckedLimits {
  const name = checkName(op, "queue", queue);
  checkOptions(op, limits, ["perKey", "perSecond"]);
  const { perKey, perSecond } = limits as QueueLimits;
  const limit = (field: string, value: unknown) => {
    if (value === null) return null;
    if (typeof value !== "number") {
      throw new TypeError(
        `Cannot ${op} as '${field}' must be a positive integer or null: current value is ${
          describe(value)
        }`,
      );
    }
    if (!Number.isInteger(value) || value < 1 || value > MAX_LIMIT) {
      throw new RangeError(
        `Cannot ${op} as '${field}' must be a positive integer at most ${MAX_LIMIT} or null: current value is ${
          describe(value)
        }`,
      );
    }
    return value;
  };
  return {
    queue: name,
    ...perKey === undefined ? {} : { perKey: limit("perKey", perKey) },
    ...perSecond === undefined
      ? {}
      : { perSecond: limit("perSecond", perSecond) },
  };
}

/** Reads a settings row (paused, per_key, per_second) as a {@linkcode QueueFlow}. */
export function queueFlow(row: Row | undefined): QueueFlow {
  if (row === undefined) return UNLIMITED;
  const int = (value: SqlValue | undefined) =>
    value === null || value === undefined ? null : Number(value);
  return {
    paused: Number(row["paused"]) === 1,
    perKey: int(row["per_key"]),
    perSecond: int(row["per_second"]),
  };
}

/** Pauses (or resumes) a queue. Runs inside the caller's transaction. */
export async function setPaused(
  driver: Driver,
  sql: FlowStatements,
  queue: string,
  paused: boolean,
  now: number,
): Promise<void> {
  await driver.run(sql.pause, [queue, paused ? 1 : 0, now]);
  await driver.run(sql.prune, [queue]);
}

/** Sets a queue's limits. Runs inside the caller's transaction. */
export async function setLimits(
  driver: Driver,
  sql: FlowStatements,
  limits: CheckedLimits,
  now: number,
): Promise<void> {
  await driver.run(sql.limits, [
    limits.queue,
    "perKey" in limits ? 1 : 0,
    limits.perKey ?? null,
    "perSecond" in limits ? 1 : 0,
    limits.perSecond ?? null,
    now,
  ]);
  await driver.run(sql.prune, [limits.queue]);
}

/**
 * A dialect's flow statements, or an `Error` when it spells none (a
 * driver's own dialect written before flow control).
 */
export function flowOf(
  sql: { readonly flow?: FlowStatements },
): FlowStatements {
  const flow = sql.flow;
  if (flow === undefined) {
    throw new Error(
      "Cannot control the flow of a queue as this driver's dialect spells no flow statements",
    );
  }
  return flow;
}

/** Every queue's flow that has any set, by queue. */
export async function allFlows(
  driver: Driver,
  sql: FlowStatements,
): Promise<Map<string, QueueFlow>> {
  const rows = await driver.query(sql.allSettings);
  return new Map(rows.map((row) => [String(row["queue"]), queueFlow(row)]));
}

/**
 * What one claim may take from a queue: `max` (0 when paused or out of
 * tokens), the per-key limit the candidates statement filters by, and
 * {@linkcode Gate.admit}, which trims the candidates to the limits and
 * spends their tokens.
 */
export interface Gate {
  readonly max: number;
  readonly perKey: number | null;
  /** Whether {@linkcode Gate.admit} passed over a candidate for its key. */
  readonly keyTrimmed: boolean;
  admit(candidates: readonly Row[]): Promise<Row[]>;
}

/**
 * Opens the gate of one claim: reads the queue's settings inside the
 * claim's transaction (on PostgreSQL locking them, so claims under limits
 * take turns and count exactly). The bucket holds `perSecond` tokens at
 * most and refills at `perSecond` a second from `refilled_at`; a clock
 * stepping back refills nothing.
 *
 * @ignore
 */
export async function openGate(
  driver: Driver,
  sql: FlowStatements,
  queue: string,
  now: number,
  max: number,
): Promise<Gate> {
  const [row] = await driver.query(sql.settings, [queue]);
  if (row === undefined) {
    return {
      max,
      perKey: null,
      keyTrimmed: false,
      admit: (rows) => Promise.resolve([...rows]),
    };
  }
  const flow = queueFlow(row);
  if (flow.paused) {
    return {
      max: 0,
      perKey: null,
      keyTrimmed: false,
      admit: () => Promise.resolve([]),
    };
  }
  let tokens = Infinity;
  let refilledAt = now;
  if (flow.perSecond !== null) {
    refilledAt = Math.max(now, Number(row["refilled_at"] ?? now));
    const elapsed = Math.max(0, now - Number(row["refilled_at"] ?? now));
    tokens = Math.min(
      flow.perSecond,
      Number(row["tokens"] ?? flow.perSecond) + elapsed * flow.perSecond / 1000,
    );
  }
  const whole = Math.floor(tokens);
  const gate = {
    max: Math.min(max, whole),
    perKey: flow.perKey,
    keyTrimmed: false,
    async admit(candidates: readonly Row[]) {
      const taken = new Map<string, number>();
      const admitted = candidates.filter((row) => {
        const key = row["concurrency_key"];
        if (flow.perKey === null || key === null || key === undefined) {
          return true;
        }
        const held = (taken.get(String(key)) ?? Number(row["held"] ?? 0)) + 1;
        taken.set(String(key), held);
        if (held <= flow.perKey) return true;
        gate.keyTrimmed = true;
        return false;
      }).slice(0, whole);
      // Written under a per-key limit too: on PostgreSQL, a one-statement
      // claim waiting for the row learns from its new version that its
      // snapshot misses these leases (dialects/postgres_flow.ts).
      if (admitted.length > 0) {
        await driver.run(sql.take, [
          queue,
          flow.perSecond === null ? null : tokens - admitted.length,
          refilledAt,
        ]);
      }
      return admitted;
    },
  };
  return gate;
}

/**
 * Trims a claim's candidates to what `gate` admits, keeping each one's
 * decoded payload (`payloads[i]` is `candidates[i]`'s) beside it.
 *
 * @ignore
 */
export async function admit(
  gate: Gate,
  candidates: Row[],
  payloads: unknown[],
): Promise<[Row[], unknown[]]> {
  const admitted = await gate.admit(candidates);
  if (admitted.length === candidates.length) return [candidates, payloads];
  const kept = new Set(admitted);
  return [admitted, payloads.filter((_, i) => kept.has(candidates[i]!))];
}

/**
 * Adds each queue's flow control to its counts (`paused`, `perKey`,
 * `perSecond`, present only when set), listing a queue that has flow
 * control but no events with zero counts, in name order.
 *
 * @ignore
 */
export function withFlows(
  counts: readonly QueueCounts[],
  flows: ReadonlyMap<string, QueueFlow>,
): QueueCounts[] {
  const byQueue = new Map(counts.map((c) => [c.queue, c]));
  for (const queue of flows.keys()) {
    if (!byQueue.has(queue)) {
      byQueue.set(queue, {
        queue,
        pending: 0,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: null,
      });
    }
  }
  return [...byQueue.values()].sort((a, b) =>
    a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0
  ).map((c) => {
    const flow = flows.get(c.queue);
    if (flow === undefined) return c;
    return {
      ...c,
      ...flow.paused ? { paused: true as const } : {},
      ...flow.perKey === null ? {} : { perKey: flow.perKey },
      ...flow.perSecond === null ? {} : { perSecond: flow.perSecond },
    };
  });
}
