/**
 * The checks of the {@linkcode Outbox} calls' arguments, made before any
 * SQL: the options each call knows, a lease's fields, an event's payload
 * and options (encoded as stored), a batch, a listing's parameters.
 *
 * @module
 */
import { integerOf, type Row, type SqlValue } from "../driver.ts";
import { UnsafeIntegerError } from "../errors.ts";
import { decodePayload } from "../admin.ts";
import type { Dialect, EventState } from "../types.ts";
import {
  checkBoolean,
  checkDriver,
  checkError,
  checkIdentity,
  checkInteger,
  checkName,
  checkOptions,
  checkState,
  checkToken,
  describe,
  missing,
} from "../validate.ts";
import type { ListOptions } from "../admin.ts";
import { payloadSize, type PreparedEnqueue } from "./enqueue.ts";
import { encodePayload } from "./payload.ts";
import type { CheckedLease } from "./ledger.ts";
import { checkPriority } from "./flow.ts";
import {
  type BatchClaimOptions,
  type BatchEvent,
  type ClaimOptions,
  type Clock,
  type EnqueueOptions,
  MAX_ATTEMPTS,
  MAX_BATCH,
  MAX_DURATION_MS,
  MAX_PAYLOAD_BYTES,
  type OutboxOptions,
  type ReleaseOptions,
} from "./shapes.ts";

// The most payload (bytes counted twice: they travel as hex) one
// enqueueBatch carries.
const MAX_BATCH_BYTES = 128 * 1024 * 1024;

/** What an event takes from its outbox when its options name nothing. */
export interface EnqueueDefaults {
  readonly queue: string;
  readonly maxAttempts: number;
  readonly maxPayloadBytes: number;
}

/**
 * Validates one event's payload and options; `element` names an element
 * of a batch (`"events[3]"`) in the messages.
 */
export function prepareEnqueue(
  op: string,
  payload: unknown,
  options: EnqueueOptions,
  defaults: EnqueueDefaults,
  element?: string,
): PreparedEnqueue {
  checkOptions(op, options, ENQUEUE_OPTIONS, element);
  const f = (field: string) =>
    element === undefined ? field : `${element}.${field}`;
  const queue = options.queue === undefined
    ? defaults.queue
    : checkName(op, f("queue"), options.queue);
  const delayMs =
    checkInteger(op, f("delayMs"), options.delayMs, 0, MAX_DURATION_MS) ??
      0;
  const maxAttempts = checkInteger(
    op,
    f("maxAttempts"),
    options.maxAttempts,
    1,
    MAX_ATTEMPTS,
  ) ?? defaults.maxAttempts;
  const dedupKey = options.dedupKey === undefined
    ? null
    : checkName(op, f("dedupKey"), options.dedupKey);
  const orderingKey = options.orderingKey === undefined
    ? null
    : checkName(op, f("orderingKey"), options.orderingKey);
  const identity = options.identity === undefined
    ? null
    : checkIdentity(op, f("identity"), options.identity);
  const priority = checkPriority(op, f("priority"), options.priority);
  const concurrencyKey = options.concurrencyKey === undefined
    ? null
    : checkName(op, f("concurrencyKey"), options.concurrencyKey);
  const stored = encodePayload(
    op,
    f("payload"),
    payload,
    defaults.maxPayloadBytes,
  );
  // Times are filled in under the write lock, from the clock at that moment.
  return {
    queue,
    payload: stored,
    dedupKey,
    orderingKey,
    identity,
    delayMs,
    maxAttempts,
    priority,
    concurrencyKey,
  };
}

/** Validates the elements of a batch, naming each (`events[3]`). */
export function prepareBatch(
  op: string,
  events: unknown,
  defaults: EnqueueDefaults,
): PreparedEnqueue[] {
  if (!Array.isArray(events)) {
    throw new TypeError(
      `Cannot ${op} as 'events' must be an array: current value is ${
        describe(events)
      }`,
    );
  }
  checkInteger(op, "events.length", events.length, 0, MAX_BATCH);
  // Array.from visits holes, so a sparse array is refused by index.
  const prepared = Array.from(events, (event: unknown, i) => {
    const element = `events[${i}]`;
    if (event === null || typeof event !== "object") {
      // Refused with the message every options object gets.
      checkOptions(op, event, ENQUEUE_OPTIONS, element);
    }
    const { payload, ...options } = event as BatchEvent;
    return prepareEnqueue(op, payload, options, defaults, element);
  });
  // The batch travels as one JSON text (bytes as hex), which a JavaScript
  // string must hold: past about 512 MiB V8 refuses it, mid-call.
  const bytes = prepared.reduce((sum, event) => sum + payloadSize(event), 0);
  if (bytes > MAX_BATCH_BYTES) {
    throw new RangeError(
      `Cannot ${op} as 'events' must hold at most ${MAX_BATCH_BYTES} bytes of payload: current size is ${bytes} bytes (enqueue larger payloads one at a time)`,
    );
  }
  return prepared;
}

/** The options of {@linkcode Outbox.open}. @ignore */
export const OUTBOX_OPTIONS: readonly string[] = [
  "now",
  "queue",
  "leaseMs",
  "maxAttempts",
  "busyTimeoutMs",
  "maxPayloadBytes",
];
export const ENQUEUE_OPTIONS = [
  "queue",
  "delayMs",
  "maxAttempts",
  "dedupKey",
  "orderingKey",
  "identity",
  "priority",
  "concurrencyKey",
];
export const CLAIM_OPTIONS = ["queue", "leaseMs", "token", "max"];
export const BATCH_CLAIM_OPTIONS = ["queue", "leaseMs", "max"];
export const RELEASE_OPTIONS = ["delayMs", "error", "deadLetter", "attempted"];
export const PURGE_OPTIONS = ["olderThanMs", "states"];

/** A lease's event id, token and fence, checked; `field` names it in messages. */
export function checkLease(
  op: string,
  field: string,
  lease: unknown,
): CheckedLease {
  if (lease === null || typeof lease !== "object") {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be a Lease: current value is ${
        describe(lease)
      }`,
    );
  }
  const { eventId, token, fence } = lease as Record<string, unknown>;
  return {
    eventId: checkInteger(
      op,
      `${field}.eventId`,
      eventId,
      1,
      Number.MAX_SAFE_INTEGER,
    ) ??
      missing(op, `${field}.eventId`),
    token: checkToken(op, `${field}.token`, token),
    fence:
      checkInteger(op, `${field}.fence`, fence, 1, Number.MAX_SAFE_INTEGER) ??
        missing(op, `${field}.fence`),
  };
}

/**
 * Validates {@linkcode ListOptions} into the parameters of `Dialect.list`.
 *
 * @ignore
 * @param op What was being done, for the message.
 * @param options The options as passed.
 * @returns State, queue (`null`: all), afterId and limit.
 * @throws {TypeError | RangeError} When an option is invalid, naming it.
 */
export function listParameters(
  op: string,
  options: ListOptions,
): [EventState, string | null, number, number] {
  checkOptions(op, options, ["state", "queue", "limit", "afterId", "order"]);
  if (
    options.order !== undefined && options.order !== "id" &&
    options.order !== "enqueued"
  ) {
    throw new TypeError(
      `Cannot ${op} as 'order' must be "id" or "enqueued": current value is ${
        describe(options.order)
      }`,
    );
  }
  const state = checkState(op, options.state);
  const queue = options.queue === undefined
    ? null
    : checkName(op, "queue", options.queue);
  const limit = checkInteger(op, "limit", options.limit, 1, MAX_BATCH) ?? 100;
  const afterId = checkInteger(
    op,
    "afterId",
    options.afterId,
    0,
    Number.MAX_SAFE_INTEGER,
  ) ?? 0;
  return [state, queue, afterId, limit];
}

/**
 * The statement and parameters of `list(options)`: by id (`Dialect.list`),
 * or by enqueue time with a queue or without (`listEnqueuedInQueue`,
 * `listEnqueued`).
 *
 * @ignore
 * @param sql The engine's statements.
 * @param op What was being done, for the message.
 * @param options The options as passed.
 * @returns The statement and its parameters.
 * @throws {TypeError | RangeError} When an option is invalid, naming it.
 */
export function listStatement(
  sql: Dialect,
  op: string,
  options: ListOptions,
): [string, SqlValue[]] {
  const params = listParameters(op, options);
  if (options.order !== "enqueued") return [sql.list, params];
  return [
    params[1] === null ? sql.listEnqueued : sql.listEnqueuedInQueue,
    params,
  ];
}

/** An outbox's settings: {@linkcode OutboxOptions} checked, defaults filled. */
export interface OutboxSettings {
  readonly now: Clock | "database";
  readonly queue: string;
  readonly leaseMs: number;
  readonly maxAttempts: number;
  readonly busyTimeoutMs: number;
  readonly maxPayloadBytes: number;
}

/**
 * Checks the options of `Outbox.open` (their names are checked before) on
 * an engine spelled by `sql`, filling in the defaults.
 */
export function outboxSettings(
  sql: Dialect,
  options: OutboxOptions,
): OutboxSettings {
  const op = "open outbox";
  // undefined only: null is refused, as for every other option.
  const now = options.now === undefined
    ? (sql.now ? "database" : Date.now)
    : options.now;
  if (
    typeof now !== "function" &&
    !(now === "database" && sql.now !== undefined)
  ) {
    throw new TypeError(
      `Cannot ${op} as 'now' must be a function: current value is ${
        describe(now)
      }`,
    );
  }
  const queue = options.queue === undefined
    ? "default"
    : checkName(op, "queue", options.queue);
  const leaseMs =
    checkInteger(op, "leaseMs", options.leaseMs, 1, MAX_DURATION_MS) ??
      30_000;
  const maxAttempts =
    checkInteger(op, "maxAttempts", options.maxAttempts, 1, MAX_ATTEMPTS) ??
      5;
  const busyTimeoutMs = checkInteger(
    op,
    "busyTimeoutMs",
    options.busyTimeoutMs,
    0,
    MAX_DURATION_MS,
  ) ?? 5_000;
  const maxPayloadBytes = checkInteger(
    op,
    "maxPayloadBytes",
    options.maxPayloadBytes,
    1,
    MAX_PAYLOAD_BYTES,
  ) ?? 1_048_576;
  return { now, queue, leaseMs, maxAttempts, busyTimeoutMs, maxPayloadBytes };
}

/** The queue and lease length a claim's options name, checked. */
export function claimTarget(
  op: string,
  options: { readonly queue?: string; readonly leaseMs?: number },
  defaults: { readonly queue: string; readonly leaseMs: number },
): { queue: string; leaseMs: number } {
  return {
    queue: options.queue === undefined
      ? defaults.queue
      : checkName(op, "queue", options.queue),
    leaseMs: checkInteger(op, "leaseMs", options.leaseMs, 1, MAX_DURATION_MS) ??
      defaults.leaseMs,
  };
}

/**
 * Checks leases given as an array, naming each (`leases[3]`); a sparse
 * array is refused by index, as `Array.from` visits holes.
 */
export function checkLeases(op: string, leases: unknown): CheckedLease[] {
  if (!Array.isArray(leases)) {
    throw new TypeError(
      `Cannot ${op} as 'leases' must be an array of leases: current value is ${
        describe(leases)
      }`,
    );
  }
  return Array.from(
    leases,
    (lease, i) => checkLease(op, `leases[${i}]`, lease),
  );
}

/**
 * Checks a claim's options (`Outbox.claim`): `max` (a batch) and `token`
 * exclude each other.
 */
export function claimArguments(
  op: string,
  options: ClaimOptions | BatchClaimOptions,
  defaults: { readonly queue: string; readonly leaseMs: number },
): {
  queue: string;
  leaseMs: number;
  max: number | undefined;
  token: string | undefined;
} {
  checkOptions(op, options, CLAIM_OPTIONS);
  const { queue, leaseMs } = claimTarget(op, options, defaults);
  if ("max" in options) {
    const max = checkInteger(op, "max", options.max, 1, MAX_BATCH) ?? 1;
    if ("token" in options && options.token !== undefined) {
      throw new TypeError(
        "Cannot claim as 'token' cannot be supplied with 'max': each lease gets its own",
      );
    }
    return { queue, leaseMs, max, token: undefined };
  }
  const token = options.token === undefined
    ? undefined
    : checkToken(op, "token", options.token);
  return { queue, leaseMs, max: undefined, token };
}

/** Checks a batch claim's options, `max` required (`acknowledgeAndClaim`). */
export function batchClaimArguments(
  op: string,
  options: BatchClaimOptions,
  defaults: { readonly queue: string; readonly leaseMs: number },
): { queue: string; leaseMs: number; max: number } {
  checkOptions(op, options, BATCH_CLAIM_OPTIONS);
  const { queue, leaseMs } = claimTarget(op, options, defaults);
  const max = checkInteger(op, "max", options.max, 1, MAX_BATCH) ??
    missing(op, "max");
  return { queue, leaseMs, max };
}

/** Checks a release's options (`Outbox.release`), filling the defaults. */
export function releaseArguments(
  op: string,
  options: ReleaseOptions,
): {
  delayMs: number;
  error: string | null;
  deadLetter: boolean;
  attempted: boolean;
} {
  checkOptions(op, options, RELEASE_OPTIONS);
  const delayMs =
    checkInteger(op, "delayMs", options.delayMs, 0, MAX_DURATION_MS) ?? 0;
  const error = options.error === undefined
    ? null
    : checkError(op, options.error);
  const deadLetter = checkBoolean(
    op,
    "deadLetter",
    options.deadLetter,
    false,
  );
  const attempted = checkBoolean(op, "attempted", options.attempted, true);
  return { delayMs, error, deadLetter, attempted };
}

/** Checks `Outbox.open`'s arguments: a driver object, known option names. */
export function checkOpenArguments(driver: unknown, options: unknown): void {
  checkDriver("open outbox", driver);
  checkOptions("open outbox", options, OUTBOX_OPTIONS);
}

/**
 * Decodes a candidate's payload into `payloads`; returns why the event
 * cannot be handed out instead, when it cannot.
 */
export function unclaimableReason(
  row: Row,
  payloads: unknown[],
  maxPayloadBytes: number,
): string | undefined {
  const bytes = integerOf(row, "bytes");
  if (bytes > maxPayloadBytes) {
    return `unclaimable: its payload of ${bytes} bytes exceeds this outbox's maxPayloadBytes of ${maxPayloadBytes}`;
  }
  try {
    payloads.push(decodePayload(row["payload_bytes"] ?? row["payload"]));
  } catch (error) {
    return `unclaimable: its payload is text but not JSON (${
      error instanceof Error ? error.message : "unreadable"
    })`;
  }
  return undefined;
}

/** `value + 1` for a fence or attempt a claim writes, refused past 2^53 - 1. */
export function successor(column: string, value: number): number {
  if (value >= Number.MAX_SAFE_INTEGER) {
    throw new UnsafeIntegerError(column, BigInt(value) + 1n);
  }
  return value + 1;
}
