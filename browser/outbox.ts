/**
 * The outbox in the browser: the unchanged lease core on the official SQLite
 * WASM build, persisted in OPFS inside a dedicated worker, and shared by
 * every tab of an origin.
 *
 * {@linkcode openSharedOutbox} is what an app uses: one tab per origin (the
 * leader, elected with `navigator.locks`) hosts the database in its worker;
 * the other tabs forward calls to it over a `BroadcastChannel`. When the
 * leader tab closes, another tab takes over with the same database. A tab's
 * unfinished leases are released on `pagehide`.
 * {@linkcode openWorkerOutbox} is the single-tab building block: one worker,
 * one connection, and a typed {@linkcode OpfsBusyError} while someone else
 * holds the database.
 *
 * The bundle (`deno task build:browser`) puts `browser.js`,
 * `browser_worker.js`, `sqlite3.wasm` and `sqlite3-opfs-async-proxy.js` side
 * by side; serve them together.
 *
 * @example Queue work in any tab, deliver it from the leader
 * ```ts ignore
 * import { deliveryHeaders } from "@leased/outbox";
 * import { openSharedOutbox } from "@leased/outbox/browser";
 *
 * const outbox = await openSharedOutbox("mail");
 * await outbox.enqueue({ to: "ada@example.com", text: "hi" });
 * const lease = await outbox.claim({ leaseMs: 30_000 });
 * if (lease) {
 *   await fetch("/send", {
 *     method: "POST",
 *     headers: deliveryHeaders(lease),
 *     body: JSON.stringify(lease.payload),
 *   });
 *   await outbox.acknowledge(lease);
 * }
 * ```
 *
 * @module
 */
export { OpfsBusyError, OpfsUnavailableError } from "./protocol.ts";
export type { BrowserStats, StorageEstimate } from "./protocol.ts";
export { RemoteOutbox } from "./remote.ts";
export type { BrowserOutboxOptions } from "./connection.ts";
export { openWorkerOutbox, WorkerOutbox } from "./worker_outbox.ts";
export { openSharedOutbox, SharedOutbox } from "./shared.ts";
export {
  BusyError,
  ConstraintError,
  LeaseLostError,
  PermanentError,
  RetryAfterError,
  SchemaVersionError,
  SqliteError,
  StorageFullError,
} from "../errors.ts";
export {
  type Handler,
  type HandlerContext,
  type ProcessableOutbox,
  processEvents,
  type ProcessOptions,
  Processor,
  type ProcessorCounters,
  type Timers,
} from "../worker.ts";
export type {
  EventInfo,
  ListOptions,
  PurgeOptions,
  QueueCounts,
  RedriveOptions,
} from "../admin.ts";
export type {
  AcknowledgedAndClaimed,
  BatchClaimOptions,
  BatchEvent,
  ClaimOptions,
  Clock,
  DeadLetter,
  EnqueueOptions,
  EnqueueResult,
  EventState,
  Explanation,
  Lease,
  LedgerEntry,
  OutboxOptions,
  ReleaseOptions,
  Stats,
  Transaction,
} from "../lease.ts";
export type { OpfsVfs, Synchronous } from "./host.ts";
export type { Row, RunResult, SqlValue } from "../driver.ts";
export type { QueueFlow, QueueLimits } from "../core/flow.ts";
export type {
  MissedTicks,
  Schedule,
  ScheduleOptions,
} from "../core/schedules.ts";
