/**
 * The public shapes of the processing loop: what it needs of an outbox,
 * what a handler receives, its options and its counters.
 *
 * @module
 */
import type {
  AcknowledgedAndClaimed,
  BatchClaimOptions,
  Clock,
  Explanation,
  Lease,
  ReleaseOptions,
  Stats,
  Transaction,
} from "../lease.ts";

/**
 * What {@linkcode processEvents} needs of an outbox: an
 * {@linkcode Outbox}, or the browser's shared outbox (which has no
 * `transaction`, so a handler's {@linkcode HandlerContext.transaction}
 * throws there).
 *
 * @typeParam P The payload type.
 */
export interface ProcessableOutbox<P> {
  /** Claims a batch, as {@linkcode Outbox.claim} does. */
  claim(options: BatchClaimOptions): Promise<Lease<P>[]>;
  /** Acknowledges leases in one transaction, as {@linkcode Outbox.acknowledge} does. */
  acknowledge(leases: readonly Lease<unknown>[]): Promise<boolean[]>;
  /**
   * Acknowledges leases and claims a batch in one transaction, as
   * {@linkcode Outbox.acknowledgeAndClaim} does; without it the loop
   * acknowledges and claims in separate transactions.
   */
  acknowledgeAndClaim?(
    leases: readonly Lease<unknown>[],
    options: BatchClaimOptions,
  ): Promise<AcknowledgedAndClaimed<P>>;
  /** Extends a live lease, as {@linkcode Outbox.renew} does. */
  renew(lease: Lease<unknown>, leaseMs?: number): Promise<number | false>;
  /** Gives an event back, as {@linkcode Outbox.release} does. */
  release(lease: Lease<unknown>, options?: ReleaseOptions): Promise<boolean>;
  /** Counts a queue's events per state, as {@linkcode Outbox.stats} does. */
  stats(options?: { readonly queue?: string }): Promise<Stats>;
  /** Tells one event's state, as {@linkcode Outbox.explain} does. */
  explain(eventId: number): Promise<Explanation | null>;
  /** Time until the next event comes due, as {@linkcode Outbox.nextDueInMs} says. */
  nextDueInMs(options?: { readonly queue?: string }): Promise<number | null>;
  /** Enqueues the due ticks of the schedules, as {@linkcode Outbox.runSchedules} does. */
  runSchedules?(): Promise<number>;
  /** Calls `listener` after each local enqueue; returns its removal. */
  onEnqueue(listener: () => void): () => void;
  /**
   * Says the loop waits idle, as {@linkcode Outbox.watchWhileIdle} does;
   * returns the end of that wait. Optional: without it only `onEnqueue`'s
   * calls and polls end the wait.
   */
  watchWhileIdle?(): () => void;
  /** Whether the outbox was closed. */
  readonly closed: boolean;
  /** The queue of calls that name none, when the outbox says. */
  readonly queue?: string;
  /** The default lease length, in milliseconds. */
  readonly leaseMs: number;
  /** Runs `fn` in one transaction, as {@linkcode Outbox.transaction} does. */
  transaction?<T>(fn: (tx: Transaction) => Promise<T>): Promise<T>;
}

/** Timer functions, injectable so tests control time; web-standard by default. */
export interface Timers {
  /** Calls `callback` once after `delayMs` milliseconds; returns a handle. */
  setTimeout(callback: () => void, delayMs: number): unknown;
  /** Cancels a pending callback by its handle. */
  clearTimeout(handle: unknown): void;
  /**
   * Calls `callback` once the other callbacks of this turn of the event loop
   * have run (the due timers and I/O completions delivered with the current
   * one), as `setImmediate` does: no delay. A handler that finishes while
   * others still run and no write is under way starts the next write there,
   * so handlers finishing in the same turn share its commit. Without it the
   * write starts once the promise jobs running now are done.
   *
   * @default {the runtime's setImmediate (Deno, Node, Bun) in the default
   * timers; none in timers passed without it}
   */
  setImmediate?(callback: () => void): void;
}

/** What a {@linkcode Handler} receives besides the lease. */
export interface HandlerContext {
  /**
   * Fires when the lease is lost (a renewal was refused), when renewal is
   * overdue by the monotonic or the lease clock (the lease may lapse before
   * anyone here could notice), or when the processor stops before the
   * handler finished. Pass it to `fetch` and check it before side effects.
   */
  readonly signal: AbortSignal;
  /**
   * Judges the lease against both clocks right now, aborts the signal when
   * it is overdue, and throws the signal's reason when it is aborted. Call
   * it just before an external side effect: after a stall, timers run late,
   * but this check does not.
   *
   * @throws {LeaseLostError | DOMException} The signal's reason.
   */
  throwIfLost(): void;
  /**
   * Runs `fn` in one {@linkcode Outbox.transaction} that also acknowledges
   * the lease, so the handler's own writes and the acknowledgement commit
   * together or not at all (exactly-once for effects in the same database).
   * The processor then does not acknowledge the lease again: it counts it
   * once as acknowledged.
   *
   * @typeParam T What `fn` returns.
   * @param fn The handler's writes, through the transaction handle only.
   * @returns What `fn` returned, after the commit.
   * @throws {LeaseLostError} When the lease is stale: nothing was written,
   * the handler's signal is aborted, and the processor neither
   * acknowledges nor releases the event (its current holder owns it).
   * @throws {Error} When the handler's transaction committed already (it
   * acknowledged the lease) or is still running: one per handler.
   * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
   *
   * @example Record a delivery and acknowledge it in one commit
   * ```ts
   * import { Outbox, processEvents } from "@leased/outbox";
   * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
   * import assert from "node:assert/strict";
   *
   * const driver = await openSqliteWasm(":memory:");
   * await using outbox = await Outbox.open<{ to: string }>(driver);
   * await outbox.transaction((tx) =>
   *   tx.run("CREATE TABLE mails (event INTEGER PRIMARY KEY, address TEXT)")
   * );
   * const delivered = Promise.withResolvers<void>();
   * const processor = processEvents(outbox, async (lease, context) => {
   *   await context.transaction((tx) =>
   *     tx.run("INSERT INTO mails VALUES (?, ?)", [lease.eventId, lease.payload.to])
   *   );
   *   delivered.resolve();
   * });
   * await outbox.enqueue({ to: "ada@example.com" });
   * await delivered.promise;
   * await processor.stop();
   * assert.equal(processor.counters.acknowledged, 1);
   * assert.equal(processor.counters.staleAcknowledgements, 0);
   * assert.equal((await outbox.stats()).done, 1);
   * ```
   */
  transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T>;
}

/**
 * Does the work of one event. Its outcome decides the event's fate:
 *
 * - resolving acknowledges it (unless {@linkcode HandlerContext.transaction}
 *   or the handler's own `acknowledge` did already);
 * - throwing {@linkcode PermanentError} makes it a dead letter at once, with
 *   the error's text as its reason ("do not retry");
 * - throwing {@linkcode RetryAfterError} releases it for exactly its
 *   `delayMs` ("retry after");
 * - throwing anything else releases it after the loop's backoff;
 *
 * and an event whose attempts are used up becomes a dead letter. Every throw
 * reaches the `onHandlerError` hook. Recipients of external effects dedupe
 * on `lease.identity`; the fence only orders the attempts at one event (send
 * both with `deliveryHeaders(lease)`).
 */
export type Handler<P> = (
  lease: Lease<P>,
  context: HandlerContext,
) => unknown;

/** Options of {@linkcode processEvents}; every duration is in milliseconds. */
export interface ProcessOptions {
  /** Stops the processor when aborted, like {@linkcode Processor.stop}. */
  readonly signal?: AbortSignal;
  /** Queue to claim from. @default {the outbox's queue} */
  readonly queue?: string;
  /** Most handlers running at once; claims are batched up to the free slots. @default {1} */
  readonly concurrency?: number;
  /**
   * Whether the loop claims up to `concurrency` leases ahead of its free
   * handler slots, so a handler that finishes is followed at once by the
   * next, while its acknowledgement (with the claim of the one after) commits
   * beside it: time per event is the longer of the handler and the write,
   * not their sum. A c=1 loop then holds at most 2 leases. A lease claimed
   * ahead is never started past its first renewal time (`renewIntervalMs`
   * after its claim): it is given back then, without counting an attempt
   * (`release` with `attempted: false`), as it is at stop, and the loop
   * claims ahead again when a handler finishes. Turn it off when several
   * processes share a queue whose handlers run long, so that a busy process
   * does not hold events others could start.
   *
   * @default {true}
   */
  readonly prefetch?: boolean;
  /** Lease length of each claim and renewal. @default {the outbox's leaseMs} */
  readonly leaseMs?: number;
  /** Time between renewals of a running handler's lease. @default {leaseMs / 3} */
  readonly renewIntervalMs?: number;
  /**
   * How long before the lease would lapse, unrenewed, the handler's signal
   * fires. `renewIntervalMs + marginMs` must be below `leaseMs`.
   *
   * @default {leaseMs / 5}
   */
  readonly marginMs?: number;
  /** First wait after an empty claim; waits double up to `pollMaxMs`. @default {100} */
  readonly pollMinMs?: number;
  /** Longest wait between claims while the queue stays empty. @default {5000} */
  readonly pollMaxMs?: number;
  /**
   * Backoff before the second attempt after a failed one (formerly
   * `retryMinMs`).
   *
   * @default {1000}
   */
  readonly backoffMinMs?: number;
  /** Longest backoff (formerly `retryMaxMs`). @default {60000} */
  readonly backoffMaxMs?: number;
  /** Factor by which the backoff grows per attempt (formerly `retryMultiplier`). @default {2} */
  readonly backoffMultiplier?: number;
  /**
   * Fraction of the backoff taken away at random, from `0` (none) to `1`
   * ("full jitter", which keeps failing workers from retrying in step;
   * formerly `retryJitter`).
   *
   * @default {1}
   */
  readonly backoffJitter?: number;
  /** How long {@linkcode Processor.stop} waits for running handlers. @default {10000} */
  readonly stopTimeoutMs?: number;
  /**
   * How long a handler may run. Past it, its signal aborts with a
   * `TimeoutError`, its lease is no longer renewed and it is released after
   * the backoff (the attempt counts), so another worker can take the event;
   * its slot stays taken until the handler settles, since concurrency bounds
   * what really runs. A handler that ignores its signal cannot acknowledge:
   * its token is stale. @default {no limit}
   */
  readonly handlerTimeoutMs?: number;
  /**
   * Receives every error a handler throws (or a handler timeout), with its
   * lease, before the event is released or dead-lettered: the place to log
   * or count failures. What it throws goes to `onError`; it never stops
   * the loop, and the event is released or dead-lettered all the same.
   *
   * @default {nothing}
   */
  readonly onHandlerError?: (error: unknown, lease: Lease<unknown>) => void;
  /**
   * A wall clock in milliseconds, read only for time elapsed since a claim
   * or renewal (so its epoch need not match the outbox's clock). It keeps
   * counting while the machine sleeps, which the monotonic clock does not
   * on Linux or macOS.
   *
   * @default {Date.now}
   */
  readonly now?: Clock;
  /**
   * The local monotonic clock in milliseconds: immune to clock steps, so it
   * catches a stalled event loop even when the wall clock is set back.
   *
   * @default {performance.now}
   */
  readonly monotonicNow?: () => number;
  /** Timer functions. @default {globalThis's setTimeout and clearTimeout} */
  readonly timers?: Timers;
  /**
   * Random numbers in [0, 1) for the jitter. One that throws or returns
   * anything else is reported to `onError` (a `RangeError` naming it) and
   * the backoff is taken whole.
   *
   * @default {Math.random}
   */
  readonly random?: () => number;
  /**
   * Receives errors the loop survives (a claim, renewal, acknowledgement or
   * release that threw, e.g. {@linkcode BusyError}); the loop backs off and
   * goes on. A closed outbox is not reported: the processor stops instead.
   * What it throws goes to `console.error`, never to `reportError`, which
   * would end the process as an uncaught error: a failing hook must not
   * stop the loop.
   *
   * @default {console.error}
   */
  readonly onError?: (error: unknown) => void;
}

/** Counts since the processor started, from {@linkcode Processor.counters}. */
export interface ProcessorCounters {
  /**
   * Leases claimed whose handler started (a lease claimed ahead and given
   * back unstarted is not counted).
   */
  readonly claimed: number;
  /** Events acknowledged. */
  readonly acknowledged: number;
  /** Acknowledgements the database rejected as stale (someone else holds the event). */
  readonly staleAcknowledgements: number;
  /** Handlers whose signal fired because the lease was lost or overdue, or the outbox closed. */
  readonly leasesLost: number;
  /** Events given back for a retry (after a failure or at stop). */
  readonly released: number;
  /** Events that became dead letters on release: attempts used up, or {@linkcode PermanentError}. */
  readonly dead: number;
  /**
   * Handlers that threw or timed out before their event was acknowledged (one
   * that throws after its {@linkcode HandlerContext.transaction} committed
   * is counted in `acknowledged` only).
   */
  readonly failed: number;
}
