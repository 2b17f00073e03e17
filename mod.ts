/**
 * leased-outbox: a durable transactional outbox with leases on SQLite.
 *
 * Producers commit an event together with their business rows; workers
 * claim it under a lease (a deadline plus a fresh token and a fence), do the
 * side effect, and acknowledge it. An acknowledgement matches the event id
 * *and* the current token, so a worker whose lease lapsed can never complete
 * a newer worker's claim. Every event has a global identity (UUIDv7 text):
 * recipients dedupe on it, and the {@linkcode Inbox} is the receiving half
 * that applies each event's effect once. The core talks to SQLite only
 * through a {@linkcode Driver}; drivers are separate exports
 * (`./sqlite-wasm`).
 *
 * @example Produce, claim, acknowledge
 * ```ts
 * import { Outbox } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
 * await outbox.transaction(async (tx) => {
 *   await tx.run("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)");
 *   await tx.run("INSERT INTO orders (total) VALUES (?)", [4200]);
 *   await tx.enqueue({ type: "order.placed", total: 4200 });
 * });
 * const lease = await outbox.claim({ leaseMs: 30_000 });
 * assert.deepEqual(lease?.payload, { type: "order.placed", total: 4200 });
 * // Deliver it with deliveryHeaders(lease): the recipient dedupes on
 * // lease.identity (Idempotency-Key). Then:
 * assert.equal(await outbox.acknowledge(lease!), true);
 * ```
 *
 * @module
 */
export {
  type AcknowledgedAndClaimed,
  type BatchClaimOptions,
  type BatchEvent,
  type ClaimOptions,
  type Clock,
  type DeadLetter,
  type Dialect,
  type EnqueueOptions,
  type EnqueueResult,
  type EventState,
  type Explanation,
  type Lease,
  type LedgerEntry,
  MAX_ATTEMPTS,
  MAX_BATCH,
  MAX_DURATION_MS,
  MAX_PAYLOAD_BYTES,
  Outbox,
  type OutboxOptions,
  type ReleaseOptions,
  type StatementName,
  type Stats,
  type Transaction,
} from "./lease.ts";
export type {
  ActivityCount,
  CountQueuesOptions,
  EventInfo,
  ListOptions,
  PurgeOptions,
  QueueCounts,
  QueuesOptions,
  RedriveOptions,
} from "./admin.ts";
export type { QueueFlow, QueueLimits } from "./core/flow.ts";
export type {
  MissedTicks,
  Schedule,
  ScheduleOptions,
} from "./core/schedules.ts";
export type { Driver, Row, RunResult, SqlValue } from "./driver.ts";
export type { TransactionStatus } from "./types.ts";
export { isIdentity, uuidv7, uuidv7Time } from "./identity.ts";
export {
  type AcceptResult,
  type Delivery,
  deliveryHeaders,
  FENCE_HEADER,
  IDENTITY_HEADER,
  Inbox,
  INBOX_SCHEMA_SQL,
  type InboxOptions,
  type InboxTransaction,
  isRetryStatus,
  readDeliveryHeaders,
} from "./inbox.ts";
export {
  BusyError,
  ConnectionLostError,
  ConstraintError,
  DatabaseMovedError,
  DedupRaceError,
  LeaseLostError,
  PermanentError,
  PostgresError,
  RetryAfterError,
  SchemaVersionError,
  SqliteError,
  sqliteError,
  StatementTimeoutError,
  StorageFullError,
  TransactionEndedError,
  UnsafeIntegerError,
} from "./errors.ts";
export { SCHEMA_SQL, SCHEMA_VERSION, SQLITE_SCHEMA_VERSION } from "./schema.ts";
export { POSTGRES_SCHEMA_VERSION } from "./dialects/postgres.ts";
export type { WalStats } from "./wal.ts";
export {
  type Handler,
  type HandlerContext,
  type ProcessableOutbox,
  processEvents,
  type ProcessOptions,
  Processor,
  type ProcessorCounters,
  type Timers,
} from "./worker.ts";
