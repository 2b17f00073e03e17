/**
 * The processing loop: claims events, runs a handler under a self-fencing
 * lease that renews itself, acknowledges on success and releases with
 * backoff on failure, until stopped.
 *
 * Self-fencing (the idea of Kleppmann's "fencing tokens" applied on the
 * worker's side): besides the database's verdict on a renewal, the loop
 * judges the lease by the local monotonic clock (`performance.now()`), so a
 * stalled event loop or a suspended process aborts its handler's signal as
 * soon as it runs again, before it can act on a claim someone else may hold.
 *
 * @module
 */
import {
  type AcknowledgedAndClaimed,
  type BatchClaimOptions,
  type Clock,
  type Explanation,
  type Lease,
  MAX_BATCH,
  MAX_DURATION_MS,
  type ReleaseOptions,
  type Stats,
  type Transaction,
} from "./lease.ts";
import {
  checkInteger,
  checkName,
  checkOptions,
  MAX_ERROR_LENGTH,
} from "./validate.ts";
import {
  DatabaseMovedError,
  LeaseLostError,
  PermanentError,
  RetryAfterError,
} from "./errors.ts";
import { type CounterName, ProcessorTelemetry } from "./telemetry.ts";

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
  /** Random numbers in [0, 1) for the jitter. @default {Math.random} */
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
  /** Leases claimed. */
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
  /** Handlers that threw or timed out. */
  readonly failed: number;
}

interface Slot<P> {
  lease: Lease<P>;
  /**
   * "abandoned": timed out and released while its handler still runs; it
   * keeps its slot until the handler settles, and stop() does not wait for it.
   */
  state: "running" | "finishing" | "released" | "abandoned";
  /** Set inside the handler's transaction once its acknowledgement is written. */
  acknowledged: boolean;
  validUntilMonotonic: number;
  validUntilWall: number;
  renewTimer: LongTimer | undefined;
  watchdogTimer: LongTimer | undefined;
  timeoutTimer: LongTimer | undefined;
  readonly controller: AbortController;
  done: Promise<void>;
  /** The release of an abandoned slot. */
  released: Promise<void>;
}

const OP = "process events";
const PROCESS_OPTIONS = [
  "signal",
  "queue",
  "concurrency",
  "leaseMs",
  "renewIntervalMs",
  "marginMs",
  "pollMinMs",
  "pollMaxMs",
  "backoffMinMs",
  "backoffMaxMs",
  "backoffMultiplier",
  "backoffJitter",
  "stopTimeoutMs",
  "handlerTimeoutMs",
  "onHandlerError",
  "now",
  "monotonicNow",
  "timers",
  "random",
  "onError",
];
/** The longest delay `setTimeout` honours: longer ones fire at once. */
const MAX_TIMER_MS = 2_147_483_647;

/** What one claim of the loop returned, with when it was sent by both clocks. */
interface Claimed<P> {
  readonly leases: Lease<P>[];
  readonly claimedAt: number;
  readonly claimedAtWall: number;
}

/** A timer that may outlast `setTimeout`'s limit, re-armed in steps. */
interface LongTimer {
  handle: unknown;
}

/**
 * Calls `callback` after `delayMs`, however long: `setTimeout` turns delays
 * past 2^31 − 1 ms (about 24.8 days) into 1 ms, so longer ones are chained.
 */
function setLongTimeout(
  timers: Timers,
  callback: () => void,
  delayMs: number,
): LongTimer {
  const timer: LongTimer = { handle: undefined };
  const arm = (remainingMs: number) => {
    const stepMs = Math.min(remainingMs, MAX_TIMER_MS);
    timer.handle = timers.setTimeout(
      () => stepMs < remainingMs ? arm(remainingMs - stepMs) : callback(),
      stepMs,
    );
  };
  arm(Math.max(0, delayMs));
  return timer;
}

function clearLongTimeout(timers: Timers, timer: LongTimer | undefined): void {
  if (timer !== undefined) timers.clearTimeout(timer.handle);
}

/**
 * Starts processing events of `outbox` with `handler`, at once.
 *
 * Claims up to `concurrency` events (in one batch), runs the handler for each
 * with a lease that renews every `renewIntervalMs`, acknowledges when it
 * resolves and releases with exponential backoff and jitter when it throws;
 * an event whose attempts are used up becomes a dead letter with the last
 * error kept. When the queue is empty it polls with a doubling wait, and an
 * enqueue through the same outbox wakes it at once.
 *
 * Its claims and acknowledgements are batched (group commit): one runs at a
 * time, and handlers that finish while it commits are acknowledged together
 * in the next transaction, and claims take every slot freed by then. So
 * under load each commit covers many events, while an idle loop still
 * claims a lone new event, and acknowledges it, at once. With
 * {@linkcode Outbox.acknowledgeAndClaim} (every outbox of this module has
 * it), each acknowledgement batch also claims for the slots it frees and
 * every other free one: one commit instead of two, and on PostgreSQL one
 * round trip.
 *
 * @typeParam P The payload type.
 * @param outbox The outbox to claim from; keep one per connection.
 * @param handler Does the work of one event.
 * @param options See {@linkcode ProcessOptions}.
 * @returns The running {@linkcode Processor}; stop it with `stop()`, the
 * `signal` option, or `await using`.
 * @throws {TypeError | RangeError} When an option is invalid, naming it.
 *
 * @example Deliver events until stopped
 * ```ts
 * import { Outbox, processEvents } from "@leased/outbox";
 * import { openSqliteWasm } from "@leased/outbox/sqlite-wasm";
 * import assert from "node:assert/strict";
 *
 * await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
 * const seen: string[] = [];
 * const { identity } = await outbox.enqueue({ to: "ada@example.com" });
 * const delivered = Promise.withResolvers<void>();
 * {
 *   await using _processor = processEvents(outbox, (lease, { signal }) => {
 *     signal.throwIfAborted();
 *     seen.push(lease.identity);
 *     delivered.resolve();
 *   }, { leaseMs: 10_000 });
 *   await delivered.promise;
 * }
 * assert.deepEqual(seen, [identity]);
 * assert.equal((await outbox.stats()).done, 1);
 * ```
 */
export function processEvents<P>(
  outbox: ProcessableOutbox<P>,
  handler: Handler<P>,
  options: ProcessOptions = {},
): Processor<P> {
  return new Processor(outbox, handler, options);
}

/**
 * A running processing loop, from {@linkcode processEvents}.
 *
 * Stopping it stops claiming, waits up to `stopTimeoutMs` for running
 * handlers, then aborts the signals of the rest and releases their leases.
 * Their claims counted as attempts (as an SQS receive does), so an event
 * released at its last attempt becomes a dead letter.
 */
export class Processor<P = unknown> implements AsyncDisposable {
  readonly #outbox: ProcessableOutbox<P>;
  readonly #handler: Handler<P>;
  readonly #queue: string | undefined;
  readonly #concurrency: number;
  readonly #leaseMs: number;
  readonly #renewIntervalMs: number;
  readonly #marginMs: number;
  readonly #pollMinMs: number;
  /** When the loop last ran the schedules, on the monotonic clock. */
  #schedulesRunAt = -Infinity;
  readonly #pollMaxMs: number;
  readonly #backoffMinMs: number;
  readonly #backoffMaxMs: number;
  readonly #backoffMultiplier: number;
  readonly #backoffJitter: number;
  readonly #stopTimeoutMs: number;
  readonly #handlerTimeoutMs: number | undefined;
  readonly #now: Clock;
  readonly #monotonicNow: () => number;
  readonly #timers: Timers;
  readonly #random: () => number;
  readonly #onError: (error: unknown) => void;
  readonly #onHandlerError:
    | ((error: unknown, lease: Lease<unknown>) => void)
    | undefined;
  readonly #signal: AbortSignal | undefined;
  readonly #slots = new Set<Slot<P>>();
  readonly #counters = {
    claimed: 0,
    acknowledged: 0,
    staleAcknowledgements: 0,
    leasesLost: 0,
    released: 0,
    dead: 0,
    failed: 0,
  };
  readonly #telemetry: ProcessorTelemetry;
  readonly #loop: Promise<void>;
  readonly #unsubscribe: () => void;
  #stopping = false;
  #closed = false;
  #stopped: Promise<void> | undefined;
  #woken = false;
  /** One of the loop's writes (a claim or a batch of acknowledgements) is under way. */
  #writing = false;
  /** Lets the loop's claim, waiting for its turn to write, go ahead. */
  #claimTurn: (() => void) | undefined;
  /** The write acknowledging and claiming in one call, while under way. */
  #folding: Promise<void> | undefined;
  /**
   * Leases the loop's claim returned that it has not started yet: the
   * write after the claim starts before they do, and must count their
   * slots as taken.
   */
  #unstarted = 0;
  /**
   * The last acknowledgement with a claim found fewer events than free
   * slots, so a claim right after it would most likely find none either.
   */
  #drained = false;
  readonly #acknowledgements: { slot: Slot<P>; resolve: () => void }[] = [];
  #waiter: (() => void) | undefined;

  /**
   * Starts the loop at once; {@linkcode processEvents} is the usual way in.
   * Every option is checked here, so a bad one fails at start rather than
   * in every claim or release later.
   *
   * @param outbox The outbox to claim from.
   * @param handler Does the work of one event.
   * @param options See {@linkcode ProcessOptions}.
   * @throws {TypeError | RangeError} When an option is invalid, naming it.
   */
  constructor(
    outbox: ProcessableOutbox<P>,
    handler: Handler<P>,
    options: ProcessOptions = {},
  ) {
    if (outbox === null || typeof outbox !== "object") {
      throw new TypeError(
        `Cannot ${OP} as 'outbox' must be an outbox: current value is ${
          outbox === null ? "null" : typeof outbox
        }`,
      );
    }
    if (typeof handler !== "function") {
      throw new TypeError(
        `Cannot ${OP} as 'handler' must be a function: current value is ${typeof handler}`,
      );
    }
    checkOptions(OP, options, PROCESS_OPTIONS);
    this.#outbox = outbox;
    this.#handler = handler;
    this.#queue = options.queue === undefined
      ? undefined
      : checkName(OP, "queue", options.queue);
    this.#concurrency =
      checkInteger(OP, "concurrency", options.concurrency, 1, MAX_BATCH) ?? 1;
    this.#leaseMs = checkInteger(
      OP,
      "leaseMs",
      options.leaseMs ?? outbox.leaseMs,
      3,
      MAX_DURATION_MS,
    )!;
    this.#renewIntervalMs = checkInteger(
      OP,
      "renewIntervalMs",
      options.renewIntervalMs,
      1,
      MAX_DURATION_MS,
    ) ?? Math.floor(this.#leaseMs / 3);
    this.#marginMs =
      checkInteger(OP, "marginMs", options.marginMs, 0, MAX_DURATION_MS) ??
        Math.floor(this.#leaseMs / 5);
    if (this.#renewIntervalMs + this.#marginMs >= this.#leaseMs) {
      throw new RangeError(
        `Cannot ${OP} as 'renewIntervalMs' + 'marginMs' must be below 'leaseMs' (${this.#leaseMs}): current value is ${
          this.#renewIntervalMs + this.#marginMs
        }`,
      );
    }
    this.#pollMinMs =
      checkInteger(OP, "pollMinMs", options.pollMinMs, 1, MAX_DURATION_MS) ??
        100;
    this.#pollMaxMs = checkInteger(
      OP,
      "pollMaxMs",
      options.pollMaxMs,
      this.#pollMinMs,
      MAX_DURATION_MS,
    ) ?? Math.max(5_000, this.#pollMinMs);
    this.#backoffMinMs = checkInteger(
      OP,
      "backoffMinMs",
      options.backoffMinMs,
      0,
      MAX_DURATION_MS,
    ) ?? 1_000;
    this.#backoffMaxMs = checkInteger(
      OP,
      "backoffMaxMs",
      options.backoffMaxMs,
      this.#backoffMinMs,
      MAX_DURATION_MS,
    ) ?? Math.max(60_000, this.#backoffMinMs);
    this.#backoffMultiplier = real(
      "backoffMultiplier",
      options.backoffMultiplier,
      1,
      Infinity,
      2,
    );
    this.#backoffJitter = real("backoffJitter", options.backoffJitter, 0, 1, 1);
    this.#stopTimeoutMs = checkInteger(
      OP,
      "stopTimeoutMs",
      options.stopTimeoutMs,
      0,
      MAX_DURATION_MS,
    ) ?? 10_000;
    this.#handlerTimeoutMs = checkInteger(
      OP,
      "handlerTimeoutMs",
      options.handlerTimeoutMs,
      1,
      MAX_DURATION_MS,
    );
    this.#now = fn("now", options.now) ?? Date.now;
    this.#monotonicNow = fn("monotonicNow", options.monotonicNow) ??
      (() => performance.now());
    this.#random = fn("random", options.random) ?? Math.random;
    this.#onError = fn("onError", options.onError) ?? console.error;
    this.#onHandlerError = fn("onHandlerError", options.onHandlerError);
    this.#timers = options.timers ?? {
      setTimeout: (callback, delayMs) => setTimeout(callback, delayMs),
      clearTimeout: (handle) => clearTimeout(handle as number),
    };
    this.#signal = options.signal;
    this.#telemetry = new ProcessorTelemetry(outbox, options.queue);
    this.#unsubscribe = outbox.onEnqueue(() => this.#wake());
    this.#signal?.addEventListener("abort", this.#onAbort);
    this.#loop = this.#run();
    if (this.#signal?.aborted) void this.stop();
  }

  /** A snapshot of the counters. */
  get counters(): ProcessorCounters {
    return { ...this.#counters };
  }

  /**
   * Handlers running (or finishing their acknowledgement) now, timed-out
   * ones that have not settled included: each holds its slot.
   */
  get inFlight(): number {
    return this.#slots.size;
  }

  /**
   * Stops claiming, waits up to `stopTimeoutMs` for running handlers, then
   * aborts the signals of the others and releases their leases. Calling it
   * again returns the same promise. The processor also stops on its own when
   * it finds its outbox closed; then it aborts running handlers' signals at
   * once and releases nothing, the connection being gone. Handlers that ran
   * past `handlerTimeoutMs` were released already: it does not wait for them.
   *
   * @returns Resolves when no handler's lease is held any more.
   */
  stop(): Promise<void> {
    this.#stopped ??= this.#stop();
    return this.#stopped;
  }

  /** Same as {@linkcode Processor.stop}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }

  readonly #onAbort = () => void this.stop();

  async #run(): Promise<void> {
    let idleMs = this.#pollMinMs;
    // Whether the last claim came back empty.
    let idle = true;
    // Whether the last wait was ended by a wake rather than its timer.
    let wokenByWait = false;
    while (!this.#stopping) {
      const free = this.#concurrency - this.#slots.size;
      if (free <= 0) {
        wokenByWait = await this.#wait(undefined);
        continue;
      }
      // An idle loop reads when the next event comes due before it claims,
      // not after: the read counts only events not yet due, so one coming
      // due between an empty claim and the read would be seen by neither,
      // and the loop would sleep a whole poll interval past it. Read first,
      // each event is due at the claim or counted by the read. Woken (an
      // enqueue, a freed slot), it claims at once and reads only if that
      // claim comes back empty. The wake is taken before the read, so one
      // landing during it (a NOTIFY for an event the read missed) ends the
      // next wait at once.
      const read = idle && !wokenByWait && !this.#woken;
      wokenByWait = false;
      this.#woken = false;
      await this.#runSchedules(read);
      const dueAt = read ? await this.#nextDueAt() : undefined;
      let claimed: Claimed<P>;
      try {
        claimed = await this.#claim(!read);
      } catch (error) {
        if (this.#noteClosed(error)) break;
        this.#report(error);
        wokenByWait = await this.#wait(idleMs);
        idleMs = Math.min(idleMs * 2, this.#pollMaxMs);
        continue;
      }
      const { leases, claimedAt, claimedAtWall } = claimed;
      this.#unstarted = 0;
      for (const lease of leases) {
        this.#start(lease, claimedAt, claimedAtWall);
      }
      // Slots filled by a write that acknowledged and claimed: not idle.
      if (leases.length > 0 || this.#slots.size >= this.#concurrency) {
        idle = false;
        idleMs = this.#pollMinMs;
        continue;
      }
      idle = true;
      // An empty claim with no read before it (or none at all, skipped):
      // claim again after one.
      if (!read) continue;
      wokenByWait = await this.#wait(
        dueAt === undefined
          ? idleMs
          : Math.min(idleMs, Math.max(1, dueAt - this.#monotonicNow())),
      );
      idleMs = Math.min(idleMs * 2, this.#pollMaxMs);
    }
  }

  /**
   * Claims for every free slot when the loop's other writes are done. Sized
   * when it runs rather than when asked, so slots that acknowledgements
   * committed meanwhile free join the claim: one transaction for all of them
   * instead of one per slot as slots free one at a time. `unread`: no read
   * of the next due time came before this claim, so an empty answer sends
   * the loop to read it and claim again; the claim is then skipped when the
   * last acknowledgement with a claim found too few events.
   */
  async #claim(unread: boolean): Promise<Claimed<P>> {
    if (this.#writing) {
      const turn = Promise.withResolvers<void>();
      this.#claimTurn = turn.resolve;
      await turn.promise;
    } else {
      this.#writing = true;
    }
    try {
      const claimedAt = this.#monotonicNow();
      const claimedAtWall = this.#now();
      // None when a write that acknowledged and claimed filled the slots,
      // or (when `unread`) found too few events to fill them.
      const max = this.#concurrency - this.#slots.size;
      const drained = unread && this.#drained;
      this.#drained = false;
      const leases = this.#stopping || max <= 0 || drained
        ? []
        : await this.#outbox.claim({ max, ...this.#claimOptions() });
      this.#unstarted = leases.length;
      return { leases, claimedAt, claimedAtWall };
    } finally {
      this.#nextWrite();
    }
  }

  /** The lease length and queue of the loop's claims. */
  #claimOptions(): Omit<BatchClaimOptions, "max"> {
    return {
      leaseMs: this.#leaseMs,
      ...(this.#queue === undefined ? {} : { queue: this.#queue }),
    };
  }

  /**
   * Ends one of the loop's writes. While handlers still run, the next write
   * waits for the timers due by then: a WASM commit blocks the thread, and
   * each timer or I/O callback runs with its promise jobs (a whole commit
   * among them) before the next, so without the wait every handler would
   * finish, and be acknowledged, alone. A zero-delay message would not do:
   * Deno delivers it before the timers that are due.
   */
  #nextWrite(): void {
    for (const slot of this.#slots) {
      if (slot.state === "running") {
        this.#timers.setTimeout(() => this.#startNextWrite(), 0);
        return;
      }
    }
    this.#startNextWrite();
  }

  /**
   * Starts the loop's next write. Waiting acknowledgements go with a claim
   * for the slots they free and every other free one, in one call, when
   * the outbox has {@linkcode ProcessableOutbox.acknowledgeAndClaim}: one
   * commit instead of two. Without it, acknowledgements go first, as they
   * free slots for the claim, unless at least half the slots are free
   * already and the claim is waiting (keeping handlers busy).
   */
  #startNextWrite(): void {
    const acknowledgements = this.#acknowledgements.length > 0;
    const claim = this.#claimTurn;
    if (
      acknowledgements && !this.#stopping &&
      this.#outbox.acknowledgeAndClaim !== undefined
    ) {
      this.#folding = this.#acknowledgeAndClaim();
    } else if (
      claim !== undefined &&
      (!acknowledgements ||
        2 * (this.#concurrency - this.#slots.size) >= this.#concurrency)
    ) {
      this.#claimTurn = undefined;
      claim();
    } else if (acknowledgements) {
      void this.#acknowledgeBatch();
    } else {
      this.#writing = false;
    }
  }

  /**
   * Runs the outbox's schedules (issue 40) at an idle loop's read, and at
   * least once a second while it is busy: one read while nothing is due.
   */
  async #runSchedules(idle: boolean): Promise<void> {
    const now = this.#monotonicNow();
    if (this.#outbox.runSchedules === undefined || this.#stopping) return;
    if (!idle && now - this.#schedulesRunAt < 1_000) return;
    this.#schedulesRunAt = now;
    try {
      await this.#outbox.runSchedules();
    } catch (error) {
      if (!this.#noteClosed(error)) this.#report(error);
    }
  }

  /**
   * When, on the monotonic clock, the queue's next delayed event, backoff
   * or lease deadline comes due, so an idle loop wakes for it rather than on
   * its next poll; `undefined` when there is none or it cannot be read.
   */
  async #nextDueAt(): Promise<number | undefined> {
    if (this.#stopping) return undefined;
    const readAt = this.#monotonicNow();
    try {
      const dueInMs = await this.#outbox.nextDueInMs(
        this.#queue === undefined ? {} : { queue: this.#queue },
      );
      return dueInMs === null ? undefined : readAt + dueInMs;
    } catch (error) {
      if (!this.#noteClosed(error)) this.#report(error);
      return undefined;
    }
  }

  /**
   * Waits for `delayMs` (forever when `undefined`) or until woken; true when
   * a wake ended it.
   */
  #wait(delayMs: number | undefined): Promise<boolean> {
    if (this.#woken || this.#stopping) {
      this.#woken = false;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      let timer: LongTimer | undefined;
      const end = (woken: boolean) => {
        clearLongTimeout(this.#timers, timer);
        this.#waiter = undefined;
        this.#woken = false;
        resolve(woken);
      };
      this.#waiter = () => end(true);
      if (delayMs !== undefined) {
        timer = setLongTimeout(this.#timers, () => end(false), delayMs);
      }
    });
  }

  /** Ends the current wait; a wake that finds no wait makes the next one return at once. */
  #wake(): void {
    if (this.#waiter === undefined) this.#woken = true;
    else this.#waiter();
  }

  #start(lease: Lease<P>, claimedAt: number, claimedAtWall: number): void {
    this.#counters.claimed++;
    const slot: Slot<P> = {
      lease,
      state: "running",
      acknowledged: false,
      validUntilMonotonic: claimedAt + this.#leaseMs,
      validUntilWall: claimedAtWall + this.#leaseMs,
      renewTimer: undefined,
      watchdogTimer: undefined,
      timeoutTimer: undefined,
      controller: new AbortController(),
      done: Promise.resolve(),
      released: Promise.resolve(),
    };
    this.#slots.add(slot);
    this.#armWatchdog(slot);
    this.#scheduleRenewal(
      slot,
      claimedAt + this.#renewIntervalMs - this.#monotonicNow(),
    );
    if (this.#handlerTimeoutMs !== undefined) {
      slot.timeoutTimer = setLongTimeout(
        this.#timers,
        () => this.#timeOut(slot),
        this.#handlerTimeoutMs,
      );
    }
    const context: HandlerContext = {
      signal: slot.controller.signal,
      throwIfLost: () => {
        this.#checkOverdue(slot);
        slot.controller.signal.throwIfAborted();
      },
      transaction: (fn) => this.#transaction(slot, fn),
    };
    let outcome: Promise<unknown>;
    try {
      outcome = Promise.resolve(
        this.#telemetry.handle(
          slot,
          lease,
          () => this.#handler(lease, context),
        ),
      );
    } catch (error) {
      outcome = Promise.reject(error);
    }
    // Neither path rejects: #succeed and #fail report what goes wrong.
    slot.done = outcome
      .then(() => this.#succeed(slot), (error) => this.#fail(slot, error))
      .finally(() => {
        this.#telemetry.end(slot);
        this.#free(slot);
      });
  }

  async #transaction<T>(
    slot: Slot<P>,
    fn: (tx: Transaction) => Promise<T>,
  ): Promise<T> {
    const outbox = this.#outbox;
    if (outbox.transaction === undefined) {
      throw new TypeError(
        "Cannot run transaction as this outbox has none (the browser's shared outbox forwards single calls only)",
      );
    }
    let result: T;
    try {
      result = await outbox.transaction(async (tx) => {
        const value = await fn(tx);
        await tx.acknowledge(slot.lease);
        // Before the commit, so a renewal refused because of it is not a loss.
        slot.acknowledged = true;
        return value;
      });
    } catch (error) {
      slot.acknowledged = false;
      if (error instanceof LeaseLostError) {
        this.#count(slot, "staleAcknowledgements");
        // Its current holder owns the event: no acknowledgement, no release.
        if (slot.state === "running") this.#finish(slot);
        this.#lose(slot, error);
      } else {
        this.#noteClosed(error);
      }
      throw error;
    }
    this.#count(slot, "acknowledged");
    if (slot.state === "running") this.#finish(slot);
    return result;
  }

  #succeed(slot: Slot<P>): Promise<void> {
    if (slot.state !== "running" || this.#closed) return Promise.resolve();
    this.#finish(slot);
    const acknowledged = Promise.withResolvers<void>();
    this.#acknowledgements.push({ slot, resolve: acknowledged.resolve });
    if (!this.#writing) {
      this.#writing = true;
      this.#nextWrite();
    }
    return acknowledged.promise;
  }

  /**
   * Acknowledges the leases of every finished handler waiting, in one
   * transaction, and counts each lease by its own result. When the batch
   * throws, nothing of it was committed: its events stay leased until their
   * leases lapse and are delivered again, and none is counted.
   */
  async #acknowledgeBatch(
    batch = this.#acknowledgements.splice(0),
  ): Promise<void> {
    try {
      await this.#countAcknowledged(
        batch,
        await this.#outbox.acknowledge(batch.map(({ slot }) => slot.lease)),
      );
    } catch (error) {
      if (!this.#noteClosed(error)) this.#report(error);
    }
    this.#freeAcknowledged(batch);
    this.#nextWrite();
  }

  /**
   * Acknowledges the leases of every finished handler waiting and claims
   * for the slots they free and every other free one, in one call, and
   * starts the handlers of the leases it claimed. When the call throws,
   * nothing of it was committed: the error is reported, and the
   * acknowledgements go alone.
   */
  async #acknowledgeAndClaim(): Promise<void> {
    const batch = this.#acknowledgements.splice(0);
    const claimedAt = this.#monotonicNow();
    const claimedAtWall = this.#now();
    const max = this.#concurrency - this.#slots.size - this.#unstarted +
      batch.length;
    let leases: Lease<P>[];
    try {
      const result = await this.#outbox.acknowledgeAndClaim!(
        batch.map(({ slot }) => slot.lease),
        { max, ...this.#claimOptions() },
      );
      await this.#countAcknowledged(batch, result.acknowledged);
      leases = result.leases;
      this.#drained = leases.length < max;
    } catch (error) {
      if (this.#noteClosed(error)) {
        this.#freeAcknowledged(batch);
        this.#nextWrite();
      } else {
        this.#report(error);
        await this.#acknowledgeBatch(batch);
      }
      return;
    }
    this.#freeAcknowledged(batch);
    for (const lease of leases) this.#start(lease, claimedAt, claimedAtWall);
    this.#nextWrite();
  }

  /** Counts each lease of an acknowledgement batch by its own result. */
  async #countAcknowledged(
    batch: readonly { slot: Slot<P> }[],
    results: readonly boolean[],
  ): Promise<void> {
    for (const [i, acknowledged] of results.entries()) {
      const { slot } = batch[i]!;
      this.#count(
        slot,
        acknowledged || await this.#acknowledgedBySelf(slot.lease)
          ? "acknowledged"
          : "staleAcknowledgements",
      );
    }
  }

  /** Frees the slots of an acknowledgement batch, so a claim next counts them. */
  #freeAcknowledged(
    batch: readonly { slot: Slot<P>; resolve: () => void }[],
  ): void {
    for (const { slot, resolve } of batch) {
      this.#free(slot);
      resolve();
    }
  }

  /** Gives a slot back to the loop. */
  #free(slot: Slot<P>): void {
    if (this.#slots.delete(slot)) this.#wake();
  }

  /**
   * Whether a refused acknowledgement was refused because the handler
   * acknowledged its own lease already: the event is done at this lease's
   * fence, which only this lease's token could do.
   */
  async #acknowledgedBySelf(lease: Lease<P>): Promise<boolean> {
    try {
      const event = await this.#outbox.explain(lease.eventId);
      return event?.state === "done" && event.fence === lease.fence;
    } catch (error) {
      if (!this.#noteClosed(error)) this.#report(error);
      return false;
    }
  }

  async #fail(slot: Slot<P>, error: unknown): Promise<void> {
    // A timed-out handler was counted and reported when it timed out.
    if (slot.state === "abandoned") return;
    this.#counters.failed++;
    this.#handlerError(error, slot.lease);
    if (slot.state !== "running" || this.#closed) return;
    this.#finish(slot);
    const text = describeError(error);
    if (error instanceof PermanentError) {
      await this.#release(slot, { error: text, deadLetter: true });
    } else if (error instanceof RetryAfterError) {
      await this.#release(slot, { error: text, delayMs: error.delayMs });
    } else {
      await this.#release(slot, {
        error: text,
        delayMs: this.#backoffMs(slot),
      });
    }
  }

  /**
   * A handler past `handlerTimeoutMs`: its signal aborts, its lease is given
   * back after the backoff, and its slot stays taken until it settles.
   */
  #timeOut(slot: Slot<P>): void {
    if (slot.state !== "running") return;
    this.#finish(slot);
    slot.state = "abandoned";
    const error = new DOMException(
      `Handler of event ${slot.lease.eventId} (fence ${slot.lease.fence}) ran past handlerTimeoutMs (${this.#handlerTimeoutMs} ms)`,
      "TimeoutError",
    );
    this.#counters.failed++;
    slot.controller.abort(error);
    this.#handlerError(error, slot.lease);
    slot.released = this.#release(slot, {
      error: describeError(error),
      delayMs: this.#backoffMs(slot),
    });
  }

  /** Exponential backoff with jitter, as in Deno std's `retry`. */
  #backoffMs(slot: Slot<P>): number {
    const exponent = Math.max(0, slot.lease.attempt - 1);
    const capped = Math.min(
      this.#backoffMaxMs,
      this.#backoffMinMs * this.#backoffMultiplier ** exponent,
    );
    return Math.round(capped * (1 - this.#backoffJitter * this.#random()));
  }

  async #release(slot: Slot<P>, options: ReleaseOptions): Promise<void> {
    try {
      if (await this.#outbox.release(slot.lease, options)) {
        this.#count(
          slot,
          options.deadLetter || slot.lease.attempt >= slot.lease.maxAttempts
            ? "dead"
            : "released",
        );
      }
    } catch (releaseError) {
      if (!this.#noteClosed(releaseError)) this.#report(releaseError);
    }
  }

  /** Reports an error the loop survives; a throwing `onError` cannot stop it. */
  #report(error: unknown): void {
    try {
      this.#onError(error);
    } catch (hookError) {
      console.error("processEvents: the onError hook threw", hookError);
    }
  }

  #handlerError(error: unknown, lease: Lease<P>): void {
    if (this.#onHandlerError === undefined) return;
    try {
      this.#onHandlerError(error, lease);
    } catch (hookError) {
      this.#report(hookError);
    }
  }

  /** Counts for `counters` and for OpenTelemetry. */
  #count(slot: Slot<P>, name: Exclude<CounterName, "claimed">): void {
    this.#counters[name]++;
    this.#telemetry.count(slot, name);
  }

  #finish(slot: Slot<P>): void {
    slot.state = "finishing";
    clearLongTimeout(this.#timers, slot.renewTimer);
    clearLongTimeout(this.#timers, slot.watchdogTimer);
    clearLongTimeout(this.#timers, slot.timeoutTimer);
  }

  #scheduleRenewal(slot: Slot<P>, delayMs: number): void {
    slot.renewTimer = setLongTimeout(
      this.#timers,
      () => void this.#renew(slot),
      delayMs,
    );
  }

  async #renew(slot: Slot<P>): Promise<void> {
    if (slot.state !== "running" || this.#checkOverdue(slot)) return;
    const startedAt = this.#monotonicNow();
    const startedAtWall = this.#now();
    let leaseUntil: number | false;
    try {
      leaseUntil = await this.#outbox.renew(slot.lease, this.#leaseMs);
    } catch (error) {
      if (this.#noteClosed(error)) return;
      this.#report(error);
      // The watchdog still guards the deadline; try again soon.
      if (slot.state === "running") {
        this.#scheduleRenewal(
          slot,
          Math.max(1, Math.floor(this.#renewIntervalMs / 4)),
        );
      }
      return;
    }
    if (slot.state !== "running" || slot.controller.signal.aborted) return;
    if (leaseUntil === false) {
      if (slot.acknowledged) return;
      this.#lose(
        slot,
        new LeaseLostError(slot.lease.eventId, slot.lease.fence),
      );
      return;
    }
    slot.lease = { ...slot.lease, leaseUntil };
    // Measured from before the request: the database's deadline is later.
    slot.validUntilMonotonic = startedAt + this.#leaseMs;
    slot.validUntilWall = startedAtWall + this.#leaseMs;
    this.#armWatchdog(slot);
    this.#scheduleRenewal(slot, this.#renewIntervalMs);
  }

  #armWatchdog(slot: Slot<P>): void {
    clearLongTimeout(this.#timers, slot.watchdogTimer);
    const delayMs = slot.validUntilMonotonic - this.#marginMs -
      this.#monotonicNow();
    slot.watchdogTimer = setLongTimeout(this.#timers, () => {
      if (slot.state === "running" && !this.#checkOverdue(slot)) {
        this.#armWatchdog(slot);
      }
    }, delayMs);
  }

  /**
   * Aborts the slot's signal when its renewal is overdue by either clock;
   * returns whether the signal is aborted.
   */
  #checkOverdue(slot: Slot<P>): boolean {
    if (slot.controller.signal.aborted) return true;
    if (slot.acknowledged) return false;
    const monotonic = this.#monotonicNow() >=
      slot.validUntilMonotonic - this.#marginMs;
    const wall = this.#now() >= slot.validUntilWall - this.#marginMs;
    if (!monotonic && !wall) return false;
    this.#lose(
      slot,
      new DOMException(
        `Lease on event ${slot.lease.eventId} (fence ${slot.lease.fence}) is overdue for renewal by the ${
          monotonic ? "monotonic" : "wall"
        } clock`,
        "TimeoutError",
      ),
    );
    return true;
  }

  #lose(slot: Slot<P>, reason: unknown): void {
    if (slot.controller.signal.aborted) return;
    this.#count(slot, "leasesLost");
    clearLongTimeout(this.#timers, slot.renewTimer);
    clearLongTimeout(this.#timers, slot.watchdogTimer);
    slot.controller.abort(reason);
  }

  /**
   * Stops the processor when its outbox was closed (whatever `error` is, the
   * closed outbox is why), and returns whether it did.
   */
  /**
   * Whether the outbox can write no more, stopping the loop as for a
   * closed one if so: closed (by the caller, so nothing is reported), or
   * its database file renamed or deleted (`error` a
   * {@linkcode DatabaseMovedError}, reported once: every claim, renewal and
   * acknowledgement would fail the same way).
   */
  #noteClosed(error?: unknown): boolean {
    const moved = error instanceof DatabaseMovedError;
    if (!moved && !this.#outbox.closed) return false;
    if (!this.#closed) {
      if (moved) this.#report(error);
      this.#closed = true;
      void this.stop();
    }
    return true;
  }

  async #stop(): Promise<void> {
    this.#stopping = true;
    this.#unsubscribe();
    this.#telemetry.close();
    this.#signal?.removeEventListener("abort", this.#onAbort);
    this.#wake();
    await this.#loop;
    // Its leases start handlers that stopping must wait for, or release.
    await this.#folding;
    if (this.#closed) {
      // Nothing can be renewed, acknowledged or released any more: the
      // leases will lapse, and handlers must stop acting on them now.
      const finishing: Promise<void>[] = [];
      for (const slot of this.#slots) {
        if (slot.state === "abandoned") continue;
        if (slot.state !== "running") {
          finishing.push(slot.done);
          continue;
        }
        this.#finish(slot);
        slot.state = "released";
        this.#lose(
          slot,
          new DOMException("The outbox is closed", "AbortError"),
        );
        this.#slots.delete(slot);
      }
      await Promise.all(finishing);
      return;
    }
    const held = () =>
      [...this.#slots].filter((slot) => slot.state !== "abandoned");
    if (held().some((slot) => slot.state === "running")) {
      await new Promise<void>((resolve) => {
        const timer = setLongTimeout(
          this.#timers,
          resolve,
          this.#stopTimeoutMs,
        );
        void Promise.all(held().map((slot) => slot.done)).then(() => {
          clearLongTimeout(this.#timers, timer);
          resolve();
        });
      });
    }
    const pending: Promise<void>[] = [];
    for (const slot of this.#slots) {
      if (slot.state === "abandoned") {
        pending.push(slot.released);
        continue;
      }
      if (slot.state !== "running") {
        pending.push(slot.done);
        continue;
      }
      this.#finish(slot);
      slot.state = "released";
      slot.controller.abort(
        new DOMException("The processor stopped", "AbortError"),
      );
      pending.push(
        this.#release(slot, {
          delayMs: 0,
          error: "processor stopped before the handler finished",
        }),
      );
    }
    await Promise.all(pending);
    for (const slot of this.#slots) {
      if (slot.state === "released") this.#slots.delete(slot);
    }
  }
}

/**
 * The error text an event keeps: whatever was thrown, as text SQLite can
 * store. An `Object.create(null)` or an error whose `message` getter throws
 * cannot be printed the usual way; NUL is cut by some drivers and lone
 * surrogates become U+FFFD, so both are replaced, after cutting to the
 * longest text kept (a cut may split a surrogate pair).
 */
function describeError(error: unknown): string {
  let text = "an error that cannot be printed";
  try {
    text = error instanceof Error
      ? `${error.name}: ${error.message}`
      : String(error);
  } catch {
    try {
      text = `an unprintable ${Object.prototype.toString.call(error)}`;
    } catch {
      // Even its tag throws (a hostile Proxy): the default text stays.
    }
  }
  return text.replaceAll("\0", "\uFFFD").slice(0, MAX_ERROR_LENGTH)
    .toWellFormed();
}

function real(
  field: string,
  value: unknown,
  min: number,
  max: number,
  fallback: number,
): number {
  if (value === undefined) return fallback;
  const kind = max === Infinity
    ? `a finite number of at least ${min}`
    : `a number from ${min} to ${max}`;
  if (typeof value !== "number") {
    throw new TypeError(
      `Cannot ${OP} as '${field}' must be ${kind}: current value is ${typeof value}`,
    );
  }
  if (!Number.isFinite(value) || value < min || value > max) {
    throw new RangeError(
      `Cannot ${OP} as '${field}' must be ${kind}: current value is ${value}`,
    );
  }
  return value;
}

function fn<F>(field: string, value: F | undefined): F | undefined {
  if (value !== undefined && typeof value !== "function") {
    throw new TypeError(
      `Cannot ${OP} as '${field}' must be a function: current value is ${typeof value}`,
    );
  }
  return value;
}
