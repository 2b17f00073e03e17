/**
 * The tab-side outbox API shared by {@linkcode WorkerOutbox} and
 * {@linkcode SharedOutbox}: every call crosses a worker (and possibly a tab)
 * boundary as structured-clonable data, and the tab remembers the leases it
 * holds so that it can hand them back when it goes away.
 *
 * @module
 */
import type {
  AcknowledgedAndClaimed,
  BatchClaimOptions,
  ClaimOptions,
  DeadLetter,
  EnqueueOptions,
  EnqueueResult,
  Explanation,
  Lease,
  ReleaseOptions,
} from "../lease.ts";
import { type BrowserStats, leaseKey } from "./protocol.ts";
import { checkPayload } from "../core/payload.ts";
import { checkFunction } from "../validate.ts";
import type { QueueFlow, QueueLimits } from "../core/flow.ts";
import type { Schedule, ScheduleOptions } from "../core/schedules.ts";
import type {
  EventInfo,
  ListOptions,
  PurgeOptions,
  QueueCounts,
  RedriveOptions,
} from "../admin.ts";

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
    checkFunction("listen for enqueues", "listener", listener);
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
   * @param payload JSON data JSON keeps as it is, or a `Uint8Array` (see
   * `Outbox.enqueue`).
   * @param options Delay, attempts, dedup and ordering keys, queue.
   * @returns The event id and whether `dedupKey` matched an earlier event.
   * @throws {TypeError | RangeError} When an argument is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async enqueue(
    payload: P,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    // Checked here too: structured cloning keeps a Map or a Date for the
    // leader to refuse, but throws a DataCloneError on a function.
    checkPayload("enqueue", "payload", payload);
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
    checkPayload("schedule", "payload", payload);
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
   * Counts events per state; see `Outbox.stats`. Also reports the origin's
   * storage, `navigator.storage.estimate()` read in the database's worker,
   * so an app can see a full quota coming.
   *
   * @param options `queue`.
   * @returns Pending, leased, done and dead counts, the oldest pending age,
   * and `storage`: `{ usage, quota }` in bytes, or `null` where the browser
   * does not offer an estimate.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   */
  async stats(
    options: { readonly queue?: string } = {},
  ): Promise<BrowserStats> {
    return await this.invoke("stats", [options]) as BrowserStats;
  }

  /**
   * Gives the space that deleted events left back to the origin's storage
   * quota: SQLite's free pages (`PRAGMA incremental_vacuum`; see
   * `Outbox.maintain`), then the write-ahead log, truncated by a
   * checkpoint. Run it after {@linkcode RemoteOutbox.purge}, and after a
   * {@linkcode StorageFullError}, to make room. A database made before this
   * release has `auto_vacuum = NONE` (the result says so): `vacuum: true`
   * rewrites it once, which needs free quota of about its size.
   *
   * @param options `vacuum`: run a full `VACUUM`. @default {false}
   * @returns The bytes of free pages given back, the free pages left, and
   * the database's `auto_vacuum` mode.
   * @throws {TypeError} When an option is invalid.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   * @throws {StorageFullError} When even the vacuum could not be written.
   */
  async maintain(options: { readonly vacuum?: boolean } = {}): Promise<{
    reclaimedBytes: number;
    freePages: number;
    autoVacuum: "none" | "full" | "incremental";
  }> {
    return await this.invoke("maintain", [options]) as {
      reclaimedBytes: number;
      freePages: number;
      autoVacuum: "none" | "full" | "incremental";
    };
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

  /**
   * Forgets the leases this tab holds, for a tab that hands them back: a
   * later acknowledgement of one answers `false`.
   *
   * @returns The leases it held.
   */
  protected forgetLeases(): Lease<unknown>[] {
    const leases = [...this.#held.values()];
    this.#held.clear();
    return leases;
  }
}
