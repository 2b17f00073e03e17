/**
 * The runtime-neutral lease core: every claim, acknowledge, renew and release
 * statement lives here, sent through a {@linkcode Driver}. Uses only web
 * standard APIs (`crypto.getRandomValues`, `performance.now`, `setTimeout`),
 * so it runs unchanged in Deno, browsers and edge runtimes.
 *
 * Semantics follow the contract in README.md (Guarantees), which generalises
 * the seed scenario (claim under `BEGIN IMMEDIATE`, acknowledge by id *and*
 * token) with SQS's visibility timeout, receive count and dead-letter queue.
 *
 * @module
 */
import {
  type Driver,
  integerOf,
  type Row,
  type RunResult,
  type SqlValue,
} from "./driver.ts";
import {
  BusyError,
  LeaseLostError,
  SchemaVersionError,
  SqliteError,
  UnsafeIntegerError,
} from "./errors.ts";
import type { Dialect, EnqueueResult, EventState } from "./types.ts";
export type {
  Dialect,
  EnqueueResult,
  EventState,
  StatementName,
} from "./types.ts";
import {
  checkBoolean,
  checkError,
  checkEventId,
  checkIdentity,
  checkInteger,
  checkName,
  checkOptions,
  checkState,
  checkToken,
  describe,
  missing,
} from "./validate.ts";
import {
  type ActivityCount,
  activityCounts,
  activityParameters,
  CANCELLED,
  dedupKeyParameters,
  type EventInfo,
  eventInfo,
  LEASE_EXPIRED,
  type ListOptions,
  PURGE_BATCH,
  type PurgeOptions,
  type QueueCounts,
  queueCounts,
  type QueuesOptions,
  queuesStatement,
  type RedriveOptions,
  storedPayload,
} from "./admin.ts";
import { SCHEMA_SQL, SCHEMA_VERSION } from "./schema.ts";
import { checkpointWal, type WalStats } from "./wal.ts";
import {
  hex,
  insertAll,
  insertGroup,
  insertOne,
  payloadSize,
  type PreparedEnqueue,
  type Settled,
} from "./core/enqueue.ts";
import {
  insideTransactionBody,
  type Mutex,
  runTransactionBody,
  TransactionRunner,
  transactionStatements,
  withinApplication,
} from "./core/transaction.ts";
export {
  driverMutex,
  insideTransactionBody,
  Mutex,
  runTransactionBody,
  transactionStatements,
} from "./core/transaction.ts";
import { SQL, SQLITE, UPGRADES, VERSION_TABLE_SQL } from "./dialects/sqlite.ts";
import {
  allFlows,
  checkLimits,
  checkPriority,
  type FlowStatements,
  openGate,
  type QueueFlow,
  queueFlow,
  type QueueLimits,
  setLimits,
  setPaused,
  withFlows,
} from "./core/flow.ts";
import {
  anyDue,
  checkSchedule,
  runDue,
  saveSchedule,
  type Schedule,
  scheduleOf,
  type ScheduleOptions,
} from "./core/schedules.ts";

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
   * holds open on a shared connection. `0` tries once.
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
   * Per-key FIFO: the event is not claimable while an earlier event of the
   * same queue with the same key is pending or leased.
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
  /** As `enqueue`'s `payload`: a JSON-serializable value or a `Uint8Array`. */
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
   * as {@linkcode Outbox.enqueueBatch} does.
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

const MAX_DATE_MS = 8_640_000_000_000_000;
const encoder = new TextEncoder();

/**
 * A transactional outbox with leases on one SQLite connection.
 *
 * Open it with {@linkcode Outbox.open}, which applies the schema once. Calls
 * on one outbox are serialized by an async mutex, so they never interleave
 * inside each other's transactions; use one outbox per connection.
 *
 * @typeParam P The payload type callers enqueue and claims return.
 *
 * @example Enqueue, claim, acknowledge
 * ```ts
 * import { Outbox } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
 * const { eventId } = await outbox.enqueue({ to: "ada@example.com" });
 * const lease = await outbox.claim({ leaseMs: 30_000 });
 * assert.equal(lease?.eventId, eventId);
 * assert.equal(lease?.fence, 1);
 * assert.equal(await outbox.acknowledge(lease!), true);
 * assert.equal(await outbox.claim(), null);
 * ```
 */
export class Outbox<P = unknown> implements AsyncDisposable {
  readonly #driver: Driver;
  readonly #mutex: Mutex;
  readonly #runner: TransactionRunner;
  readonly #sql: Dialect;
  readonly #now: Clock | "database";
  #stopWatching: (() => Promise<void>) | undefined;
  readonly #queue: string;
  readonly #leaseMs: number;
  readonly #maxAttempts: number;
  readonly #busyTimeoutMs: number;
  readonly #maxPayloadBytes: number;
  readonly #enqueueListeners = new Set<() => void>();
  // The enqueues waiting for the next transaction; closed (undefined) once
  // that transaction holds the write lock.
  #group: EnqueueGroup | undefined;
  #closed = false;

  private constructor(driver: Driver, options: OutboxOptions) {
    const op = "open outbox";
    this.#sql = driver.dialect ?? SQLITE;
    this.#now = options.now ?? (this.#sql.now ? "database" : Date.now);
    if (
      typeof this.#now !== "function" &&
      !(this.#now === "database" && this.#sql.now !== undefined)
    ) {
      throw new TypeError(
        `Cannot ${op} as 'now' must be a function: current value is ${
          describe(this.#now)
        }`,
      );
    }
    this.#queue = checkName(op, "queue", options.queue ?? "default");
    this.#leaseMs =
      checkInteger(op, "leaseMs", options.leaseMs, 1, MAX_DURATION_MS) ??
        30_000;
    this.#maxAttempts =
      checkInteger(op, "maxAttempts", options.maxAttempts, 1, MAX_ATTEMPTS) ??
        5;
    this.#busyTimeoutMs = checkInteger(
      op,
      "busyTimeoutMs",
      options.busyTimeoutMs,
      0,
      MAX_DURATION_MS,
    ) ?? 5_000;
    this.#maxPayloadBytes = checkInteger(
      op,
      "maxPayloadBytes",
      options.maxPayloadBytes,
      1,
      MAX_PAYLOAD_BYTES,
    ) ?? 1_048_576;
    this.#runner = new TransactionRunner(
      driver,
      this.#sql,
      this.#busyTimeoutMs,
      "only enqueue(), enqueueBatch() and acknowledge() of one lease made inside outbox.within() join it; claims, renewals, releases and the outbox's own transactions wait for it to end",
    );
    this.#mutex = this.#runner.mutex;
    this.#driver = this.#runner.driver;
  }

  /**
   * Opens an outbox on a connection, creating the schema (`schema.sql`) when
   * the database has none, upgrading an older one in the same transaction,
   * and checking its version otherwise. The version lives in the outbox's
   * own table `outbox_schema`, never in `PRAGMA user_version`, which the
   * application may use for its own migrations; a database from a release
   * that kept versions 1 to 4 in `user_version` is recognised by its tables'
   * shape, its version moves to `outbox_schema`, and `user_version` goes
   * back to `0` (an older release then refuses the file rather than run
   * beside an upgrade it does not know). Opening never reads or writes
   * `user_version` otherwise. The upgrade drops the triggers that wrote
   * version 1's ledger, adds version 3's `claimed_at` and ledger views, and
   * adds version 4's `identity`, giving every existing event a UUIDv7
   * stamped with its `created_at`: stop processes running an older release
   * first, or their claims and acknowledgements go unrecorded or out of
   * order, and the events they enqueue have no identity.
   *
   * A new database gets `auto_vacuum = INCREMENTAL` before its first table,
   * so {@linkcode Outbox.maintain} can give freed pages back to the file
   * system.
   *
   * @param driver The connection; the outbox closes it when it closes, also
   * when opening fails (a driver over the application's own handle, such as
   * `nodeSqliteDriver`, leaves the handle open).
   * @param options See {@linkcode OutboxOptions}.
   * @returns The opened outbox.
   * @throws {TypeError | RangeError} When an option is invalid or unknown,
   * naming it.
   * @throws {SchemaVersionError} When the database has a newer outbox schema.
   * @throws {Error} When the connection is read-only (claims, acknowledgements
   * and the admin calls write: lapsed last-attempt leases become dead
   * letters first).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  static async open<P = unknown>(
    driver: Driver,
    options: OutboxOptions = {},
  ): Promise<Outbox<P>> {
    if (driver === null || typeof driver !== "object") {
      throw new TypeError(
        `Cannot open outbox as 'driver' must be a Driver: current value is ${
          describe(driver)
        }`,
      );
    }
    checkOptions("open outbox", options, OUTBOX_OPTIONS);
    const outbox = new Outbox<P>(driver, options);
    try {
      await outbox.#open();
    } catch (error) {
      await outbox.close().catch(() => {});
      throw error;
    }
    return outbox;
  }

  /**
   * Opens on an engine whose dialect sets its schema up itself (PostgreSQL):
   * creates or upgrades it under the dialect's lock, then listens for other
   * connections' enqueues when the driver can.
   */
  async #setUp(): Promise<void> {
    const driver = this.#driver;
    const sql = this.#sql;
    await this.#write("open outbox", async () => {
      const version = async () => {
        const [present] = await driver.query(sql.schemaPresent!);
        if (!present?.["present"]) return 0;
        const [row] = await driver.query(sql.schemaVersion!);
        return Number(row?.["version"] ?? 0);
      };
      // Set-up takes locks that stop running workers for a moment: only
      // an opener that finds the schema missing or older takes them (one
      // that finds it newer refuses it at once, waiting for nothing).
      let found = await version();
      if (found > sql.version!) {
        throw new SchemaVersionError(found, sql.version!);
      }
      if (found < sql.version!) {
        for (const statement of [sql.lock!].flat()) {
          await driver.run(statement);
        }
        found = await version();
        if (found < sql.version!) {
          await driver.exec(sql.setup!);
          found = await version();
        }
      }
      if (found !== sql.version) {
        throw new SchemaVersionError(found, sql.version!);
      }
    }, { expire: false });
    if (driver.watchEnqueues !== undefined) {
      this.#stopWatching = await driver.watchEnqueues(() => this.#enqueued());
    }
  }

  async #open(): Promise<void> {
    const driver = this.#driver;
    if (this.#sql.setup !== undefined) return await this.#setUp();
    await this.#mutex.run(async () => {
      try {
        const [tables] = await driver.query(SQL.tableCount);
        if (Number(tables?.["n"]) === 0) await driver.exec(SQL.autoVacuum);
      } catch (error) {
        // Locked: another connection is writing, so the database exists.
        if (!(error instanceof BusyError)) throw error;
      }
    });
    await this.#write("open outbox", async () => {
      await migrate(driver);
      try {
        await driver.run(SQL.writable);
      } catch (error) {
        if (error instanceof SqliteError && error.primaryCode === 8) {
          throw new Error(
            "Cannot open outbox as the connection is read-only: its calls take the write lock (claims, acknowledgements and the admin calls first make lapsed last-attempt leases dead letters)",
            { cause: error },
          );
        }
        throw error;
      }
    }, { expire: false });
  }

  /**
   * Adds a pending event. To commit it with business rows, use
   * {@linkcode Transaction.enqueue} inside {@linkcode Outbox.transaction},
   * or call this inside {@linkcode Outbox.within} while the application has
   * a transaction open on the connection the outbox shares: it then runs
   * inside that transaction, with no `BEGIN` or `COMMIT` of its own, and the
   * application's `COMMIT` or `ROLLBACK` decides. Called anywhere else while
   * that transaction is open, it waits for it to end, then commits on its
   * own (joining follows the caller, not the handle).
   *
   * Concurrent calls share transactions (group commit): a call made while
   * the outbox waits for the connection or its write lock joins the next
   * transaction, up to 1,000 calls (or 8 MiB of payloads) in one; a lone
   * call commits at once. Each call still resolves only once the commit
   * holding its event returned, and events get ids in the order of the
   * calls. A call that fails inside the shared transaction is undone under
   * its own savepoint and rejects alone. A commit a deferred constraint
   * refuses (checked only then) runs the calls again, each in a transaction
   * of its own and in order, so only the one that broke it rejects; when a
   * commit fails otherwise, every call of that transaction rejects with its
   * error and none of their events was written.
   *
   * @param payload A JSON-serializable value, stored as `JSON.stringify`
   * makes it (so `NaN` becomes `null` and a `Map` `{}`), or a `Uint8Array`
   * stored as is.
   * @param options See {@linkcode EnqueueOptions}.
   * @returns The event id, its identity, and whether `dedupKey` or a
   * supplied `identity` matched an earlier event.
   * @throws {TypeError | RangeError} When an argument is invalid or an
   * option unknown (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`
   * (inside the application's transaction: at once, as waiting could
   * deadlock).
   */
  async enqueue(
    payload: P,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    const op = "enqueue";
    const event = this.#prepareEnqueue(op, payload, options);
    this.#checkOpen(op);
    this.#notNested(op);
    const bytes = payloadSize(event);
    // Only a call made inside the application's transaction (within()) joins
    // it: any other waits for it to end, or a rollback would take back an
    // event whose call had resolved.
    const join = this.#runner.joins();
    return await new Promise((resolve, reject) => {
      let group = this.#group;
      if (
        group === undefined || group.calls.length >= MAX_GROUP ||
        group.bytes + bytes > MAX_GROUP_BYTES || group.join !== join
      ) {
        group = this.#group = { calls: [], bytes: 0, join };
        this.#commitGroup(group);
      }
      group.calls.push({ event, resolve, reject });
      group.bytes += bytes;
    });
  }

  /**
   * Adds pending events in one transaction and one statement, each exactly
   * as {@linkcode Outbox.enqueue} would add it if called once per element in
   * order: its options apply to it alone, a `dedupKey` or `identity` may
   * match an earlier element of the batch, ids follow the array's order.
   * Inside {@linkcode Outbox.within}, joins a transaction the application
   * began on the connection the outbox shares, as `enqueue` does. All or none: when any element fails in SQL,
   * none is written.
   *
   * @param events The events, at most 10,000: each a `payload` (as for
   * `enqueue`) with that event's {@linkcode EnqueueOptions}.
   * @returns One result per element, in order.
   * @throws {TypeError | RangeError} When `events` is not an array, is too
   * long, or an element is invalid (before any SQL): the message names it
   * (`events[3].dedupKey`).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Enqueue a batch
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const results = await outbox.enqueueBatch([
   *   { payload: { n: 1 }, dedupKey: "order-1" },
   *   { payload: { n: 2 }, delayMs: 60_000 },
   *   { payload: { n: 1 }, dedupKey: "order-1" },
   * ]);
   * assert.deepEqual(results.map((r) => r.deduplicated), [false, false, true]);
   * assert.equal(results[2]!.eventId, results[0]!.eventId);
   * assert.deepEqual((await outbox.claim())?.payload, { n: 1 });
   * ```
   */
  async enqueueBatch(
    events: readonly BatchEvent<P>[],
  ): Promise<EnqueueResult[]> {
    const op = "enqueue batch";
    const prepared = this.#prepareBatch(op, events);
    this.#closeGroup();
    // Joins the application's transaction only when called inside it (see
    // enqueue).
    const join = this.#runner.joins();
    const results = await this.#write(
      op,
      (now) => insertAll(this.#driver, this.#sql, prepared, now),
      // An enqueue reads nothing that lapsed last-attempt leases decide, so
      // it leaves making them dead letters to the next call that does: on
      // PostgreSQL that step waits for their row locks, and a long
      // transaction holding one would stall every producer.
      { join, expire: false },
    );
    if (results.length > 0) this.#enqueued();
    return results;
  }

  /**
   * Calls `listener` after each commit that enqueued events through this
   * outbox ({@linkcode Outbox.enqueue} or a transaction's `enqueue`), so a
   * processing loop in the same process can claim at once instead of waiting
   * for its next poll. Other processes are not notified: they poll. An
   * enqueue inside the application's transaction calls it when it returns,
   * before the application commits (a claim on the same connection then
   * waits for that commit).
   *
   * @param listener Called synchronously after the commit; what it throws is
   * reported with `reportError` and does not fail the enqueue.
   * @returns A function that removes the listener.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * let calls = 0;
   * const off = outbox.onEnqueue(() => calls++);
   * await outbox.enqueue({ n: 1 });
   * off();
   * await outbox.enqueue({ n: 2 });
   * assert.equal(calls, 1);
   * ```
   */
  onEnqueue(listener: () => void): () => void {
    if (typeof listener !== "function") {
      throw new TypeError(
        `Cannot listen for enqueues as 'listener' must be a function: current value is ${
          describe(listener)
        }`,
      );
    }
    // A wrapper per call, so registering one function twice needs two removals.
    const entry = () => listener();
    this.#enqueueListeners.add(entry);
    return () => this.#enqueueListeners.delete(entry);
  }

  /**
   * Claims the oldest eligible event of a queue under a new lease: pending
   * and due, or its previous lease lapsed (`now >= leaseUntil`), with
   * attempts left and no earlier unfinished event of its ordering key. Runs
   * in one `BEGIN IMMEDIATE` transaction; lapsed leases with no attempts left
   * become dead letters on the way.
   *
   * @param options See {@linkcode ClaimOptions}; with `max`, claims a batch.
   * @returns The lease, or `null` when nothing is eligible (with `max`: the
   * leases, possibly none).
   * @throws {TypeError | RangeError} When an argument is invalid (before any
   * SQL), or when a supplied `token` was used on the event before.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {UnsafeIntegerError} When the event's id, fence or attempt (or
   * the next fence or attempt) is past `Number.MAX_SAFE_INTEGER`; nothing
   * is claimed.
   * @throws {Error} When the claim's UPDATE did not change exactly the rows
   * it leased; nothing is claimed.
   */
  claim(options?: ClaimOptions): Promise<Lease<P> | null>;
  /**
   * Claims up to `max` eligible events in one transaction, each under its own
   * lease and freshly minted token, in claim order.
   *
   * @param options See {@linkcode BatchClaimOptions}.
   * @returns The leases, possibly none.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {UnsafeIntegerError} As for a lone claim; nothing is claimed.
   */
  claim(options: BatchClaimOptions): Promise<Lease<P>[]>;
  async claim(
    options: ClaimOptions | BatchClaimOptions = {},
  ): Promise<Lease<P> | null | Lease<P>[]> {
    const op = "claim";
    checkOptions(op, options, CLAIM_OPTIONS);
    const { queue, leaseMs } = this.#claimTarget(op, options);
    if ("max" in options) {
      const max = checkInteger(op, "max", options.max, 1, MAX_BATCH) ?? 1;
      if ("token" in options && options.token !== undefined) {
        throw new TypeError(
          "Cannot claim as 'token' cannot be supplied with 'max': each lease gets its own",
        );
      }
      return await this.#write(
        op,
        (now) => this.#claim(op, queue, leaseMs, max, undefined, now),
        { inOne: this.#claimInOne(op, queue, leaseMs, max) },
      );
    }
    const token = options.token === undefined
      ? undefined
      : checkToken(op, "token", options.token);
    // A supplied token is first looked up in the ledger: the general path.
    const inOne = token === undefined
      ? this.#claimInOne(op, queue, leaseMs, 1)
      : undefined;
    return await this.#write(
      op,
      async (now) => {
        const [lease] = await this.#claim(op, queue, leaseMs, 1, token, now);
        return lease ?? null;
      },
      {
        inOne: inOne &&
          (async (now) => {
            const leases = await inOne(now);
            return leases && (leases[0] ?? null);
          }),
      },
    );
  }

  /**
   * Marks the event done **iff** the lease's token is still the event's
   * current one and the event is not done or dead. A stale lease changes
   * nothing but the ledger's `stale_acknowledge` entry.
   *
   * Made inside {@linkcode Outbox.within} while the application has a
   * transaction open on the connection the outbox shares, it runs inside that
   * transaction and commits with the application's writes; a stale lease
   * then throws {@linkcode LeaseLostError} having written nothing, so the
   * application rolls its effect back (as `tx.acknowledge` does).
   *
   * @param lease A lease from {@linkcode Outbox.claim}, or an array of them
   * acknowledged in one transaction.
   * @returns `true` when acknowledged, `false` when stale (per lease for an array).
   * @throws {TypeError | RangeError} When a lease is malformed (before any SQL).
   * @throws {LeaseLostError} When the lease is stale inside the
   * application's transaction.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  acknowledge(lease: Lease<unknown>): Promise<boolean>;
  /**
   * Acknowledges several leases in one transaction, each as
   * {@linkcode Outbox.acknowledge} does one. A batch is the processing
   * loop's: it never joins the application's transaction but waits for it
   * to end, as claims do.
   *
   * @param leases Leases from {@linkcode Outbox.claim}.
   * @returns Per lease, in order: `true` when acknowledged, `false` when
   * stale (as a lease listed a second time is).
   * @throws {TypeError | RangeError} When a lease is malformed (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  acknowledge(leases: readonly Lease<unknown>[]): Promise<boolean[]>;
  async acknowledge(
    leases: Lease<unknown> | readonly Lease<unknown>[],
  ): Promise<boolean | boolean[]> {
    const op = "acknowledge";
    if (Array.isArray(leases)) {
      // Array.from visits holes, so a sparse array is refused by index.
      const checked = Array.from(
        leases,
        (lease, i) => checkLease(op, `leases[${i}]`, lease),
      );
      return await this.#write(
        op,
        (now) => this.#acknowledge(checked, now),
        { inOne: this.#acknowledgeInOne(op, checked) },
      );
    }
    const lease = checkLease(op, "lease", leases);
    const inOne = this.#acknowledgeInOne(op, [lease]);
    // Joins the application's transaction only when called inside it (see
    // enqueue).
    const join = this.#runner.joins();
    return await this.#write(
      op,
      async (now, joined) => {
        if (await this.#acknowledgeOne(lease, now)) return true;
        // In the application's transaction, a stale lease must roll its
        // writes back, as in transaction(fn).
        if (joined) throw new LeaseLostError(lease.eventId, lease.fence);
        return false;
      },
      { join, inOne: inOne && (async (now) => (await inOne(now))?.[0]) },
    );
  }

  /**
   * Acknowledges `leases` and claims up to `max` more in one transaction:
   * a worker that goes through batches commits once per batch instead of
   * twice, and on a rollback journal each commit is four `fdatasync`s.
   * Each lease is acknowledged as {@linkcode Outbox.acknowledge} does it,
   * then the claim runs as a batch {@linkcode Outbox.claim} does and sees
   * them done (so the next event of an ordering key whose event was just
   * acknowledged can be claimed at once). Both halves commit, or neither
   * does: when the claim throws, no lease is acknowledged. Like a batch
   * acknowledge, it never joins the application's transaction but waits for
   * it to end.
   *
   * @param leases Leases from {@linkcode Outbox.claim}, possibly none.
   * @param options See {@linkcode BatchClaimOptions}.
   * @returns Per lease given, whether it was acknowledged, and the new leases.
   * @throws {TypeError | RangeError} When a lease or an option is invalid
   * (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {UnsafeIntegerError} As for a batch claim; nothing is
   * acknowledged or claimed.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * await outbox.enqueueBatch([{ payload: 1 }, { payload: 2 }, { payload: 3 }]);
   * const leases = await outbox.claim({ max: 2 });
   * const next = await outbox.acknowledgeAndClaim(leases, { max: 2 });
   * assert.deepEqual(next.acknowledged, [true, true]);
   * assert.deepEqual(next.leases.map((l) => l.payload), [3]);
   * assert.equal((await outbox.stats()).done, 2);
   * ```
   */
  async acknowledgeAndClaim(
    leases: readonly Lease<unknown>[],
    options: BatchClaimOptions,
  ): Promise<AcknowledgedAndClaimed<P>> {
    const op = "acknowledgeAndClaim";
    if (!Array.isArray(leases)) {
      throw new TypeError(
        `Cannot ${op} as 'leases' must be an array of leases: current value is ${
          describe(leases)
        }`,
      );
    }
    const checked = Array.from(
      leases,
      (lease, i) => checkLease(op, `leases[${i}]`, lease),
    );
    checkOptions(op, options, BATCH_CLAIM_OPTIONS);
    const { queue, leaseMs } = this.#claimTarget(op, options);
    const max = checkInteger(op, "max", options.max, 1, MAX_BATCH) ??
      missing(op, "max");
    const inOne = this.#claimInOne(op, queue, leaseMs, max, checked);
    return await this.#write(
      op,
      async (now) => ({
        acknowledged: await this.#acknowledge(checked, now),
        leases: await this.#claim(op, queue, leaseMs, max, undefined, now),
      }),
      {
        inOne: inOne && (async (now) => {
          const leases = await inOne(now);
          return leases && { acknowledged: checked.map(() => true), leases };
        }),
      },
    );
  }

  /** The queue and lease length a claim's options name, checked. */
  #claimTarget(
    op: string,
    options: ClaimOptions | BatchClaimOptions,
  ): { queue: string; leaseMs: number } {
    return {
      queue: options.queue === undefined
        ? this.#queue
        : checkName(op, "queue", options.queue),
      leaseMs:
        checkInteger(op, "leaseMs", options.leaseMs, 1, MAX_DURATION_MS) ??
          this.#leaseMs,
    };
  }

  /**
   * Extends a live lease to `now + leaseMs` **iff** its token is current and
   * `now < leaseUntil`. Never shortens: when the clock stepped back, the old
   * deadline stays.
   *
   * @param lease The lease to extend.
   * @param leaseMs New lease length from now, in milliseconds.
   * @default {OutboxOptions.leaseMs}
   * @returns The new deadline in epoch milliseconds, or `false` when the
   * lease was lost or had lapsed (nothing changes then).
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async renew(
    lease: Lease<unknown>,
    leaseMs?: number,
  ): Promise<number | false> {
    const op = "renew";
    const checked = checkLease(op, "lease", lease);
    const ms = checkInteger(op, "leaseMs", leaseMs, 1, MAX_DURATION_MS) ??
      this.#leaseMs;
    return await this.#write(op, async (now) => {
      await this.#writeUnwritten([checked.eventId], false);
      const [row] = await this.#driver.query(this.#sql.renew, [
        now + ms,
        now,
        checked.eventId,
        checked.token,
        checked.fence,
      ]);
      if (row === undefined) {
        await this.#stale(checked, "stale_renew", now);
        return false;
      }
      const leaseUntil = integerOf(row, "lease_until");
      await this.#ledger(
        checked.eventId,
        checked.fence,
        "renewed",
        now,
        checked.token,
        leaseUntil,
      );
      return leaseUntil;
    });
  }

  /**
   * Gives an event back before its lease ends, **iff** the token is current:
   * it becomes claimable after `delayMs`, or a dead letter when it has no
   * attempts left. A stale lease changes nothing.
   *
   * @param lease The lease to give back.
   * @param options See {@linkcode ReleaseOptions}.
   * @returns `true` when released, `false` when stale.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async release(
    lease: Lease<unknown>,
    options: ReleaseOptions = {},
  ): Promise<boolean> {
    const op = "release";
    const checked = checkLease(op, "lease", lease);
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
    return await this.#write(op, async (now) => {
      await this.#writeUnwritten([checked.eventId], false);
      const [row] = await this.#driver.query(this.#sql.release, [
        now,
        now + delayMs,
        error,
        checked.eventId,
        checked.token,
        checked.fence,
        deadLetter ? 1 : 0,
      ]);
      if (row === undefined) {
        await this.#stale(checked, "stale_release", now);
        return false;
      }
      await this.#ledger(
        checked.eventId,
        checked.fence,
        "released",
        now,
        checked.token,
        null,
        error,
      );
      if (row["state"] === "dead") {
        await this.#ledger(
          checked.eventId,
          checked.fence,
          "dead",
          now,
          null,
          null,
          error,
        );
      }
      return true;
    });
  }

  /**
   * Lists dead letters of a queue, oldest first.
   *
   * @param options `queue` (default: the outbox's) and `limit` (default 100).
   * @returns The dead letters.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async deadLetters(
    options: { readonly queue?: string; readonly limit?: number } = {},
  ): Promise<DeadLetter<P>[]> {
    const op = "list dead letters";
    checkOptions(op, options, ["queue", "limit"]);
    const queue = options.queue === undefined
      ? this.#queue
      : checkName(op, "queue", options.queue);
    const limit = checkInteger(op, "limit", options.limit, 1, MAX_BATCH) ?? 100;
    return await this.#write(op, async () => {
      const rows = await this.#driver.query(this.#sql.deadLetters, [
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

  /**
   * Lists events in one state, oldest id first, a page at a time: pass the
   * last id of a page as `afterId` for the next one.
   *
   * @param options See {@linkcode ListOptions}.
   * @returns The events, at most `limit` of them.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Page through pending events
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * for (const n of [1, 2, 3]) await outbox.enqueue({ n });
   * const first = await outbox.list({ state: "pending", limit: 2 });
   * assert.deepEqual(first.map((e) => e.payload), [{ n: 1 }, { n: 2 }]);
   * const next = await outbox.list({ state: "pending", afterId: first[1]!.id });
   * assert.deepEqual(next.map((e) => e.payload), [{ n: 3 }]);
   * ```
   */
  async list(options: ListOptions): Promise<EventInfo<P>[]> {
    const op = "list events";
    const params = listParameters(op, options);
    return await this.#write(op, async () => {
      const rows = await this.#driver.query(this.#sql.list, params);
      return rows.map((row) => eventInfo<P>(row, decodePayload));
    });
  }

  /**
   * Cancels a pending event: it becomes a dead letter whose last error is
   * `"cancelled"`, so it stays listed (and explained) and
   * {@linkcode Outbox.redrive} can bring it back; purge deletes it for good.
   * A leased event is not cancelled: its holder would find its
   * acknowledgement refused without knowing why.
   *
   * @param eventId The event's id.
   * @returns `true` when the event was pending and is cancelled now, else `false`.
   * @throws {TypeError | RangeError} When `eventId` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Cancel, then change one's mind
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const { eventId } = await outbox.enqueue({ to: "ada@example.com" });
   * assert.equal(await outbox.cancel(eventId), true);
   * assert.equal(await outbox.claim(), null);
   * assert.equal(await outbox.redrive({ ids: [eventId] }), 1);
   * assert.equal((await outbox.claim())?.eventId, eventId);
   * ```
   */
  cancel(eventId: number): Promise<boolean>;
  /**
   * Cancels the pending events among `eventIds` in one transaction, as
   * pg-boss's `cancel()` takes an array: all of them or, when it throws,
   * none. The others named (leased, finished, unknown) are left alone.
   *
   * @param eventIds At most 10,000 event ids.
   * @returns The ids cancelled, ascending.
   * @throws {TypeError | RangeError} When an id or the array is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Cancel several events at once
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const a = await outbox.enqueue({ n: 1 });
   * const b = await outbox.enqueue({ n: 2 });
   * assert.deepEqual(await outbox.cancel([b.eventId, a.eventId, 99]), [
   *   a.eventId,
   *   b.eventId,
   * ]);
   * ```
   */
  cancel(eventIds: readonly number[]): Promise<number[]>;
  async cancel(
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
    const cancelled = await this.#write(op, async (now) => {
      const rows = await this.#driver.query(this.#sql.cancel, [now, ids]);
      const events = rows.map((row) =>
        [integerOf(row, "id"), integerOf(row, "fence")] as const
      ).sort(([a], [b]) => a - b);
      await this.#ledgerAll(
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

  /**
   * Makes dead letters claimable again at once with a fresh attempt count
   * (SQS's dead-letter redrive, pg-boss's `redrive()`), in one transaction.
   * With neither option, every dead letter of every queue.
   *
   * @param options See {@linkcode RedriveOptions}.
   * @returns How many dead letters are pending now.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Redrive a queue's dead letters after fixing the receiver
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
   *   maxAttempts: 1,
   * });
   * await outbox.enqueue({ to: "ada@example.com" }, { queue: "mail" });
   * const lease = await outbox.claim({ queue: "mail" });
   * await outbox.release(lease!, { error: "receiver down" });
   * assert.equal(await outbox.redrive({ queue: "mail" }), 1);
   * assert.equal((await outbox.claim({ queue: "mail" }))?.attempt, 1);
   * ```
   */
  async redrive(options: RedriveOptions = {}): Promise<number> {
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
    return await this.#write(op, async (now) => {
      const rows = await this.#driver.query(this.#sql.redrive, [
        now,
        queue,
        ids,
      ]);
      await this.#ledgerAll(
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

  /**
   * Deletes done events and dead letters older than a duration, counted from
   * when they were acknowledged or became dead letters, with their ledger
   * entries (retention). It deletes at most 1,000 events per transaction, so
   * claims on other connections wait for short write locks only. Their dedup
   * keys stop deduplicating.
   *
   * @param options See {@linkcode PurgeOptions}.
   * @returns How many events were deleted.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Keep a week of history
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * let now = 0;
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), {
   *   now: () => now,
   * });
   * await outbox.enqueue({ n: 1 });
   * await outbox.acknowledge((await outbox.claim())!);
   * now = 3 * 86_400_000;
   * assert.equal(await outbox.purge({ olderThanMs: 7 * 86_400_000 }), 0);
   * now = 8 * 86_400_000;
   * assert.equal(await outbox.purge({ olderThanMs: 7 * 86_400_000 }), 1);
   * ```
   */
  async purge(options: PurgeOptions): Promise<number> {
    const op = "purge";
    checkOptions(op, options, PURGE_OPTIONS);
    const olderThanMs = checkInteger(
      op,
      "olderThanMs",
      options.olderThanMs,
      0,
      Number.MAX_SAFE_INTEGER,
    ) ?? missing(op, "olderThanMs");
    const states = options.states ?? ["done", "dead"];
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
        const n = await this.#write(op, async (now) => {
          cutoff ??= now - olderThanMs;
          const rows = await this.#driver.query(this.#sql.purgeable, [
            state,
            cutoff,
          ]);
          if (rows.length === 0) return 0;
          const ids = JSON.stringify(rows.map((row) => integerOf(row, "id")));
          await this.#driver.run(this.#sql.purgeLedger, [ids]);
          return (await this.#driver.run(this.#sql.purge, [ids])).changes;
        });
        deleted += n;
        if (n < PURGE_BATCH) break;
      }
    }
    return deleted;
  }

  /**
   * Counts the events of every queue per state.
   *
   * @returns One entry per queue that has events, in name order.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), { now: () => 5 });
   * await outbox.enqueue({ n: 1 }, { queue: "mail" });
   * assert.deepEqual(await outbox.queues(), [
   *   { queue: "mail", pending: 1, leased: 0, done: 0, dead: 0, oldestPendingAt: 5 },
   * ]);
   * ```
   */
  async queues(options: QueuesOptions = {}): Promise<QueueCounts[]> {
    const [sql, params] = queuesStatement(this.#sql, options);
    return await this.#write(
      "count queues",
      async () =>
        withFlows(
          queueCounts(await this.#driver.query(sql, params)),
          await allFlows(this.#driver, this.#flow),
        ),
    );
  }

  /**
   * Counts events acknowledged and attempts failed per time bucket, as
   * {@linkcode OutboxReader.activity} does (the dashboard's chart), under
   * the write lock like the other admin reads.
   *
   * @param sinceMs Epoch milliseconds; what happened at or after it counts.
   * @param bucketMs The buckets' width, 1 ms to 1 day.
   * @returns The buckets that saw anything, oldest first.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async activity(sinceMs: number, bucketMs: number): Promise<ActivityCount[]> {
    const params = activityParameters(sinceMs, bucketMs);
    return await this.#write(
      "count activity",
      async () =>
        activityCounts(await this.#driver.query(this.#sql.activity, params)),
    );
  }

  /**
   * Finds the event a queue holds under a dedup key, done ones included.
   *
   * @param queue The queue's name.
   * @param dedupKey The dedup key the event was enqueued with.
   * @returns The event's id, or `null` when none has that key.
   * @throws {TypeError | RangeError} When an argument is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async eventIdByDedupKey(
    queue: string,
    dedupKey: string,
  ): Promise<number | null> {
    const params = dedupKeyParameters(queue, dedupKey);
    const [row] = await this.#write(
      "find event by dedup key",
      () => this.#driver.query(this.#sql.dedupKeyEvent, params),
    );
    return row === undefined ? null : integerOf(row, "id");
  }

  /**
   * Pauses a queue: from this call's commit on, a claim from it returns
   * nothing, on every connection and in every process, until
   * {@linkcode Outbox.resume}. Leases already held run to their end and can
   * be acknowledged, renewed and released; enqueues go on.
   * {@linkcode Outbox.queues} shows `paused: true`.
   *
   * @param queue The queue's name (it need not hold events yet).
   * @throws {TypeError} When `queue` is not a valid name (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Pause and resume
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * await outbox.enqueue({ n: 1 });
   * await outbox.pause("default");
   * assert.equal(await outbox.claim(), null);
   * await outbox.resume("default");
   * assert.deepEqual((await outbox.claim())?.payload, { n: 1 });
   * ```
   */
  async pause(queue: string): Promise<void> {
    await this.#setPaused("pause", queue, true);
  }

  /**
   * Resumes a paused queue: claims take its events again. Resuming a queue
   * that is not paused changes nothing.
   *
   * @param queue The queue's name.
   * @throws {TypeError} When `queue` is not a valid name (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async resume(queue: string): Promise<void> {
    await this.#setPaused("resume", queue, false);
    this.#enqueued();
  }

  /**
   * Sets a queue's limits, stored in the database and honoured by every
   * claim from the next one on, across every connection and process.
   * `perKey`: at most that many events of one `concurrencyKey` leased at
   * once (a saturated key never holds other keys back). `perSecond`: at
   * most that many claims a second from the queue, a token bucket of
   * `perSecond` tokens refilled continuously by the outbox's clock (on
   * PostgreSQL the server's, unless `now` was injected); setting it fills
   * the bucket. A field left out stays as it is; `null` clears it.
   *
   * @param queue The queue's name.
   * @param limits See {@linkcode QueueLimits}.
   * @throws {TypeError | RangeError} When `queue` is not a valid name or a
   * limit is not a positive integer or `null`, naming it (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example A per-key limit
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * await outbox.setLimits("default", { perKey: 1 });
   * await outbox.enqueue({ n: 1 }, { concurrencyKey: "tenant-a" });
   * await outbox.enqueue({ n: 2 }, { concurrencyKey: "tenant-a" });
   * await outbox.enqueue({ n: 3 }, { concurrencyKey: "tenant-b" });
   * const leases = await outbox.claim({ max: 10 });
   * assert.deepEqual(leases.map((l) => l.payload), [{ n: 1 }, { n: 3 }]);
   * ```
   */
  async setLimits(queue: string, limits: QueueLimits): Promise<void> {
    const op = "set limits";
    const checked = checkLimits(op, queue, limits);
    await this.#write(
      op,
      (now) => setLimits(this.#driver, this.#flow, checked, now),
    );
    this.#enqueued();
  }

  /**
   * A queue's flow control: whether it is paused, and its limits.
   *
   * @param queue The queue's name.
   * @returns `paused`, `perKey` and `perSecond` (`null`: no limit).
   * @throws {TypeError} When `queue` is not a valid name (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async limits(queue: string): Promise<QueueFlow> {
    const op = "read limits";
    checkName(op, "queue", queue);
    return await this.#write(op, async () => {
      const [row] = await this.#driver.query(this.#flow.settings, [queue]);
      return queueFlow(row);
    }, { expire: false });
  }

  /**
   * Stores a cron schedule (replacing one of the same name): from its first
   * tick after now, each tick enqueues one event with `payload` when
   * {@linkcode Outbox.runSchedules} runs ({@linkcode processEvents} runs it
   * as part of its loop). Exactly one event per tick however many
   * processes run the schedules: its dedup key is
   * `schedule:<name>:<tick epoch ms>`. Ticks that passed while nothing ran
   * are enqueued per `missed` (default `"latest"`: only the latest).
   *
   * @param name The schedule's name, unique in the database.
   * @param cron A cron expression as `croner` reads it: 5 fields (minute to
   * day of week), or 6 with seconds first, or 7 with a year.
   * @param payload A JSON-serializable value (not bytes).
   * @param options See {@linkcode ScheduleOptions}.
   * @throws {TypeError | RangeError} When the name, the cron expression,
   * the time zone, the payload or an option is invalid, naming it (before
   * any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example A schedule at 09:00 in Paris
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * let now = Date.UTC(2026, 0, 1, 7, 0);
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), { now: () => now });
   * await outbox.schedule("report", "0 9 * * *", { kind: "report" }, { timezone: "Europe/Paris" });
   * assert.equal(await outbox.runSchedules(), 0);
   * now = Date.UTC(2026, 0, 1, 8, 0); // 09:00 in Paris
   * assert.equal(await outbox.runSchedules(), 1);
   * assert.equal(await outbox.runSchedules(), 0);
   * assert.deepEqual((await outbox.claim())?.payload, { kind: "report" });
   * ```
   */
  async schedule(
    name: string,
    cron: string,
    payload: P,
    options: ScheduleOptions = {},
  ): Promise<void> {
    const op = "schedule";
    const checked = checkSchedule(op, name, cron, options);
    const { timezone: _, missed: __, ...enqueueOptions } = options;
    const event = this.#prepareEnqueue(op, payload, enqueueOptions);
    if (typeof event.payload !== "string") {
      throw new TypeError(
        "Cannot schedule as 'payload' must be JSON-serializable: bytes cannot be scheduled",
      );
    }
    const { queue: __q, ...stored } = enqueueOptions;
    await this.#write(op, (now) =>
      saveSchedule(this.#driver, this.#flow, {
        ...checked,
        queue: event.queue,
        payload: event.payload as string,
        options: stored,
      }, now), { expire: false });
  }

  /**
   * Removes a schedule; events it enqueued stay.
   *
   * @param name The schedule's name.
   * @returns Whether there was one.
   * @throws {TypeError} When `name` is not a valid name (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async unschedule(name: string): Promise<boolean> {
    const op = "unschedule";
    checkName(op, "name", name);
    return await this.#write(
      op,
      async () =>
        (await this.#driver.query(this.#flow.unschedule, [name])).length > 0,
      { expire: false },
    );
  }

  /**
   * Lists the schedules by name.
   *
   * @returns Each schedule, its next and latest tick.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async schedules(): Promise<Schedule[]> {
    return await this.#write(
      "list schedules",
      async () =>
        (await this.#driver.query(this.#flow.schedules)).map(scheduleOf),
      { expire: false },
    );
  }

  /**
   * Enqueues the ticks of every schedule that have come due by the
   * outbox's clock, each once however many processes call this, and moves
   * each schedule past now. A look that takes no write lock comes first,
   * so calling it often costs one read while nothing is due.
   *
   * @returns How many events this call enqueued.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async runSchedules(): Promise<number> {
    const op = "run schedules";
    const flow = this.#flow;
    const look = (now: number | null) => anyDue(this.#driver, flow, now);
    const { due } = await this.#write(op, look, {
      expire: false,
      inOne: (now) =>
        look(now).catch((error) => {
          if (error instanceof BusyError) return undefined;
          throw error;
        }),
    });
    if (!due) return 0;
    const n = await this.#write(
      op,
      (now) =>
        runDue(this.#driver, flow, now, async (tick) => {
          const event = this.#prepareEnqueue(op, null, {
            ...tick.options,
            queue: tick.queue,
            dedupKey: tick.dedupKey,
          });
          const result = await insertOne(
            this.#driver,
            this.#sql,
            { ...event, payload: tick.payload },
            now,
          );
          return !result.deduplicated;
        }),
      { expire: false },
    );
    if (n > 0) this.#enqueued();
    return n;
  }

  async #setPaused(op: string, queue: string, paused: boolean): Promise<void> {
    checkName(op, "queue", queue);
    await this.#write(
      op,
      (now) => setPaused(this.#driver, this.#flow, queue, paused, now),
      { expire: false },
    );
  }

  /** The dialect's flow statements. */
  get #flow(): FlowStatements {
    const flow = this.#sql.flow;
    if (flow === undefined) {
      throw new Error(
        "Cannot control the flow of a queue as this driver's dialect spells no flow statements",
      );
    }
    return flow;
  }

  /**
   * How long until the next pending or leased event of a queue that is not
   * due yet comes due (a delayed event, a backoff, a lease deadline), by the
   * outbox's clock, so an idle loop sleeps until then instead of polling.
   * One statement outside a transaction: it takes no write lock (on
   * PostgreSQL, one round trip), and falls back to a transaction that waits
   * for the lock only when the database is busy.
   *
   * @param options `queue`: default the outbox's.
   * @returns Milliseconds from now, or `null` when nothing is scheduled.
   * @throws {TypeError} When `queue` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Usage
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"), { now: () => 0 });
   * assert.equal(await outbox.nextDueInMs(), null);
   * await outbox.enqueue({ n: 1 }, { delayMs: 2_000 });
   * assert.equal(await outbox.nextDueInMs(), 2_000);
   * ```
   */
  async nextDueInMs(
    options: { readonly queue?: string } = {},
  ): Promise<number | null> {
    const op = "find the next due time";
    checkOptions(op, options, ["queue"]);
    const queue = options.queue === undefined
      ? this.#queue
      : checkName(op, "queue", options.queue);
    const read = async (now: number | null) => {
      const [row] = await this.#driver.query(this.#sql.nextDue, [queue, now]);
      const at = this.#checkNow(op, row?.["now"]);
      return row?.["due_at"] == null ? null : integerOf(row, "due_at") - at;
    };
    // A read alone: a lapsed last-attempt lease is due already, so making it
    // a dead letter first would not change the answer.
    return await this.#write(op, read, {
      expire: false,
      inOne: (now) =>
        read(now).catch((error) => {
          if (error instanceof BusyError) return undefined;
          throw error;
        }),
    });
  }

  /**
   * Gives the pages that deleted rows freed back to the file system, so the
   * file shrinks after {@linkcode Outbox.purge} (SQLite keeps freed pages on
   * a free list otherwise). Databases this library creates have
   * `auto_vacuum = INCREMENTAL`, and this runs `PRAGMA incremental_vacuum`.
   * One made before (or by another program) has `auto_vacuum = NONE`, which
   * the result says: `vacuum: true` then runs a full `VACUUM` once, which
   * rewrites the file, switches it to incremental, and fails with
   * {@linkcode BusyError} while another connection uses the database.
   * In WAL mode it then runs `PRAGMA wal_checkpoint(TRUNCATE)`: the WAL file
   * goes back to zero bytes unless a reader or writer uses it at that moment
   * (it is then checkpointed as far as the readers allow).
   *
   * @param options `vacuum`: run a full `VACUUM`. @default {false}
   * @returns The bytes given back, the free pages left, the database's
   * `auto_vacuum` mode afterwards (`"none"`: nothing can be given back
   * without `vacuum: true`), and in WAL mode the WAL after the checkpoint
   * (`sizeBytes` `0` when it was truncated).
   * @throws {TypeError} When an option is invalid (before any SQL).
   * @throws {BusyError} When the database is locked.
   *
   * @example Shrink after a purge
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * const { autoVacuum } = await outbox.maintain();
   * assert.equal(autoVacuum, "incremental");
   * ```
   */
  async maintain(
    options: { readonly vacuum?: boolean } = {},
  ): Promise<
    {
      reclaimedBytes: number;
      freePages: number;
      autoVacuum: "none" | "full" | "incremental";
      wal?: WalStats;
    }
  > {
    const op = "maintain";
    checkOptions(op, options, ["vacuum"]);
    checkBoolean(op, "vacuum", options.vacuum, false);
    if (this.#closed) throw new Error(`Cannot ${op} as the outbox is closed`);
    if (this.#sql !== SQLITE) {
      // PostgreSQL's autovacuum returns freed space to the table itself.
      throw new Error(
        `Cannot ${op} as it concerns SQLite's free pages: PostgreSQL's autovacuum reclaims space itself`,
      );
    }
    const driver = this.#driver;
    const read = async (pragma: string) =>
      Number(Object.values((await driver.query(pragma))[0] ?? {})[0]);
    return await this.#mutex.run(async () => {
      const pageSize = await read(SQL.pageSize);
      const pagesBefore = await read(SQL.pageCount);
      // Neither runs inside a transaction: VACUUM cannot, and
      // incremental_vacuum takes the write lock itself.
      if (options.vacuum) {
        await driver.exec(`${SQL.autoVacuum}; VACUUM`);
      } else {
        // It frees one page per step: a query steps it to the end, where
        // exec would stop after the first.
        await driver.query(SQL.incrementalVacuum);
      }
      const mode = await read(SQL.autoVacuumMode);
      const wal = await checkpointWal(driver, "TRUNCATE");
      return {
        reclaimedBytes: Math.max(
          0,
          (pagesBefore - await read(SQL.pageCount)) * pageSize,
        ),
        freePages: await read(SQL.freelistCount),
        autoVacuum: mode === 2 ? "incremental" : mode === 1 ? "full" : "none",
        ...(wal === undefined ? {} : { wal }),
      };
    });
  }

  /**
   * Counts the events of a queue per state. On SQLite in WAL mode, then
   * runs a passive checkpoint (`PRAGMA wal_checkpoint(PASSIVE)`, which waits
   * for nothing and copies nothing once the WAL is copied) to report the
   * WAL's size and whether a reader holds its checkpoints back.
   *
   * @param options `queue`: default the outbox's.
   * @returns See {@linkcode Stats}.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async stats(options: { readonly queue?: string } = {}): Promise<Stats> {
    const op = "read stats";
    checkOptions(op, options, ["queue"]);
    const queue = options.queue === undefined
      ? this.#queue
      : checkName(op, "queue", options.queue);
    const stats: Stats = await this.#write(op, async (now) => {
      const counts: Record<string, number> = {
        pending: 0,
        leased: 0,
        done: 0,
        dead: 0,
      };
      let oldestPendingAgeMs = 0;
      for (const row of await this.#driver.query(this.#sql.stats, [queue])) {
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
    if (this.#sql !== SQLITE) return stats;
    const wal = await this.#mutex.run(() =>
      checkpointWal(this.#driver, "PASSIVE")
    );
    return wal === undefined ? stats : { ...stats, wal };
  }

  /**
   * Tells one event's state and every claim, renewal, release,
   * acknowledgement, stale call, expiry, dead letter and retry it had.
   *
   * @param event The event's id, or its identity (UUID text).
   * @returns The explanation, or `null` when no such event exists.
   * @throws {TypeError | RangeError} When `event` is invalid (before any SQL).
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async explain(event: number | string): Promise<Explanation | null> {
    const [sql, key] = typeof event === "string"
      ? [this.#sql.eventByIdentity, checkIdentity("explain", "event", event)]
      : [
        this.#sql.event,
        checkInteger("explain", "event", event, 1, Number.MAX_SAFE_INTEGER) ??
          missing("explain", "event"),
      ];
    return await this.#write("explain", async () => {
      const [row] = await this.#driver.query(sql, [key]);
      if (row === undefined) return null;
      const history = await this.#driver.query(this.#sql.history, [row["id"]!]);
      return explanation(row, history);
    });
  }

  /**
   * Runs `fn` as part of the transaction the application has open on the
   * connection this outbox shares (a `DatabaseSync` behind
   * `nodeSqliteDriver`, an `oo1.DB` behind `sqliteWasmDriver`, or the
   * driver itself): {@linkcode Outbox.enqueue}, {@linkcode Outbox.enqueueBatch}
   * and the {@linkcode Outbox.acknowledge} of one lease made inside `fn`, on
   * this outbox or any outbox or inbox on the same connection, run inside
   * that transaction under a savepoint, and its `COMMIT` or `ROLLBACK`
   * decides. With none open they run on their own. The same calls made
   * anywhere else wait for the application's transaction to end (at most
   * `busyTimeoutMs`), so a rollback never takes back an event whose call
   * was not part of it. Where the runtime has no `AsyncLocalStorage`
   * (browsers), every such call made while `fn` runs joins.
   *
   * @param fn The application's code that belongs to its transaction.
   * @returns What `fn` returned.
   * @throws {TypeError} When `fn` is not a function.
   *
   * @example The application's transaction on a shared node:sqlite handle
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { nodeSqliteDriver } from "@leased/outbox/node-sqlite";
   * import { DatabaseSync } from "node:sqlite";
   * import assert from "node:assert/strict";
   *
   * const db = new DatabaseSync(":memory:");
   * await using outbox = await Outbox.open(nodeSqliteDriver(db));
   * db.exec("BEGIN IMMEDIATE");
   * await outbox.within(() => outbox.enqueue({ order: 1 })); // joins it
   * db.exec("ROLLBACK");
   * assert.equal((await outbox.stats()).pending, 0);
   * ```
   */
  within<T>(fn: () => Promise<T>): Promise<T> {
    return withinApplication("run within", this.#mutex, fn);
  }

  /**
   * Runs `fn` in one `BEGIN IMMEDIATE` transaction: the caller's statements,
   * enqueues and fenced acknowledgements commit together, or none of them
   * does. Throwing from `fn` rolls back and rethrows.
   *
   * Inside `fn`, use only the handle: a call on this outbox (or another
   * outbox on the same connection) made from `fn` throws at once, as it
   * would wait for the transaction that is waiting for it (where the
   * runtime has no `AsyncLocalStorage`, as in browsers, it is not detected
   * and waits). `tx.run` and `tx.query` refuse `BEGIN`, `COMMIT`, `END`,
   * `ROLLBACK`, `SAVEPOINT` and `RELEASE` (and PostgreSQL's `ABORT`,
   * `START TRANSACTION` and `PREPARE TRANSACTION`): the transaction ends
   * when `fn` does. While the application has its own transaction open on the
   * connection, this waits for it to end (see {@linkcode Outbox.enqueue}).
   *
   * @param fn The work; its result is returned after the commit.
   * @returns What `fn` returned.
   * @throws {LeaseLostError} When `tx.acknowledge` found its lease stale.
   * @throws {TransactionEndedError} When the engine ended or failed the
   * transaction (a statement of `fn` failed in a way that ends it, caught or
   * not, and `fn` went on), or PostgreSQL answered its `COMMIT` with
   * `ROLLBACK`: nothing of `fn` was committed, and every `tx` call made
   * after the end threw it too.
   * @throws {RangeError} When `tx.run` or `tx.query` is given a
   * transaction-control statement (before it runs).
   * @throws {TypeError} When `tx.run` or `tx.query` is given SQL that is not
   * a string, or parameters that are not an array (before it runs).
   * @throws {Error} When called from inside `fn` of a transaction on the
   * same connection.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Business row and event commit together
   * ```ts
   * import { Outbox } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
   * await outbox.transaction((tx) => tx.run("CREATE TABLE orders (id INTEGER PRIMARY KEY)"));
   * const id = await outbox.transaction(async (tx) => {
   *   const { lastInsertRowid } = await tx.run("INSERT INTO orders DEFAULT VALUES");
   *   await tx.enqueue({ order: Number(lastInsertRowid) });
   *   return Number(lastInsertRowid);
   * });
   * assert.deepEqual((await outbox.claim())?.payload, { order: id });
   * ```
   */
  async transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T> {
    if (typeof fn !== "function") {
      throw new TypeError(
        `Cannot run transaction as 'fn' must be a function: current value is ${
          describe(fn)
        }`,
      );
    }
    let enqueued = false;
    let ended = false;
    let lost: LeaseLostError | undefined;
    const driver = this.#driver;
    // Every call checks the handle is still inside its transaction: kept past
    // it, the handle would run outside the mutex and outside any transaction.
    const inside = (op: string) => {
      if (ended) {
        throw new Error(
          `Cannot ${op} as the transaction this handle belongs to has ended`,
        );
      }
      this.#runner.checkLive(op);
    };
    this.#closeGroup();
    const result = await this.#write(
      "run transaction",
      async (now) => {
        const tx: Transaction = {
          ...transactionStatements(driver, inside),
          enqueue: async (payload, options = {}) => {
            inside("enqueue");
            const event = this.#prepareEnqueue("enqueue", payload, options);
            enqueued = true;
            return await insertOne(this.#driver, this.#sql, event, now);
          },
          enqueueBatch: async (events) => {
            const op = "enqueue batch";
            inside(op);
            const prepared = this.#prepareBatch(op, events);
            enqueued = true;
            return await insertAll(this.#driver, this.#sql, prepared, now);
          },
          acknowledge: async (lease) => {
            inside("acknowledge");
            const checked = checkLease("acknowledge", "lease", lease);
            if (await this.#acknowledgeOne(checked, now)) return true;
            lost = new LeaseLostError(checked.eventId, checked.fence);
            throw lost;
          },
        };
        try {
          const value = await runTransactionBody(this.#mutex, () => fn(tx));
          // Catching the LeaseLostError inside fn must not let the stale
          // worker's writes commit.
          if (lost !== undefined) throw lost;
          return value;
        } finally {
          ended = true;
        }
      },
      // Never run again after a deadlock: fn is the application's code.
      { rerun: false },
    );
    if (enqueued) this.#enqueued();
    return result;
  }

  /** The queue of calls that name none. */
  get queue(): string {
    return this.#queue;
  }

  /** The default lease length of claims and renewals, in milliseconds. */
  get leaseMs(): number {
    return this.#leaseMs;
  }

  /** Whether {@linkcode Outbox.close} was called: every later call rejects. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Closes the connection once the calls made before it finish. Calls made
   * after it reject with an `Error` saying the outbox is closed.
   */
  close(): Promise<void> {
    try {
      this.#notNested("close");
    } catch (error) {
      return Promise.reject(error);
    }
    this.#closed = true;
    return this.#runner.line.run(() =>
      this.#mutex.run(async () => {
        await this.#stopWatching?.().catch(() => {});
        await this.#driver.close();
      })
    );
  }

  /** Same as {@linkcode Outbox.close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #enqueued(): void {
    for (const listener of this.#enqueueListeners) {
      try {
        listener();
      } catch (error) {
        reportError(error);
      }
    }
  }

  /**
   * Validates one event's payload and options; `element` names an element
   * of a batch (`"events[3]"`) in the messages.
   */
  #prepareEnqueue(
    op: string,
    payload: unknown,
    options: EnqueueOptions,
    element?: string,
  ): PreparedEnqueue {
    checkOptions(op, options, ENQUEUE_OPTIONS, element);
    const f = (field: string) =>
      element === undefined ? field : `${element}.${field}`;
    const queue = options.queue === undefined
      ? this.#queue
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
    ) ?? this.#maxAttempts;
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
      this.#maxPayloadBytes,
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

  /**
   * Ends the open group of enqueues, so that a later `enqueue()` cannot join
   * a transaction queued before a call that may enqueue too
   * (`enqueueBatch`, `transaction`): ids, dedup winners and per-key order
   * follow the order of the calls.
   */
  #closeGroup(): void {
    this.#group = undefined;
  }

  /**
   * Commits a group of enqueues in one transaction, then settles each
   * call's promise: with its own result or error, or with the transaction's
   * error when it failed.
   */
  async #commitGroup(group: EnqueueGroup): Promise<void> {
    // Calls arriving from now on form the next group.
    const close = () => {
      if (this.#group === group) this.#group = undefined;
    };
    let settled: Settled<EnqueueResult>[];
    try {
      settled = await this.#write(
        "enqueue",
        (now) => {
          close();
          return insertGroup(
            this.#driver,
            this.#sql,
            group.calls.map((call) => call.event),
            now,
          );
        },
        {
          join: group.join,
          // As for enqueueBatch.
          expire: false,
          // A deferred constraint one call broke refused the COMMIT of all:
          // each runs again in a transaction of its own, in order and in
          // this turn, so only that call fails.
          commitRefused: group.calls.length === 1
            ? undefined
            : () => this.#eachAlone(group.calls),
        },
      );
    } catch (error) {
      close();
      for (const call of group.calls) call.reject(error);
      return;
    }
    group.calls.forEach((call, i) => {
      const outcome = settled[i]!;
      if ("value" in outcome) call.resolve(outcome.value);
      else call.reject(outcome.error);
    });
    if (settled.some((outcome) => "value" in outcome)) this.#enqueued();
  }

  /** Commits each call of a group in a transaction of its own, in order. */
  async #eachAlone(
    calls: readonly EnqueueCall[],
  ): Promise<Settled<EnqueueResult>[]> {
    const settled: Settled<EnqueueResult>[] = [];
    for (const { event } of calls) {
      try {
        settled.push({
          value: await this.#runner.inTurn(
            "enqueue",
            async () =>
              insertOne(
                this.#driver,
                this.#sql,
                event,
                await this.#start("enqueue", false),
              ),
            {},
          ),
        });
      } catch (error) {
        settled.push({ error });
      }
    }
    return settled;
  }

  /** Validates the elements of a batch, naming each (`events[3]`). */
  #prepareBatch(op: string, events: unknown): PreparedEnqueue[] {
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
      return this.#prepareEnqueue(op, payload, options, element);
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

  async #claim(
    op: string,
    queue: string,
    leaseMs: number,
    max: number,
    token: string | undefined,
    now: number,
  ): Promise<Lease<P>[]> {
    const gate = await openGate(this.#driver, this.#flow, queue, now, max);
    if (gate.max === 0) return [];
    let candidates: Row[] = [];
    let payloads: unknown[] = [];
    // An unclaimable row is a dead letter once seen, but the claimable rows
    // read beside it are still pending and would be read again: each round
    // reads the whole batch afresh, until a round finds no unclaimable row,
    // so the batch fills as if those had never been there.
    for (let unclaimable = true; unclaimable;) {
      unclaimable = false;
      candidates = [];
      payloads = [];
      const rows = await this.#driver.query(this.#sql.candidates, [
        queue,
        now,
        gate.max,
        this.#maxPayloadBytes,
        gate.perKey,
      ]);
      for (const row of rows) {
        const reason = this.#unclaimable(row, payloads);
        if (reason === undefined) {
          candidates.push(row);
          continue;
        }
        unclaimable = true;
        await this.#deadLetter(row, reason, now);
      }
    }
    const admitted = await gate.admit(candidates);
    if (admitted.length < candidates.length) {
      const kept = new Set(admitted);
      payloads = payloads.filter((_, i) => kept.has(candidates[i]!));
      candidates = admitted;
    }
    if (candidates.length === 0) return [];
    const leaseUntil = now + leaseMs;
    const expired: LedgerRow[] = [];
    // 128 random bits per minted token (32 hex digits), drawn at once for
    // the batch.
    const random = randomBytes(
      token === undefined ? 16 * candidates.length : 0,
    );
    // Each lease is its row as read plus what the claim's UPDATE changes
    // (CLAIM_SET in dialects/sqlite.ts).
    const leases = candidates.map((row, i): Lease<P> => {
      const eventId = integerOf(row, "id");
      const fence = integerOf(row, "fence");
      const taken = row["state"] === "leased";
      // Taking over a lapsed lease records how the previous attempt ended,
      // before the claim's own entry.
      if (taken) {
        expired.push([eventId, fence, "expired", null, null, LEASE_EXPIRED]);
      }
      return {
        eventId,
        identity: String(row["identity"]),
        queue,
        token: token ?? hex(random, 16 * i, 16),
        fence: successor("fence", fence),
        attempt: successor("attempt", integerOf(row, "attempt")),
        maxAttempts: integerOf(row, "max_attempts"),
        leaseUntil,
        payload: payloads[i] as P,
        orderingKey: nullableString(row["ordering_key"]),
        lastError: taken ? LEASE_EXPIRED : nullableString(row["last_error"]),
      };
    });
    if (token !== undefined) {
      for (const { eventId } of leases) {
        const used = await this.#driver.query(this.#sql.tokenUsed, [
          eventId,
          token,
        ]);
        if (used.length > 0) {
          throw new RangeError(
            `Cannot ${op} as 'token' was used on event ${eventId} before: reuse would let a stale worker act`,
          );
        }
      }
    }
    if (expired.length > 0) {
      await this.#writeUnwritten(expired.map(([eventId]) => eventId));
      await this.#ledgerAll(expired, now);
    }
    // The claims' own entries stay unwritten (schema.sql's
    // outbox_unwritten_attempts).
    let changes;
    if (leases.length === 1) {
      const { eventId, token: leaseToken } = leases[0]!;
      ({ changes } = await this.#driver.run(this.#sql.claimOne, [
        leaseUntil,
        now,
        eventId,
        leaseToken,
      ]));
    } else {
      ({ changes } = await this.#driver.run(this.#sql.claim, [
        leaseUntil,
        now,
        JSON.stringify(
          Object.fromEntries(leases.map((l) => [l.eventId, l.token])),
        ),
      ]));
    }
    // A lease whose row the UPDATE missed would leave its event claimable
    // by the next caller: two live holders.
    if (changes !== leases.length) {
      throw new Error(
        `Cannot ${op} as the claim changed ${changes} event rows for ${leases.length} leases: the transaction was rolled back`,
      );
    }
    // The per-key limit passed over candidates the batch had read in place
    // of other keys' events: another round, which sees these leases, fills
    // the batch with those.
    if (gate.keyTrimmed && leases.length < max) {
      leases.push(
        ...await this.#claim(
          op,
          queue,
          leaseMs,
          max - leases.length,
          token,
          now,
        ),
      );
    }
    return leases;
  }

  /**
   * The claim as the dialect's one statement, when it has one: resolves to
   * the leases, or to `undefined` when the statement refused an
   * unclaimable candidate, having changed nothing of it (the general path
   * then makes it a dead letter). With `acknowledge`, the statement first
   * acknowledges those leases, all of them or, refusing, none.
   */
  #claimInOne(
    op: string,
    queue: string,
    leaseMs: number,
    max: number,
    acknowledge?: readonly CheckedLease[],
  ): ((now: number | null) => Promise<Lease<P>[] | undefined>) | undefined {
    const sql = acknowledge === undefined
      ? this.#sql.claimInOne
      : this.#sql.acknowledgeAndClaimInOne;
    if (sql === undefined) return undefined;
    return async (now) => {
      // 128 random bits per token, minted for every lease the claim may take.
      const tokens = hex(randomBytes(16 * max), 0, 16 * max);
      const rows = await this.#driver.query(sql, [
        now,
        queue,
        max,
        this.#maxPayloadBytes,
        leaseMs,
        tokens,
        ...acknowledge === undefined ? [] : [
          leasesJson(acknowledge),
        ],
      ]);
      this.#checkNow(op, rows[0]?.["now"]);
      if (rows[0]?.["refused"] === 1) return undefined;
      return rows.filter((row) => row["id"] !== null).map((row) => ({
        eventId: integerOf(row, "id"),
        identity: String(row["identity"]),
        queue,
        token: String(row["token"]),
        fence: integerOf(row, "fence"),
        attempt: integerOf(row, "attempt"),
        maxAttempts: integerOf(row, "max_attempts"),
        leaseUntil: integerOf(row, "lease_until"),
        payload: decodePayload(row["payload_bytes"] ?? row["payload"]) as P,
        orderingKey: nullableString(row["ordering_key"]),
        lastError: nullableString(row["last_error"]),
      }));
    };
  }

  /**
   * The acknowledgement as the dialect's one statement, when it has one:
   * resolves to `true` per lease, or to `undefined` when a lease was stale
   * (or listed twice), having changed nothing: the general path then writes
   * the stale entries in order.
   */
  #acknowledgeInOne(
    op: string,
    leases: readonly CheckedLease[],
  ): ((now: number | null) => Promise<boolean[] | undefined>) | undefined {
    const one = leases.length === 1;
    const sql = one
      ? this.#sql.acknowledgeInOne
      : this.#sql.acknowledgeAllInOne;
    if (sql === undefined) return undefined;
    return async (now) => {
      const [row] = await this.#driver.query(
        sql,
        one ? [now, leases[0]!.eventId, leases[0]!.token, leases[0]!.fence] : [
          now,
          leasesJson(leases),
        ],
      );
      this.#checkNow(op, row?.["now"]);
      return row?.["acknowledged"] === leases.length
        ? leases.map(() => true)
        : undefined;
    };
  }

  /**
   * Decodes a candidate's payload into `payloads`; returns why the event
   * cannot be handed out instead, when it cannot.
   */
  #unclaimable(row: Row, payloads: unknown[]): string | undefined {
    const bytes = integerOf(row, "bytes");
    if (bytes > this.#maxPayloadBytes) {
      return `unclaimable: its payload of ${bytes} bytes exceeds this outbox's maxPayloadBytes of ${this.#maxPayloadBytes}`;
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

  /** Makes a candidate a dead letter with `reason`, in the ledger too. */
  async #deadLetter(row: Row, reason: string, now: number): Promise<void> {
    const eventId = integerOf(row, "id");
    const fence = integerOf(row, "fence");
    const entries: LedgerRow[] = [];
    if (row["state"] === "leased") {
      await this.#writeUnwritten([eventId]);
      entries.push([eventId, fence, "expired", null, null, LEASE_EXPIRED]);
    }
    entries.push([eventId, fence, "dead", null, null, reason]);
    await this.#driver.run(this.#sql.unclaimable, [now, reason, eventId]);
    await this.#ledgerAll(entries, now);
  }

  /**
   * Acknowledges one lease with plain statements: the batch's JSON would
   * cost a lone call more than its SQL does.
   */
  async #acknowledgeOne(lease: CheckedLease, now: number): Promise<boolean> {
    const { changes } = await this.#driver.run(this.#sql.acknowledge, [
      now,
      lease.eventId,
      lease.token,
      lease.fence,
    ]);
    if (changes === 0) {
      await this.#writeUnwritten([lease.eventId], false);
      await this.#stale(lease, "stale_acknowledge", now);
      return false;
    }
    return true;
  }

  async #acknowledge(
    leases: readonly CheckedLease[],
    now: number,
  ): Promise<boolean[]> {
    if (leases.length === 0) return [];
    // Usually every lease is current and listed once, and then the count
    // of changed rows says so: reading them back (RETURNING) cost a fifth of
    // the batch. A lease listed twice leaves one key in the object.
    await this.#driver.run(this.#sql.savepoint);
    const { changes } = await this.#driver.run(this.#sql.acknowledgeAll, [
      now,
      JSON.stringify(
        Object.fromEntries(
          leases.map((l) => [l.eventId, `${l.fence}:${l.token}`]),
        ),
      ),
    ]);
    if (changes === leases.length) {
      await this.#driver.run(this.#sql.releaseSavepoint);
      return leases.map(() => true);
    }
    // Some lease is stale, or listed twice (stale the second time): one at
    // a time, in the order of the calls, as the ledger records them.
    await this.#driver.run(this.#sql.rollbackToSavepoint);
    await this.#driver.run(this.#sql.releaseSavepoint);
    const results = [];
    for (const lease of leases) {
      results.push(await this.#acknowledgeOne(lease, now));
    }
    return results;
  }

  /**
   * Reads the lease clock at the start of a transaction and, unless
   * `expire` is off, makes lapsed last-attempt leases dead letters; on the
   * server's clock one statement does both when the dialect has it.
   */
  async #start(op: string, expire: boolean): Promise<number> {
    if (expire && this.#now === "database" && this.#sql.nowExhausted) {
      const rows = await this.#driver.query(this.#sql.nowExhausted);
      const now = this.#checkNow(op, rows[0]?.["now"]);
      await this.#expire(rows.filter((row) => row["id"] !== null), now);
      return now;
    }
    const now = await this.#clock(op);
    if (expire) await this.#expireExhausted(now);
    return now;
  }

  async #expireExhausted(now: number): Promise<void> {
    await this.#expire(
      await this.#driver.query(this.#sql.exhausted, [now]),
      now,
    );
  }

  /** Makes the exhausted leases `rows` (id, fence) dead letters. */
  async #expire(rows: readonly Row[], now: number): Promise<void> {
    if (rows.length === 0) return;
    const eventIds = rows.map((row) => integerOf(row, "id"));
    await this.#writeUnwritten(eventIds);
    await this.#driver.run(this.#sql.expire, [now, JSON.stringify(eventIds)]);
    await this.#ledgerAll(
      rows.flatMap((row): LedgerRow[] => {
        const eventId = integerOf(row, "id");
        const fence = integerOf(row, "fence");
        return [
          [eventId, fence, "expired", null, null, LEASE_EXPIRED],
          [eventId, fence, "dead", null, null, LEASE_EXPIRED],
        ];
      }),
      now,
    );
  }

  /**
   * Writes the entries that events' rows still hold, before an entry that
   * must follow them or a change to what they are read from. `locked`
   * tells whether this transaction holds the rows already (claims' and
   * expiry's candidates); if not, the dialect's `lockEvents` takes them
   * first.
   */
  async #writeUnwritten(
    eventIds: readonly number[],
    locked = true,
  ): Promise<void> {
    const ids = JSON.stringify(eventIds);
    if (!locked && this.#sql.lockEvents) {
      await this.#driver.query(this.#sql.lockEvents, [ids]);
    }
    await this.#driver.run(this.#sql.writeUnwritten, [ids]);
  }

  /** Writes ledger entries at `at`, in order, in one statement. */
  async #ledgerAll(entries: readonly LedgerRow[], at: number): Promise<void> {
    await this.#driver.run(this.#sql.ledgerAll, [at, JSON.stringify(entries)]);
  }

  /**
   * Records a stale call in the ledger, after the event's unwritten entries
   * (the caller writes those); the event row itself is untouched.
   */
  async #stale(
    lease: CheckedLease,
    kind: LedgerEntry["kind"],
    now: number,
  ): Promise<void> {
    await this.#driver.run(this.#sql.stale, [
      lease.eventId,
      lease.fence,
      kind,
      now,
      lease.token,
    ]);
  }

  async #ledger(
    eventId: number,
    fence: number,
    kind: LedgerEntry["kind"],
    at: number,
    token: string | null = null,
    leaseUntil: number | null = null,
    detail: string | null = null,
  ): Promise<void> {
    await this.#driver.run(this.#sql.ledger, [
      eventId,
      fence,
      kind,
      at,
      token,
      leaseUntil,
      detail,
    ]);
  }

  /**
   * Runs `fn` in a `BEGIN IMMEDIATE` transaction under the connection's
   * mutex, retrying `SQLITE_BUSY` after the driver's `busyWait` (or with
   * jittered exponential backoff when it has none) until `busyTimeoutMs`
   * (measured by `performance.now()`, a monotonic clock that
   * the injected lease clock must not stretch). `fn` sees the lease clock
   * read once the write lock is held, after lapsed last-attempt leases became
   * dead letters (`expire`, off only while the schema may not exist yet).
   *
   * Through the connection's {@linkcode TransactionRunner}: while the
   * application has a transaction open on the connection, a `join` call
   * (one made inside {@linkcode Outbox.within}) runs `fn` inside it under a
   * savepoint (`joined` is then `true`), and any other call waits, outside
   * the mutex, until the application's transaction ends: a claim or renewal
   * committed or rolled back with the application's writes would leave a
   * worker holding a lease the database never kept. A transaction the engine
   * ended or failed commits nothing (`TransactionEndedError`).
   *
   * Outside a transaction, `inOne` (the dialect's one-statement form of
   * the call, given the injected clock's `now` or null for the server's)
   * runs instead of `fn` and its transaction, unless it resolves to
   * `undefined`: it refused, having changed nothing `fn` must see undone.
   *
   * A transaction the server rolled back for contention alone (the
   * dialect's `rerun` codes: a deadlock's victim) runs again, with `fn`,
   * until `busyTimeoutMs`, unless `rerun` is false (`fn` runs the
   * application's code, which may have done more than SQL).
   */
  async #write<T>(
    op: string,
    fn: (now: number, joined: boolean) => Promise<T>,
    { expire = true, join = false, inOne, rerun = true, commitRefused }: {
      expire?: boolean;
      join?: boolean;
      inOne?: ((now: number | null) => Promise<T | undefined>) | undefined;
      rerun?: boolean;
      commitRefused?: (() => Promise<T>) | undefined;
    } = {},
  ): Promise<T> {
    this.#checkOpen(op);
    this.#notNested(op);
    const now = inOne && (() =>
      inOne(
        this.#now === "database" ? null : this.#checkNow(op, this.#now()),
      ));
    return await this.#runner.run(
      op,
      async (joined) => await fn(await this.#start(op, expire), joined),
      { join, inOne: now, rerun, commitRefused },
    );
  }

  #checkOpen(op: string): void {
    if (this.#closed) throw new Error(`Cannot ${op} as the outbox is closed`);
  }

  /**
   * Throws when called from inside `transaction(fn)` of an outbox on the
   * same connection: the call would wait for the mutex that the
   * transaction holds while it waits for the call.
   */
  #notNested(op: string): void {
    if (insideTransactionBody(this.#mutex)) {
      throw new Error(
        `Cannot ${op} on the outbox inside its own transaction(fn): use the transaction's handle (tx.enqueue, tx.acknowledge, tx.run), or the call would wait for the transaction that waits for it`,
      );
    }
  }

  async #clock(op: string): Promise<number> {
    if (this.#now === "database") {
      const [row] = await this.#driver.query(this.#sql.now!);
      return this.#checkNow(op, row?.["now"]);
    }
    return this.#checkNow(op, this.#now());
  }

  #checkNow(op: string, now: unknown): number {
    // Date's own range keeps now + MAX_DURATION_MS an exact integer.
    if (
      typeof now !== "number" || !Number.isSafeInteger(now) || now < 0 ||
      now > MAX_DATE_MS
    ) {
      throw new RangeError(
        `Cannot ${op} as the clock must return a non-negative integer of milliseconds within Date's range: current value is ${
          describe(now)
        }`,
      );
    }
    return now;
  }
}

/**
 * Creates or upgrades the schema inside the opening transaction: concurrent
 * first opens take turns on the write lock, so each version is applied and
 * recorded once.
 */
async function migrate(driver: Driver): Promise<void> {
  const tables = new Set(
    (await driver.query(SQL.tables)).map((row) => String(row["name"])),
  );
  let version: number;
  if (tables.has("outbox_schema")) {
    const [row] = await driver.query(SQL.schemaVersion);
    version = row === undefined ? 0 : integerOf(row, "version");
  } else if (tables.has("outbox_events")) {
    const [shape] = await driver.query(SQL.legacyShape);
    version = Number(shape?.["identity"]) > 0
      ? 4
      : Number(shape?.["claimed_at"]) > 0
      ? 3
      : Number(shape?.["triggers"]) > 0
      ? 1
      : 2;
    // The older release wrote this user_version; one that differs is the
    // application's, set after that release last opened the file.
    const [row] = await driver.query(SQL.userVersion);
    if (row !== undefined && integerOf(row, "user_version") === version) {
      await driver.run(SQL.resetUserVersion);
    }
    await driver.exec(VERSION_TABLE_SQL);
    await driver.run(SQL.recordVersion, [version]);
  } else {
    await driver.exec(SCHEMA_SQL);
    return;
  }
  if (version > SCHEMA_VERSION) {
    throw new SchemaVersionError(version, SCHEMA_VERSION);
  }
  for (; version < SCHEMA_VERSION; version++) {
    const step = UPGRADES.get(version);
    if (step === undefined) {
      throw new SchemaVersionError(version, SCHEMA_VERSION);
    }
    await driver.exec(step);
    await driver.run(SQL.recordVersion, [version + 1]);
  }
}

// A group of enqueues closes at this many calls or bytes of payload: its
// statement's JSON stays small enough to build and parse at once.
const MAX_GROUP = 1_000;
const MAX_GROUP_BYTES = 8 * 1024 * 1024;
// The most payload (bytes counted twice: they travel as hex) one
// enqueueBatch carries.
const MAX_BATCH_BYTES = 128 * 1024 * 1024;

interface EnqueueCall {
  readonly event: PreparedEnqueue;
  resolve(result: EnqueueResult): void;
  reject(error: unknown): void;
}

interface EnqueueGroup {
  readonly calls: EnqueueCall[];
  bytes: number;
  /** Whether its calls were made inside the application's transaction. */
  readonly join: boolean;
}

interface CheckedLease {
  readonly eventId: number;
  readonly token: string;
  readonly fence: number;
}

/** For `this.#sql.ledgerAll`: event id, fence, kind, token, lease_until, detail. */
type LedgerRow = [
  number,
  number,
  LedgerEntry["kind"],
  string | null,
  number | null,
  string | null,
];

/** `n` bytes from the platform's CSPRNG. */
function randomBytes(n: number): Uint8Array {
  const bytes = new Uint8Array(n);
  // getRandomValues fills at most 65,536 bytes per call.
  for (let i = 0; i < n; i += 65_536) {
    crypto.getRandomValues(bytes.subarray(i, i + 65_536));
  }
  return bytes;
}

/**
 * Leases as the one-statement acknowledgements take them: a JSON array of
 * [event id, fence, token].
 */
function leasesJson(leases: readonly CheckedLease[]): string {
  return JSON.stringify(leases.map((l) => [l.eventId, l.fence, l.token]));
}

function encodePayload(
  op: string,
  field: string,
  payload: unknown,
  maxBytes: number,
): SqlValue {
  if (payload instanceof Uint8Array) {
    // Checked before any copy: an oversized buffer never reaches the WASM heap.
    if (payload.byteLength > maxBytes) {
      throw tooLarge(op, field, payload.byteLength, maxBytes);
    }
    return payload;
  }
  let json: string | undefined;
  try {
    json = JSON.stringify(payload);
  } catch (error) {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be JSON-serializable`,
      {
        cause: error,
      },
    );
  }
  if (json === undefined) {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be JSON-serializable: current value is ${
        describe(payload)
      }`,
    );
  }
  // UTF-8 is at most 3 bytes per UTF-16 unit, so short texts skip the count.
  if (json.length * 3 > maxBytes) {
    const bytes = encoder.encode(json).byteLength;
    if (bytes > maxBytes) throw tooLarge(op, field, bytes, maxBytes);
  }
  return json;
}

/**
 * An event row (`this.#sql.event`) and its ledger rows (`this.#sql.history`) as an
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
    history: history.map((entry) => ({
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

function tooLarge(
  op: string,
  field: string,
  bytes: number,
  maxBytes: number,
): RangeError {
  return new RangeError(
    `Cannot ${op} as '${field}' must be at most ${maxBytes} bytes ('maxPayloadBytes'): current size is ${bytes} bytes`,
  );
}

/**
 * An integer column of a row as a number. SQLite's integers have 64 bits;
 * past ±2^53 a number would round, and a rounded id or fence names another
 * event or lease.
 */
/** `value + 1` for a fence or attempt a claim writes, refused past 2^53 - 1. */
function successor(column: string, value: number): number {
  if (value >= Number.MAX_SAFE_INTEGER) {
    throw new UnsafeIntegerError(column, BigInt(value) + 1n);
  }
  return value + 1;
}

function nullableString(value: SqlValue | undefined): string | null {
  return value === null || value === undefined ? null : String(value);
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
const ENQUEUE_OPTIONS = [
  "queue",
  "delayMs",
  "maxAttempts",
  "dedupKey",
  "orderingKey",
  "identity",
  "priority",
  "concurrencyKey",
];
const CLAIM_OPTIONS = ["queue", "leaseMs", "token", "max"];
const BATCH_CLAIM_OPTIONS = ["queue", "leaseMs", "max"];
const RELEASE_OPTIONS = ["delayMs", "error", "deadLetter"];
const PURGE_OPTIONS = ["olderThanMs", "states"];

function checkLease(op: string, field: string, lease: unknown): CheckedLease {
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
 * Validates {@linkcode ListOptions} into the parameters of `this.#sql.list`.
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
  checkOptions(op, options, ["state", "queue", "limit", "afterId"]);
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
