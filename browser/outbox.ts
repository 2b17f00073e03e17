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
import type { QueueFlow, QueueLimits } from "../core/flow.ts";
import type { Schedule, ScheduleOptions } from "../core/schedules.ts";
import type {
  AcknowledgedAndClaimed,
  BatchClaimOptions,
  ClaimOptions,
  DeadLetter,
  EnqueueOptions,
  EnqueueResult,
  Explanation,
  Lease,
  OutboxOptions,
  ReleaseOptions,
  Stats,
} from "../lease.ts";
import { OUTBOX_OPTIONS } from "../lease.ts";
import { checkOptions } from "../validate.ts";
import type {
  EventInfo,
  ListOptions,
  PurgeOptions,
  QueueCounts,
  RedriveOptions,
} from "../admin.ts";
import type { OpenConfig, OpfsVfs, Synchronous } from "./host.ts";
import { uuidv7 } from "../identity.ts";
import {
  type CallMessage,
  type ChannelMessage,
  claimedLeases,
  fromWireError,
  OpfsBusyError,
  OpfsUnavailableError,
  type ReplyMessage,
  TAB_CLOSED,
  toWireError,
} from "./protocol.ts";

export { OpfsBusyError, OpfsUnavailableError };
export {
  BusyError,
  ConstraintError,
  LeaseLostError,
  PermanentError,
  RetryAfterError,
  SchemaVersionError,
  SqliteError,
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
export type { QueueFlow, QueueLimits } from "../core/flow.ts";
export type {
  MissedTicks,
  Schedule,
  ScheduleOptions,
} from "../core/schedules.ts";
export type {
  BatchClaimOptions,
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
} from "../lease.ts";
export type { OpfsVfs, Synchronous } from "./host.ts";

/** Options for {@linkcode openWorkerOutbox} and {@linkcode openSharedOutbox}. */
export interface BrowserOutboxOptions extends Omit<OutboxOptions, "now"> {
  /**
   * The OPFS VFS; see {@linkcode OpfsVfs}. Changing it later does not move
   * data: each VFS keeps its own files.
   *
   * @default {"auto"}
   */
  readonly vfs?: OpfsVfs;
  /**
   * How long opening keeps retrying while another worker or tab holds the
   * database (a closing tab's worker lets go a moment after the tab), in ms.
   * `0` fails at once with {@linkcode OpfsBusyError}.
   *
   * @default {5000}
   */
  readonly openTimeoutMs?: number;
  /**
   * `PRAGMA synchronous`; see {@linkcode Synchronous}.
   *
   * @default {"full"}
   */
  readonly synchronous?: Synchronous;
  /**
   * Where the worker bundle is served.
   *
   * @default {new URL("./browser_worker.js", import.meta.url)}
   */
  readonly workerUrl?: string | URL;
}

const NAME = /^[A-Za-z0-9_-]{1,64}$/;

/**
 * The outbox API of {@linkcode Outbox}, asynchronous across a worker (and
 * possibly a tab) boundary. Leases are plain objects that survive
 * `postMessage`; the typed errors arrive as their own classes.
 * `transaction()` is not offered: a callback cannot cross a worker boundary.
 */
export abstract class RemoteOutbox<P = unknown> extends EventTarget {
  /** The outbox name (one database per name and origin). */
  readonly name: string;
  /** The default lease length of claims and renewals, in milliseconds. */
  readonly leaseMs: number;
  readonly #held = new Map<string, Lease<unknown>>();

  /**
   * Starts the client side of one outbox.
   *
   * @param name The outbox name.
   * @param leaseMs The outbox's default lease length, in milliseconds.
   */
  constructor(name: string, leaseMs = 30_000) {
    super();
    this.name = name;
    this.leaseMs = leaseMs;
  }

  /** Whether {@linkcode RemoteOutbox.close} was called: every later call rejects. */
  abstract get closed(): boolean;

  /**
   * Calls `listener` whenever this object dispatches `"enqueue"` (an event
   * was stored through it; in the leader tab of a shared outbox, through any
   * tab), so
   * {@linkcode processEvents} wakes for new work.
   *
   * @param listener Called after the event is stored.
   * @returns A function that removes the listener.
   */
  onEnqueue(listener: () => void): () => void {
    if (typeof listener !== "function") {
      throw new TypeError(
        `Cannot listen for enqueues as 'listener' must be a function: current value is ${typeof listener}`,
      );
    }
    const entry = () => listener();
    this.addEventListener("enqueue", entry);
    return () => this.removeEventListener("enqueue", entry);
  }

  /**
   * Sends one call to the database worker.
   *
   * @param method An outbox method name.
   * @param args Its arguments, structured-clonable.
   * @returns What the method returned.
   */
  protected abstract invoke(
    method: string,
    args: readonly unknown[],
  ): Promise<unknown>;

  /** Closes the outbox; later calls reject. */
  abstract close(): Promise<void>;

  /** Same as {@linkcode RemoteOutbox.close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /**
   * Adds a pending event; see `Outbox.enqueue`.
   *
   * @param payload A JSON-serializable value, or a `Uint8Array`.
   * @param options Delay, attempts, dedup and ordering keys, queue.
   * @returns The event id and whether `dedupKey` matched an earlier event.
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async enqueue(
    payload: P,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    return await this.invoke("enqueue", [payload, options]) as EnqueueResult;
  }

  /**
   * Claims the oldest eligible event under a new lease; see `Outbox.claim`.
   * The lease is remembered until it is acknowledged or released, so that
   * the tab can give it back when it goes away.
   *
   * @param options Lease length, token, queue; with `max`, claims a batch.
   * @returns The lease or `null` (with `max`: the leases, possibly none).
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  claim(options?: ClaimOptions): Promise<Lease<P> | null>;
  /**
   * Claims up to `options.max` eligible events, each under its own lease, in
   * one transaction; see `Outbox.claim`.
   *
   * @param options `max`, lease length, queue.
   * @returns The leases, possibly none.
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  claim(options: BatchClaimOptions): Promise<Lease<P>[]>;
  async claim(
    options: ClaimOptions | BatchClaimOptions = {},
  ): Promise<Lease<P> | null | Lease<P>[]> {
    const result = await this.invoke("claim", [options]) as
      | Lease<P>
      | null
      | Lease<P>[];
    for (const lease of Array.isArray(result) ? result : [result]) {
      if (lease !== null) this.#held.set(leaseKey(lease), lease);
    }
    return result;
  }

  /**
   * Marks claimed events done iff their tokens are still current; see
   * `Outbox.acknowledge`.
   *
   * @param lease One lease or several (acknowledged in one transaction).
   * @returns `true` per acknowledged lease, `false` for a stale one.
   * @throws {TypeError} When a lease is malformed.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  acknowledge(lease: Lease<unknown>): Promise<boolean>;
  /**
   * Acknowledges several leases in one transaction; see `Outbox.acknowledge`.
   *
   * @param leases The leases.
   * @returns Per lease, `true` when acknowledged, `false` when stale.
   * @throws {TypeError} When a lease is malformed.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  acknowledge(leases: readonly Lease<unknown>[]): Promise<boolean[]>;
  async acknowledge(
    lease: Lease<unknown> | readonly Lease<unknown>[],
  ): Promise<boolean | boolean[]> {
    const result = await this.invoke("acknowledge", [lease]) as
      | boolean
      | boolean[];
    for (const each of Array.isArray(lease) ? lease : [lease]) {
      this.#held.delete(leaseKey(each as Lease<unknown>));
    }
    return result;
  }

  /**
   * Acknowledges leases and claims up to `options.max` more in one
   * transaction; see `Outbox.acknowledgeAndClaim`. The new leases are
   * remembered as a claim's are, and the acknowledged ones forgotten.
   *
   * @param leases The leases to acknowledge, possibly none.
   * @param options `max`, lease length, queue.
   * @returns Per lease whether it was acknowledged, and the new leases.
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async acknowledgeAndClaim(
    leases: readonly Lease<unknown>[],
    options: BatchClaimOptions,
  ): Promise<AcknowledgedAndClaimed<P>> {
    const result = await this.invoke("acknowledgeAndClaim", [
      leases,
      options,
    ]) as AcknowledgedAndClaimed<P>;
    for (const lease of leases) this.#held.delete(leaseKey(lease));
    for (const lease of result.leases) this.#held.set(leaseKey(lease), lease);
    return result;
  }

  /**
   * Extends a live lease; see `Outbox.renew`.
   *
   * @param lease The lease to extend.
   * @param leaseMs The new lease length from now, in ms.
   * @returns The new deadline (epoch ms), or `false` when the lease is lost.
   * @throws {TypeError | RangeError} When an argument is invalid.
   */
  async renew(
    lease: Lease<unknown>,
    leaseMs?: number,
  ): Promise<number | false> {
    return await this.invoke(
      "renew",
      leaseMs === undefined ? [lease] : [lease, leaseMs],
    ) as number | false;
  }

  /**
   * Gives a claimed event back early; see `Outbox.release`.
   *
   * @param lease The lease to give back.
   * @param options `delayMs` before it is due again, `error` to record.
   * @returns `true` when released, `false` when the lease was stale.
   * @throws {TypeError | RangeError} When an argument is invalid.
   */
  async release(
    lease: Lease<unknown>,
    options: ReleaseOptions = {},
  ): Promise<boolean> {
    const result = await this.invoke("release", [lease, options]) as boolean;
    this.#held.delete(leaseKey(lease));
    return result;
  }

  /**
   * Lists dead events; see `Outbox.deadLetters`.
   *
   * @param options `queue` and `limit`.
   * @returns The dead letters, oldest first.
   */
  async deadLetters(
    options: { readonly queue?: string; readonly limit?: number } = {},
  ): Promise<DeadLetter<P>[]> {
    return await this.invoke("deadLetters", [options]) as DeadLetter<P>[];
  }

  /**
   * Lists events in one state, a page at a time; see `Outbox.list`.
   *
   * @param options `state`, `queue`, `limit`, `afterId`.
   * @returns The events.
   */
  async list(options: ListOptions): Promise<EventInfo<P>[]> {
    return await this.invoke("list", [options]) as EventInfo<P>[];
  }

  /**
   * Cancels a pending event (it becomes a dead letter, `"cancelled"`); see
   * `Outbox.cancel`.
   *
   * @param eventId The event.
   * @returns `true` when it was pending and is cancelled now.
   */
  async cancel(eventId: number): Promise<boolean> {
    return await this.invoke("cancel", [eventId]) as boolean;
  }

  /**
   * Makes dead letters claimable again; see `Outbox.redrive`.
   *
   * @param options `queue`, `ids`.
   * @returns How many are pending now.
   */
  async redrive(options: RedriveOptions = {}): Promise<number> {
    return await this.invoke("redrive", [options]) as number;
  }

  /**
   * Deletes done events and dead letters older than a duration; see
   * `Outbox.purge`.
   *
   * @param options `olderThanMs`, `states`.
   * @returns How many events were deleted.
   */
  async purge(options: PurgeOptions): Promise<number> {
    return await this.invoke("purge", [options]) as number;
  }

  /**
   * Counts every queue's events per state; see `Outbox.queues`.
   *
   * @returns One entry per queue.
   */
  async queues(): Promise<QueueCounts[]> {
    return await this.invoke("queues", []) as QueueCounts[];
  }

  /**
   * Time until a queue's next event comes due; see `Outbox.nextDueInMs`.
   *
   * @param options `queue`.
   * @returns Milliseconds, or `null` when nothing is scheduled.
   */
  async nextDueInMs(
    options: { readonly queue?: string } = {},
  ): Promise<number | null> {
    return await this.invoke("nextDueInMs", [options]) as number | null;
  }

  /**
   * Pauses a queue for every tab and worker of the database; see
   * `Outbox.pause`.
   *
   * @param queue The queue's name.
   */
  async pause(queue: string): Promise<void> {
    await this.invoke("pause", [queue]);
  }

  /**
   * Resumes a paused queue; see `Outbox.resume`.
   *
   * @param queue The queue's name.
   */
  async resume(queue: string): Promise<void> {
    await this.invoke("resume", [queue]);
  }

  /**
   * Sets a queue's per-key and rate limits; see `Outbox.setLimits`.
   *
   * @param queue The queue's name.
   * @param limits `perKey`, `perSecond` (`null` clears one).
   */
  async setLimits(queue: string, limits: QueueLimits): Promise<void> {
    await this.invoke("setLimits", [queue, limits]);
  }

  /**
   * A queue's flow control; see `Outbox.limits`.
   *
   * @param queue The queue's name.
   * @returns `paused`, `perKey`, `perSecond`.
   */
  async limits(queue: string): Promise<QueueFlow> {
    return await this.invoke("limits", [queue]) as QueueFlow;
  }

  /**
   * Stores a cron schedule; see `Outbox.schedule`.
   *
   * @param name The schedule's name.
   * @param cron The cron expression.
   * @param payload What each tick enqueues (JSON).
   * @param options `queue`, `timezone`, `missed` and the events' options.
   */
  async schedule(
    name: string,
    cron: string,
    payload: P,
    options: ScheduleOptions = {},
  ): Promise<void> {
    await this.invoke("schedule", [name, cron, payload, options]);
  }

  /**
   * Removes a schedule; see `Outbox.unschedule`.
   *
   * @param name The schedule's name.
   * @returns Whether there was one.
   */
  async unschedule(name: string): Promise<boolean> {
    return await this.invoke("unschedule", [name]) as boolean;
  }

  /**
   * Lists the schedules; see `Outbox.schedules`.
   *
   * @returns Each schedule.
   */
  async schedules(): Promise<Schedule[]> {
    return await this.invoke("schedules", []) as Schedule[];
  }

  /**
   * Enqueues the schedules' due ticks once each; see `Outbox.runSchedules`
   * (`processEvents` calls it).
   *
   * @returns How many events were enqueued.
   */
  async runSchedules(): Promise<number> {
    return await this.invoke("runSchedules", []) as number;
  }

  /**
   * Counts events per state; see `Outbox.stats`.
   *
   * @param options `queue`.
   * @returns Pending, leased, done and dead counts and the oldest pending age.
   */
  async stats(options: { readonly queue?: string } = {}): Promise<Stats> {
    return await this.invoke("stats", [options]) as Stats;
  }

  /**
   * Tells the history of one event; see `Outbox.explain`.
   *
   * @param event The event's id or identity.
   * @returns Its state and attempt ledger, or `null` when there is no such event.
   */
  async explain(event: number | string): Promise<Explanation | null> {
    return await this.invoke("explain", [event]) as Explanation | null;
  }

  /**
   * The leases this tab claimed and has not acknowledged or released yet.
   *
   * @returns A snapshot of them.
   */
  heldLeases(): Lease<unknown>[] {
    return [...this.#held.values()];
  }
}

function leaseMsOf(setup: WorkerSetup): number | undefined {
  const leaseMs = setup.config.outbox["leaseMs"];
  return typeof leaseMs === "number" ? leaseMs : undefined;
}

function leaseKey(lease: Lease<unknown>): string {
  return `${lease.eventId}:${lease.token}`;
}

function checkName(op: string, name: unknown): string {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new TypeError(
      `Cannot ${op} as 'name' must be 1-64 letters, digits, '_' or '-': current value is ${
        typeof name === "string" ? JSON.stringify(name) : String(name)
      }`,
    );
  }
  return name;
}

function checkOpenTimeout(op: string, value: unknown): number {
  if (value === undefined) return 5_000;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
    throw new RangeError(
      `Cannot ${op} as 'openTimeoutMs' must be a non-negative integer: current value is ${
        String(value)
      }`,
    );
  }
  return value;
}

interface WorkerSetup {
  readonly config: OpenConfig;
  readonly workerUrl: string | URL;
}

function setup(
  op: string,
  name: unknown,
  options: BrowserOutboxOptions,
): WorkerSetup {
  checkOptions(op, options, [
    ...OUTBOX_OPTIONS.filter((key) => key !== "now"),
    "vfs",
    "synchronous",
    "openTimeoutMs",
    "workerUrl",
  ]);
  const {
    vfs = "auto",
    synchronous = "full",
    openTimeoutMs,
    workerUrl,
    ...outbox
  } = options;
  return {
    config: {
      name: checkName(op, name),
      vfs,
      synchronous,
      openTimeoutMs: checkOpenTimeout(op, openTimeoutMs),
      outbox: { ...outbox },
    },
    workerUrl: workerUrl ?? new URL("./browser_worker.js", import.meta.url),
  };
}

/** One dedicated worker and the calls waiting for its replies. */
class WorkerConnection {
  readonly #worker: Worker;
  readonly #pending = new Map<
    string,
    { resolve(value: unknown): void; reject(error: Error): void }
  >();
  #next = 0;
  #broken: Error | undefined;
  vfs = "";

  constructor(workerUrl: string | URL, onFail: (error: Error) => void) {
    this.#worker = new Worker(workerUrl, { type: "module" });
    this.#worker.addEventListener("message", (event) => {
      const reply = event.data as ReplyMessage;
      const call = this.#pending.get(reply.id);
      if (reply.type !== "reply" || call === undefined) return;
      this.#pending.delete(reply.id);
      if (reply.ok) call.resolve(reply.value);
      else call.reject(fromWireError(reply.error));
    });
    this.#worker.addEventListener("error", (event) => {
      event.preventDefault();
      const error = new Error(
        `Outbox worker ${String(workerUrl)} failed: ${
          event.message || "it could not be loaded"
        }`,
      );
      // An uncaught error leaves the connection in an unknown state: end the
      // worker, which also lets go of its OPFS handles for the next opener.
      this.terminate(error);
      onFail(error);
    });
  }

  static async open(
    setup: WorkerSetup,
    onFail: (error: Error) => void = () => {},
  ): Promise<WorkerConnection> {
    const connection = new WorkerConnection(setup.workerUrl, onFail);
    try {
      const { vfs } = await connection.call("open", [setup.config]) as {
        vfs: string;
      };
      connection.vfs = vfs;
      return connection;
    } catch (error) {
      connection.terminate();
      throw error;
    }
  }

  call(
    method: string,
    args: readonly unknown[],
    own = true,
  ): Promise<unknown> {
    if (this.#broken) return Promise.reject(this.#broken);
    const id = String(this.#next++);
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.#worker.postMessage(
        { type: "call", id, method, args, own } satisfies CallMessage,
      );
    });
  }

  async close(): Promise<void> {
    if (this.#broken) return;
    try {
      await this.call("close", []);
    } finally {
      this.terminate();
    }
  }

  terminate(error = new Error("The outbox is closed")): void {
    this.#worker.terminate();
    this.#broken ??= error;
    for (const call of this.#pending.values()) call.reject(error);
    this.#pending.clear();
  }
}

/**
 * An outbox in one dedicated worker of this tab, holding the database alone.
 * Made by {@linkcode openWorkerOutbox}. Dispatches `"enqueue"` after each of
 * its enqueues.
 */
export class WorkerOutbox<P = unknown> extends RemoteOutbox<P> {
  readonly #connection: WorkerConnection;
  readonly #visibility: () => void;
  #closed = false;

  private constructor(
    name: string,
    connection: WorkerConnection,
    leaseMs: number | undefined,
  ) {
    super(name, leaseMs);
    this.#connection = connection;
    this.#visibility = watchVisibility(
      () => connection.call("hide", []).catch(() => {}),
      () => connection.call("show", []).catch(() => {}),
    );
  }

  /** @internal Use {@linkcode openWorkerOutbox}. */
  static async open<P>(
    name: string,
    setup: WorkerSetup,
  ): Promise<WorkerOutbox<P>> {
    return new WorkerOutbox<P>(
      name,
      await WorkerConnection.open(setup),
      leaseMsOf(setup),
    );
  }

  /** Whether {@linkcode WorkerOutbox.close} was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** The SQLite VFS the database was opened through. */
  get vfs(): string {
    return this.#connection.vfs;
  }

  /**
   * Sends one call to the worker; a stored event is announced with an
   * `"enqueue"` event, which wakes {@linkcode processEvents}.
   */
  protected async invoke(
    method: string,
    args: readonly unknown[],
  ): Promise<unknown> {
    const result = await this.#connection.call(method, args);
    if (method === "enqueue") this.dispatchEvent(new Event("enqueue"));
    return result;
  }

  /** Closes the database, releases its OPFS handles and ends the worker. */
  close(): Promise<void> {
    this.#closed = true;
    this.#visibility();
    return this.#connection.close();
  }
}

/**
 * Calls `hide` on `pagehide` and `show` on a `pageshow` from the back-forward
 * cache, where there is a page (not in workers).
 *
 * @returns A function that stops watching.
 */
function watchVisibility(hide: () => void, show: () => void): () => void {
  if (typeof globalThis.addEventListener !== "function") return () => {};
  const onShow = (event: Event) => {
    if ((event as Event & { persisted?: boolean }).persisted) show();
  };
  globalThis.addEventListener("pagehide", hide);
  globalThis.addEventListener("pageshow", onShow);
  return () => {
    globalThis.removeEventListener("pagehide", hide);
    globalThis.removeEventListener("pageshow", onShow);
  };
}

/**
 * Opens an outbox in a new dedicated worker of this tab, persisted in OPFS.
 * Only one worker per origin can hold an `opfs-sahpool` database; use
 * {@linkcode openSharedOutbox} when several tabs need the queue.
 *
 * @param name The outbox name: 1-64 letters, digits, `_` or `-`.
 * @param options See {@linkcode BrowserOutboxOptions}.
 * @returns The open outbox.
 * @throws {OpfsBusyError} When another worker or tab holds the database for
 * longer than `openTimeoutMs`; nothing stays locked by the failed attempt.
 * @throws {OpfsUnavailableError} When this context cannot use OPFS.
 * @throws {TypeError | RangeError} When an argument is invalid.
 *
 * @example Usage
 * ```ts ignore
 * import { openWorkerOutbox } from "@leased/outbox/browser";
 *
 * await using outbox = await openWorkerOutbox("uploads", { openTimeoutMs: 0 });
 * await outbox.enqueue({ file: "photo.jpg" });
 * ```
 */
export function openWorkerOutbox<P = unknown>(
  name: string,
  options: BrowserOutboxOptions = {},
): Promise<WorkerOutbox<P>> {
  try {
    return WorkerOutbox.open<P>(name, setup("open outbox", name, options));
  } catch (error) {
    return Promise.reject(error);
  }
}

// The slice of the Web Locks API used here (absent from Deno's own lib).
interface LockManager {
  request(
    name: string,
    options: { signal: AbortSignal },
    callback: () => Promise<void>,
  ): Promise<void>;
}

interface ForwardedCall {
  readonly method: string;
  readonly args: readonly unknown[];
  resolve(value: unknown): void;
  reject(error: Error): void;
}

// A leader remembers the ids of the calls it ran, so that a call a follower
// re-sends (it learned of this leader after sending) does not run twice.
const SEEN_LIMIT = 100_000;

const WORKER_ONLY = new Set(["open", "close", "hide", "show", "hasVfs"]);

/**
 * An outbox shared by every tab of the origin. Made by
 * {@linkcode openSharedOutbox}. Dispatches `"leaderchange"` when the tab
 * hosting the database changes, and in the leader tab `"enqueue"` whenever
 * an event from any tab was stored.
 */
export class SharedOutbox<P = unknown> extends RemoteOutbox<P> {
  /** This tab's id on the channel. */
  readonly tab: string = crypto.randomUUID();
  readonly #setup: WorkerSetup;
  readonly #channel: BroadcastChannel;
  readonly #pending = new Map<string, ForwardedCall>();
  readonly #seen = new Set<string>();
  readonly #abort = new AbortController();
  readonly #locks: LockManager;
  readonly #hiddenTabs = new Set<string>();
  #unwatch: () => void = () => {};
  #stopLeading: (() => void) | undefined;
  #local: WorkerConnection | undefined;
  #leader: string | undefined;
  #failure: Error | undefined;
  #next = 0;

  private constructor(name: string, setup: WorkerSetup) {
    super(name, leaseMsOf(setup));
    this.#setup = setup;
    this.#channel = new BroadcastChannel(`leased-outbox:${name}`);
    this.#channel.addEventListener(
      "message",
      (event) => this.#receive(event.data as ChannelMessage),
    );
    const locks = (navigator as unknown as { locks?: LockManager }).locks;
    if (locks === undefined) {
      this.#channel.close();
      throw new OpfsUnavailableError(
        "navigator.locks is not available: a shared outbox needs a secure context",
      );
    }
    this.#locks = locks;
    this.#unwatch = watchVisibility(() => this.#hide(), () => this.#show());
    this.#channel.postMessage({ type: "hello" } satisfies ChannelMessage);
    this.#requestLeadership();
  }

  #requestLeadership(): void {
    this.#locks.request(
      `leased-outbox:${this.name}`,
      { signal: this.#abort.signal },
      () => this.#lead(),
    ).catch(() => {/* aborted by close() before this tab led */});
  }

  /** @internal Use {@linkcode openSharedOutbox}. */
  static create<P>(name: string, setup: WorkerSetup): SharedOutbox<P> {
    return new SharedOutbox<P>(name, setup);
  }

  /** Whether this outbox was closed (or failed to open): every later call rejects. */
  get closed(): boolean {
    return this.#failure !== undefined;
  }

  /** Whether this tab hosts the database now. */
  get isLeader(): boolean {
    return this.#local !== undefined;
  }

  /** The id of the tab hosting the database, once known. */
  get leader(): string | undefined {
    return this.#leader;
  }

  /** The SQLite VFS the database was opened through, while leading. */
  get vfs(): string | undefined {
    return this.#local?.vfs;
  }

  /**
   * Adds a pending event; see `Outbox.enqueue`. The event's identity is
   * minted in this tab (unless one is given), so a call that has to be
   * re-sent to a new leader is stored once even when the old leader stored
   * it before it went away.
   *
   * @param payload A JSON-serializable value, or a `Uint8Array`.
   * @param options Delay, attempts, dedup and ordering keys, identity, queue.
   * @returns The event id, its identity, and whether the caller's `dedupKey`
   * or `identity` matched an earlier event.
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  override async enqueue(
    payload: P,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    if (
      options === null || typeof options !== "object" ||
      options.identity !== undefined
    ) {
      return super.enqueue(payload, options);
    }
    const identity = uuidv7();
    const result = await super.enqueue(payload, { ...options, identity });
    // Our own identity found means a re-sent call the old leader stored.
    return result.identity === identity
      ? { ...result, deduplicated: false }
      : result;
  }

  /** Runs a call here when leading, else forwards it to the leader. */
  protected invoke(method: string, args: readonly unknown[]): Promise<unknown> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#local) return this.#run(this.#local, method, args, true);
    const id = `${this.tab}:${this.#next++}`;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { method, args, resolve, reject });
      this.#forward(id, method, args);
    });
  }

  /**
   * Leaves the group: a leading tab closes its database and lets another tab
   * take over; pending calls reject.
   */
  async close(): Promise<void> {
    if (this.#failure) return;
    this.#failure = new Error("The outbox is closed");
    this.#unwatch();
    this.#abort.abort();
    const local = this.#local;
    this.#local = undefined;
    try {
      await local?.close();
    } finally {
      this.#stopLeading?.();
      this.#rejectPending(this.#failure);
      this.#channel.close();
    }
  }

  // Runs a call in this leader's worker; a stored event is announced with an
  // "enqueue" event, so a delivery loop can wait for work on events rather
  // than on timers (which browsers throttle in background tabs).
  async #run(
    local: WorkerConnection,
    method: string,
    args: readonly unknown[],
    own: boolean,
  ): Promise<unknown> {
    const result = await local.call(method, args, own);
    if (method === "enqueue") this.dispatchEvent(new Event("enqueue"));
    return result;
  }

  #forward(id: string, method: string, args: readonly unknown[]): void {
    this.#channel.postMessage(
      {
        type: "call",
        id,
        from: this.tab,
        method,
        args,
      } satisfies ChannelMessage,
    );
  }

  async #lead(): Promise<void> {
    if (this.#failure) return;
    let local: WorkerConnection | undefined;
    try {
      local = await WorkerConnection.open(
        this.#setup,
        () => this.#stepDown(local),
      );
    } catch (error) {
      this.#failure = error instanceof Error ? error : new Error(String(error));
      this.#rejectPending(this.#failure);
      return;
    }
    if (this.#failure) {
      await local.close();
      return;
    }
    const stopped = new Promise<void>((resolve) => {
      this.#stopLeading = resolve;
    });
    this.#local = local;
    this.#leader = this.tab;
    this.#channel.postMessage(
      { type: "leader", tab: this.tab } satisfies ChannelMessage,
    );
    for (const [id, call] of this.#pending) {
      this.#pending.delete(id);
      this.#run(local, call.method, call.args, true).then(
        call.resolve,
        call.reject,
      );
    }
    this.dispatchEvent(new Event("leaderchange"));
    await stopped;
  }

  // The database worker died: give the lock back so that the next tab in
  // line (or this one, queued again) opens the database in a new worker.
  #stepDown(local: WorkerConnection | undefined): void {
    if (local === undefined || this.#local !== local) return;
    this.#local = undefined;
    this.#stopLeading?.();
    this.dispatchEvent(new Event("leaderchange"));
    if (!this.#failure) this.#requestLeadership();
  }

  #receive(message: ChannelMessage): void {
    switch (message.type) {
      case "hello":
        if (this.#local) {
          this.#channel.postMessage(
            { type: "leader", tab: this.tab } satisfies ChannelMessage,
          );
        }
        return;
      case "leader": {
        // Re-send on every announcement, even from the tab that led before
        // (it may lead again after its worker died): a leader runs a call
        // it has already seen only once.
        const changed = message.tab !== this.#leader;
        this.#leader = message.tab;
        for (const [id, call] of this.#pending) {
          this.#forward(id, call.method, call.args);
        }
        if (changed) this.dispatchEvent(new Event("leaderchange"));
        return;
      }
      case "call":
        if (this.#local) this.#answer(this.#local, message);
        return;
      case "hidden":
        this.#hiddenTabs.add(message.tab);
        return;
      case "shown":
        this.#hiddenTabs.delete(message.tab);
        return;
      case "reply": {
        const call = this.#pending.get(message.id);
        if (message.to !== this.tab || call === undefined) return;
        this.#pending.delete(message.id);
        if (message.ok) call.resolve(message.value);
        else call.reject(fromWireError(message.error));
      }
    }
  }

  #answer(
    local: WorkerConnection,
    message: Extract<ChannelMessage, { type: "call" }>,
  ): void {
    // A call re-sent to this same leader is answered by the first run.
    if (this.#seen.has(message.id)) return;
    this.#seen.add(message.id);
    if (this.#seen.size > SEEN_LIMIT) {
      this.#seen.delete(this.#seen.values().next().value!);
    }
    // Only outbox methods cross tabs: opening and closing the leader's
    // database is the leader's own business.
    const call = WORKER_ONLY.has(message.method)
      ? Promise.reject(
        new TypeError(
          `Cannot call '${message.method}' as it is not an outbox method`,
        ),
      )
      : this.#run(local, message.method, message.args, false);
    call.then((value) => {
      // Its tab went away while this claim ran: nobody will finish it.
      if (this.#hiddenTabs.has(message.from!)) {
        for (const lease of claimedLeases(message.method, value)) {
          this.#run(local, "release", [lease, { error: TAB_CLOSED }], false)
            .catch(() => {});
        }
      }
      return value;
    }).then(
      (value): ReplyMessage => ({
        type: "reply",
        id: message.id,
        ok: true,
        value,
      }),
      (error): ReplyMessage => ({
        type: "reply",
        id: message.id,
        ok: false,
        error: toWireError(error),
      }),
    ).then((reply) => {
      try {
        this.#channel.postMessage({ ...reply, to: message.from });
      } catch {
        // The channel closed with this tab's outbox: the follower re-sends
        // the call to the next leader.
      }
    });
  }

  // The page is going away: hand its leases back so that another tab can
  // claim them now rather than after they lapse. Fire and forget, since
  // nothing can be awaited during pagehide; a lost release only delays.
  #hide(): void {
    if (this.#local) {
      // The worker releases this tab's leases, and claims still in flight.
      this.#local.call("hide", []).catch(() => {});
      return;
    }
    this.#channel.postMessage(
      { type: "hidden", tab: this.tab } satisfies ChannelMessage,
    );
    for (const lease of this.heldLeases()) {
      this.#forward(`${this.tab}:${this.#next++}`, "release", [
        lease,
        { error: TAB_CLOSED },
      ]);
    }
  }

  #show(): void {
    if (this.#local) this.#local.call("show", []).catch(() => {});
    else {
      this.#channel.postMessage(
        { type: "shown", tab: this.tab } satisfies ChannelMessage,
      );
    }
  }

  #rejectPending(error: Error): void {
    for (const call of this.#pending.values()) call.reject(error);
    this.#pending.clear();
  }
}

/**
 * Joins the outbox every tab of this origin shares under `name`. The first
 * tab to get the `navigator.locks` lock hosts the database in its worker;
 * calls from other tabs are forwarded to it. Calls made while no tab leads
 * (at start, or while leadership passes on) wait for the next leader.
 *
 * @param name The outbox name: 1-64 letters, digits, `_` or `-`.
 * @param options See {@linkcode BrowserOutboxOptions}.
 * @returns The shared outbox; it resolves at once, calls wait for a leader.
 * @throws {TypeError | RangeError} When an argument is invalid.
 *
 * @example Usage
 * ```ts ignore
 * import { openSharedOutbox } from "@leased/outbox/browser";
 *
 * const outbox = await openSharedOutbox("mail");
 * outbox.addEventListener("leaderchange", () => {
 *   if (outbox.isLeader) console.log("this tab delivers now");
 * });
 * ```
 */
export function openSharedOutbox<P = unknown>(
  name: string,
  options: BrowserOutboxOptions = {},
): Promise<SharedOutbox<P>> {
  try {
    return Promise.resolve(
      SharedOutbox.create<P>(name, setup("open outbox", name, options)),
    );
  } catch (error) {
    return Promise.reject(error);
  }
}
