/**
 * The public shapes of the {@linkcode Outbox} API: its options, leases,
 * results and the limits its arguments are checked against. Types and
 * constants only; `lease.ts` and `mod.ts` re-export them.
 *
 * @module
 */
import type { Row, RunResult, SqlValue } from "../driver.ts";
import type { EnqueueResult, EventState } from "../types.ts";
import type { WalStats } from "../wal.ts";

/** Milliseconds since the Unix epoch, from an injected clock. */
export type Clock = () => number;

/** The longest accepted `leaseMs` or `delayMs`: 365 days in milliseconds. */
export const MAX_DURATION_MS = 31_536_000_000;
/** The largest accepted `maxAttempts`. */
export const MAX_ATTEMPTS = 1_000_000;
/** The largest accepted `max` of a batch claim. */
export const MAX_BATCH = 10_000;
/**
 * The largest accepted `maxPayloadBytes`: what a claim can really read back.
 * Measured on the WASM build over a file (4 GiB heap): a 256 MiB payload
 * enqueues and claims; a 384 MiB one enqueues but its claim fails with "out
 * of memory", since reading it back needs the engine's copy and JavaScript's.
 */
export const MAX_PAYLOAD_BYTES = 256 * 1024 * 1024;

/** Options fixed when an {@linkcode Outbox} is opened. */
export interface OutboxOptions {
  /**
   * The clock leases are judged by, in epoch milliseconds. Every worker
   * sharing a database must agree on it. `"database"` reads the database
   * server's clock at the start of each transaction, so workers on machines
   * whose clocks disagree still agree (the default when the driver's dialect
   * can read it: PostgreSQL's).
   *
   * @default {Date.now}
   */
  readonly now?: Clock | "database";
  /** Queue used when a call names none. @default {"default"} */
  readonly queue?: string;
  /** Lease length when a claim names none, in milliseconds. @default {30000} */
  readonly leaseMs?: number;
  /** Attempts per event before it becomes a dead letter. @default {5} */
  readonly maxAttempts?: number;
  /**
   * How long a call waits for the database write lock before it throws
   * {@linkcode BusyError}, in milliseconds; also how long a claim, renewal,
   * release or `transaction()` waits for a transaction the application
   * holds open on a shared connection, and how long a call waits behind a
   * `transaction(fn)` whose `fn` still runs on the same connection. `0`
   * tries once.
   *
   * @default {5000}
   */
  readonly busyTimeoutMs?: number;
  /** Largest payload accepted, in bytes (JSON text as UTF-8). @default {1048576} */
  readonly maxPayloadBytes?: number;
}

/** Options of {@linkcode Outbox.enqueue}. */
export interface EnqueueOptions {
  /** Queue to add the event to. @default {OutboxOptions.queue} */
  readonly queue?: string;
  /** Delay before the event can be claimed, in milliseconds. @default {0} */
  readonly delayMs?: number;
  /** Attempts before the event becomes a dead letter. @default {OutboxOptions.maxAttempts} */
  readonly maxAttempts?: number;
  /**
   * Idempotency key, unique per queue and kept after the event is done: a
   * second enqueue with it returns the first event's id with
   * `deduplicated: true` and inserts nothing.
   */
  readonly dedupKey?: string;
  /**
   * Per-key FIFO, one event of a key in flight at a time: the event is not
   * claimable while an earlier event of the same queue with the same key is
   * pending or leased, nor while any other event of the key holds a live
   * lease (so an earlier event a redrive or retry made pending again waits
   * for a later one's lease to end). The same rule on SQLite and PostgreSQL.
   */
  readonly orderingKey?: string;
  /**
   * The event's global identity, canonical lowercase UUID text of any
   * version, for example an upstream event's id carried on. Unique across
   * queues: when an event has it already, the enqueue inserts nothing and
   * returns that event with `deduplicated: true`, as a `dedupKey` does.
   *
   * @default {a new UUIDv7 stamped with the outbox's clock}
   */
  readonly identity?: string;
  /**
   * An integer from -2147483647 to 2147483647: of the events due, a claim
   * takes the highest priority first (then the earliest due, then the
   * oldest). Inside an `orderingKey` FIFO wins: a later event of the key
   * waits for the earlier ones whatever its priority.
   *
   * @default {0}
   */
  readonly priority?: number;
  /**
   * The key a per-key concurrency limit counts by
   * ({@linkcode Outbox.setLimits}'s `perKey`): at most that many events of
   * one key are leased at once, across every worker. Unlike `orderingKey`
   * it keeps no order.
   */
  readonly concurrencyKey?: string;
}

/**
 * One element of {@linkcode Outbox.enqueueBatch}: a payload with the options
 * {@linkcode Outbox.enqueue} takes for it.
 */
export interface BatchEvent<P = unknown> extends EnqueueOptions {
  /** As `enqueue`'s `payload`: JSON data JSON keeps as it is, or a `Uint8Array`. */
  readonly payload: P;
}

/** Options of {@linkcode Outbox.claim}. */
export interface ClaimOptions {
  /** Queue to claim from. @default {OutboxOptions.queue} */
  readonly queue?: string;
  /** Lease length, in milliseconds. @default {OutboxOptions.leaseMs} */
  readonly leaseMs?: number;
  /**
   * The claim token, 1–128 characters of `A-Z a-z 0-9 . _ ~ -`. Minted with
   * 128 bits of randomness when absent; a token this event was claimed with
   * before is rejected, since reuse would let a stale worker act again.
   */
  readonly token?: string;
}

/** Options of a batch {@linkcode Outbox.claim}. */
export interface BatchClaimOptions extends Omit<ClaimOptions, "token"> {
  /** Most events to claim in one transaction, 1–10000. */
  readonly max: number;
}

/**
 * What {@linkcode Outbox.acknowledgeAndClaim} resolves to.
 *
 * @typeParam P The payload type.
 */
export interface AcknowledgedAndClaimed<P = unknown> {
  /** Per lease given, in order: `true` when acknowledged, `false` when stale. */
  readonly acknowledged: boolean[];
  /** The new leases, in claim order, possibly none. */
  readonly leases: Lease<P>[];
}

/** A claim on one event: who holds it (token, fence) and until when. */
export interface Lease<P = unknown> {
  /** The event's id, local to this database. */
  readonly eventId: number;
  /**
   * The event's global identity, UUID text, the same on every claim of it:
   * recipients dedupe external effects on it (the idempotency key).
   */
  readonly identity: string;
  /** The queue the event is in. */
  readonly queue: string;
  /** The claim token that acknowledge, renew and release must present. */
  readonly token: string;
  /**
   * The event's claim number, strictly increasing per event. It orders the
   * attempts at one event, and is no idempotency key: a recipient may
   * refuse an attempt whose fence is lower than one it already accepted.
   */
  readonly fence: number;
  /** Attempt number of this claim, from 1. */
  readonly attempt: number;
  /** Attempts allowed before the event becomes a dead letter. */
  readonly maxAttempts: number;
  /** Deadline in epoch milliseconds: the lease is live while `now < leaseUntil`. */
  readonly leaseUntil: number;
  /** The payload as enqueued (JSON value, or `Uint8Array`). */
  readonly payload: P;
  /** The ordering key, or `null`. */
  readonly orderingKey: string | null;
  /** The error recorded by the previous release or expiry, or `null`. */
  readonly lastError: string | null;
}

/** Options of {@linkcode Outbox.release}. */
export interface ReleaseOptions {
  /** Delay before the event can be claimed again, in milliseconds. @default {0} */
  readonly delayMs?: number;
  /** Why the attempt failed, kept as the event's last error. */
  readonly error?: string;
  /**
   * Makes the event a dead letter now, whatever attempts it has left (the
   * handler knows another attempt cannot succeed). @default {false}
   */
  readonly deadLetter?: boolean;
  /**
   * Whether the claim counts as an attempt. `false` gives back a lease whose
   * work never began (the processing loop's prefetched leases, on stop or
   * before their renewal falls due): the event's attempt count goes back by
   * one, so giving it back can never make it a dead letter, as
   * graphile-worker's local queue returns the jobs it fetched but never
   * ran. Its fence stays, so the lease stays stale. @default {true}
   */
  readonly attempted?: boolean;
}

/** A dead letter: an event whose attempts ran out. */
export interface DeadLetter<P = unknown> {
  /** The event's id, local to this database. */
  readonly eventId: number;
  /** The event's global identity, UUID text. */
  readonly identity: string;
  /** The queue the event is in. */
  readonly queue: string;
  /**
   * The payload as enqueued; the stored text itself when it is not JSON
   * (a claim makes such an event a dead letter), so the list never fails on
   * one row.
   */
  readonly payload: P;
  /** Attempts made. */
  readonly attempts: number;
  /** The last error (`"lease expired"` when the last worker never came back). */
  readonly lastError: string | null;
  /** When the event was enqueued, epoch milliseconds. */
  readonly createdAt: number;
  /** When it became a dead letter, epoch milliseconds. */
  readonly deadAt: number;
}

/** Counts per state of one queue, from {@linkcode Outbox.stats}. */
export interface Stats {
  /** Events waiting to be claimed (due or delayed). */
  readonly pending: number;
  /** Events under a lease, live or lapsed. */
  readonly leased: number;
  /** Acknowledged events not yet purged. */
  readonly done: number;
  /** Dead letters. */
  readonly dead: number;
  /** Age of the oldest pending event in milliseconds, `0` when none. */
  readonly oldestPendingAgeMs: number;
  /**
   * The database's write-ahead log, on SQLite in WAL mode (absent otherwise,
   * or while the connection is in the application's transaction).
   */
  readonly wal?: WalStats;
}

/** One row of the attempt ledger, from {@linkcode Outbox.explain}. */
export interface LedgerEntry {
  /** What happened. */
  readonly kind:
    | "claimed"
    | "renewed"
    | "released"
    | "acknowledged"
    | "stale_acknowledge"
    | "stale_renew"
    | "stale_release"
    | "expired"
    | "dead"
    | "retried";
  /** The fence the entry concerns. */
  readonly fence: number;
  /** When it happened, epoch milliseconds. */
  readonly at: number;
  /** The token presented or minted, or `null`. */
  readonly token: string | null;
  /** The lease deadline after the entry, or `null`. */
  readonly leaseUntil: number | null;
  /** Error text or reason, or `null`. */
  readonly detail: string | null;
}

/** One event and its history, from {@linkcode Outbox.explain}. */
export interface Explanation {
  /** The event's id, local to this database. */
  readonly eventId: number;
  /** The event's global identity, UUID text. */
  readonly identity: string;
  /** The queue it is in. */
  readonly queue: string;
  /** Its state now. */
  readonly state: EventState;
  /** Attempts made since it was enqueued or retried. */
  readonly attempt: number;
  /** Attempts allowed. */
  readonly maxAttempts: number;
  /** Its latest fence (0 before the first claim). */
  readonly fence: number;
  /** Its last error, or `null`. */
  readonly lastError: string | null;
  /** Every ledger entry, oldest first. */
  readonly history: readonly LedgerEntry[];
}

/**
 * A transaction of {@linkcode Outbox.transaction}: the caller's statements,
 * enqueues and fenced acknowledgements commit together or not at all.
 */
export interface Transaction {
  /**
   * Runs one of the caller's statements inside the transaction. A
   * statement that begins, ends or rolls back a transaction (`BEGIN`,
   * `COMMIT`, `END`, `ROLLBACK`, `SAVEPOINT`, `RELEASE`) is refused with a
   * `RangeError` before it runs: the transaction ends when `fn` does.
   */
  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult>;
  /** Runs one of the caller's queries inside the transaction (same refusal as `run`). */
  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]>;
  /** Enqueues an event that commits with the caller's rows. */
  enqueue(payload: unknown, options?: EnqueueOptions): Promise<EnqueueResult>;
  /**
   * Enqueues events that commit with the caller's rows, in one statement,
   * as {@linkcode Outbox.enqueueBatch} does: all or none even when `fn`
   * catches its error. On SQLite under a savepoint, so a batch that fails
   * part-way (a trigger's `RAISE(IGNORE)` that only the lookup after the
   * insert notices) leaves none of its events and the transaction goes on;
   * on PostgreSQL, where any error fails the whole transaction, one that
   * fails without a statement failing (a `DedupRaceError`) fails it too:
   * `transaction()` rejects with that error.
   */
  enqueueBatch(
    events: readonly BatchEvent<unknown>[],
  ): Promise<EnqueueResult[]>;
  /**
   * Acknowledges a lease in this transaction.
   *
   * @throws {LeaseLostError} When the lease is stale; the whole transaction
   * then rolls back.
   */
  acknowledge(lease: Lease<unknown>): Promise<true>;
}
