/**
 * The {@linkcode Processor}: the processing loop's three state machines
 * (`./states.ts`) at work. The loop claims for free slots, the writer takes
 * the loop's writes one at a time, and each slot runs one handler under a
 * lease that renews itself and fences itself by the local clocks.
 *
 * @module
 */
import type { BatchClaimOptions, Lease, ReleaseOptions } from "../lease.ts";
import { DatabaseMovedError } from "../errors.ts";
import { type CounterName, ProcessorTelemetry } from "../telemetry.ts";
import {
  clearLongTimeout,
  setLongTimeout,
  type Settings,
  settingsOf,
} from "./options.ts";
import { callingSlot, runAsHandler } from "./handler_scope.ts";
import { outsideTransactions } from "../core/transaction.ts";
import { describeError, isInstance } from "../validate.ts";
import { LeasesAhead } from "./ahead.ts";
import { Wakeup } from "./wakeup.ts";
import {
  handlerTransaction,
  type TransactionHost,
} from "./handler_transaction.ts";
import { backoffMs, releaseFor, Reports } from "./outcomes.ts";
import { LeaseKeeper, type Slot } from "./lease_keeper.ts";
import {
  LOOP,
  type LoopState,
  SLOT,
  type SlotState,
  step,
  WRITER,
  type WriterState,
} from "./states.ts";
import type {
  Handler,
  HandlerContext,
  ProcessableOutbox,
  ProcessOptions,
  ProcessorCounters,
} from "./types.ts";

/** What one claim of the loop returned, with when it was sent by both clocks. */
interface Claimed<P> {
  readonly leases: Lease<P>[];
  readonly claimedAt: number;
  readonly claimedAtWall: number;
}

/**
 * A running processing loop, from {@linkcode processEvents}.
 *
 * Stopping it stops claiming, gives back the leases claimed ahead (their
 * attempts not counted: no handler saw them), waits up to `stopTimeoutMs`
 * for running handlers, then aborts the signals of the rest and releases
 * their leases. Their claims counted as attempts (as an SQS receive does),
 * so an event released at its last attempt becomes a dead letter.
 */
export class Processor<P = unknown> implements AsyncDisposable {
  readonly #outbox: ProcessableOutbox<P>;
  readonly #handler: Handler<P>;
  readonly #o: Settings;
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
  readonly #keeper: LeaseKeeper<P>;
  readonly #loop: Promise<void>;
  readonly #unsubscribe: () => void;
  readonly #wakeup: Wakeup;
  readonly #reports: Reports;
  readonly #transactionHost: TransactionHost<P>;
  #loopState: LoopState = "starting";
  #writerState: WriterState = "idle";
  #stopping = false;
  /** When the loop last ran the schedules, on the monotonic clock. */
  #schedulesRunAt = -Infinity;
  #closed = false;
  #stopped: Promise<void> | undefined;
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
  /** Leases claimed ahead of a free handler slot (`prefetch`). */
  readonly #ahead: LeasesAhead<P>;
  /** Handlers that have not settled, timed-out ones included. */
  #handlers = 0;
  /** Slots whose handlers called stop() themselves: stopping waits for them last. */
  readonly #stoppers = new Set<Slot<P>>();
  /** Settles when a handler calls stop(), so the wait for the others re-picks. */
  #stopperJoined = Promise.withResolvers<void>();
  /** Resolves when every handler but those that called stop() has finished. */
  readonly #othersStopped = Promise.withResolvers<void>();

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
    this.#o = settingsOf(outbox, handler, options);
    this.#outbox = outbox;
    this.#handler = handler;
    this.#telemetry = new ProcessorTelemetry(outbox, options.queue);
    this.#keeper = new LeaseKeeper(this.#o, {
      renew: (lease, leaseMs) => outbox.renew(lease, leaseMs),
      noteClosed: (error) => this.#noteClosed(error),
      report: (error) => this.#report(error),
      lost: (slot) => this.#count(slot, "leasesLost"),
      timedOut: (slot) => this.#timeOut(slot),
    });
    this.#ahead = new LeasesAhead(
      this.#o,
      (lease) =>
        outbox.release(lease, { attempted: false }).then(() => {}, (error) => {
          if (!this.#noteClosed(error)) this.#report(error);
        }),
    );
    this.#reports = new Reports(this.#o);
    this.#transactionHost = {
      outbox,
      keeper: this.#keeper,
      count: (slot, name) => this.#count(slot, name),
      noteClosed: (error) => this.#noteClosed(error),
    };
    this.#wakeup = new Wakeup(this.#o.timers, () => this.#stopping);
    this.#unsubscribe = outbox.onEnqueue(() => this.#wakeup.wake());
    this.#o.signal?.addEventListener("abort", this.#onAbort);
    this.#loop = this.#run();
    if (this.#o.signal?.aborted) void this.stop();
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
   * Stops claiming, gives back the leases claimed ahead unstarted (their
   * attempts not counted), waits up to `stopTimeoutMs` for running handlers, then
   * aborts the signals of the others and releases their leases. Calling it
   * again returns the same promise. The processor also stops on its own when
   * it finds its outbox closed; then it aborts running handlers' signals at
   * once and releases nothing, the connection being gone. Handlers that ran
   * past `handlerTimeoutMs` were released already: it does not wait for them.
   *
   * Called from inside one of this processor's handlers (a fatal condition
   * that shuts the loop down), it does not wait for that handler, which
   * would wait for itself: its promise resolves once every other handler
   * has finished or been released, and the calling handler then goes on
   * and settles as usual, its event acknowledged when it returns (or
   * released when it throws), within what is left of `stopTimeoutMs`.
   * Called inside that handler's own `context.transaction(fn)`, it resolves
   * at once: the others' acknowledgements and the leases going back need
   * the connection the transaction holds, and go through when it ends.
   * Another caller's promise still waits for the calling handler too. The
   * call is told by `AsyncLocalStorage`: where the runtime has none
   * (browsers), a handler's own `stop()` waits the whole `stopTimeoutMs`,
   * and its event is released.
   *
   * @returns Resolves when no handler's lease is held any more (called
   * from a handler: none but its own and those of other handlers that
   * called it too).
   */
  stop(): Promise<void> {
    // Started outside the caller's transaction, if any: the leases it gives
    // back are the loop's writes, which wait for that transaction to end
    // rather than being refused as calls nested in it.
    this.#stopped ??= outsideTransactions(() => this.#stop());
    const slot = callingSlot<Slot<P>>(this, (slot) => this.#slots.has(slot));
    if (slot === undefined) return this.#stopped;
    this.#stoppers.add(slot);
    this.#stopperJoined.resolve();
    // Inside the handler's own context.transaction, the other handlers'
    // acknowledgements and the leases going back wait for the connection
    // that transaction holds: waiting for them there would wait for itself.
    if (slot.transaction === "running") return Promise.resolve();
    return this.#othersStopped.promise;
  }

  /** Same as {@linkcode Processor.stop}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }

  readonly #onAbort = () => void this.stop();
  /** Reports an error the loop survives (`./outcomes.ts`). */
  readonly #report = (error: unknown) => this.#reports.error(error);

  /** Moves the loop to `to`, asserting the transition (`./states.ts`). */
  #loopTo(to: LoopState): void {
    this.#loopState = step(LOOP, this.#loopState, to);
  }

  /** Moves the writer to `to`, asserting the transition (`./states.ts`). */
  #writerTo(to: WriterState): void {
    this.#writerState = step(WRITER, this.#writerState, to);
  }

  /** Moves a slot to `to`, asserting the transition (`./states.ts`). */
  #slotTo(slot: Slot<P>, to: SlotState): void {
    slot.state = step(SLOT, slot.state, to);
  }

  /** The loop: one state per turn, chosen afresh after each step. */
  async #run(): Promise<void> {
    const o = this.#o;
    let idleMs = o.pollMinMs;
    // Whether the last claim came back empty.
    let idle = true;
    // Whether the last wait was ended by a wake rather than its timer.
    let wokenByWait = false;
    while (!this.#stopping) {
      // Every handler slot taken: leases claimed ahead are topped up by the
      // acknowledgements' writes, not by polling while handlers run.
      if (this.#slots.size >= o.concurrency || this.#held() >= this.#budget()) {
        this.#loopTo("full");
        wokenByWait = await this.#wakeup.wait(undefined);
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
      const woken = this.#wakeup.take();
      const read = idle && !wokenByWait && !woken;
      wokenByWait = false;
      let dueAt: number | undefined;
      if (read) {
        this.#loopTo("reading");
        dueAt = await this.#nextDueAt();
      }
      this.#loopTo("claiming");
      await this.#runSchedules(read);
      let claimed: Claimed<P>;
      try {
        claimed = await this.#claim(!read);
      } catch (error) {
        if (this.#noteClosed(error)) break;
        this.#report(error);
        this.#loopTo("backingOff");
        wokenByWait = await this.#wakeup.wait(idleMs);
        idleMs = Math.min(idleMs * 2, o.pollMaxMs);
        continue;
      }
      const { leases, claimedAt, claimedAtWall } = claimed;
      this.#unstarted = 0;
      this.#take(leases, claimedAt, claimedAtWall);
      // Slots filled by a write that acknowledged and claimed: not idle.
      if (leases.length > 0 || this.#held() >= this.#budget()) {
        idle = false;
        idleMs = o.pollMinMs;
        continue;
      }
      idle = true;
      // An empty claim with no read before it (or none at all, skipped):
      // claim again after one.
      if (!read) continue;
      this.#loopTo("waiting");
      // Other connections' enqueues wake this wait where the driver can
      // watch for them only at a cost per commit (Outbox.watchWhileIdle).
      const unwatch = this.#outbox.watchWhileIdle?.();
      try {
        wokenByWait = await this.#wakeup.wait(
          dueAt === undefined
            ? idleMs
            : Math.min(idleMs, Math.max(1, dueAt - o.monotonicNow())),
        );
      } finally {
        unwatch?.();
      }
      idleMs = Math.min(idleMs * 2, o.pollMaxMs);
    }
    this.#loopTo("stopped");
  }

  /**
   * Claims for every free slot (and the leases ahead, with `prefetch`) when
   * the loop's other writes are done. Sized
   * when it runs rather than when asked, so slots that acknowledgements
   * committed meanwhile free join the claim: one transaction for all of them
   * instead of one per slot as slots free one at a time. `unread`: no read
   * of the next due time came before this claim, so an empty answer sends
   * the loop to read it and claim again; the claim is then skipped when the
   * last acknowledgement with a claim found too few events.
   */
  async #claim(unread: boolean): Promise<Claimed<P>> {
    if (this.#writerState === "idle") {
      this.#writerTo("claiming");
    } else {
      // #nextWrite moves the writer to "claiming" when it gives the turn.
      const turn = Promise.withResolvers<void>();
      this.#claimTurn = turn.resolve;
      await turn.promise;
    }
    try {
      const claimedAt = this.#o.monotonicNow();
      const claimedAtWall = this.#o.now();
      // None when a write that acknowledged and claimed filled the slots,
      // or (when `unread`) found too few events to fill them.
      const max = this.#budget() - this.#held();
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
      leaseMs: this.#o.leaseMs,
      ...(this.#o.queue === undefined ? {} : { queue: this.#o.queue }),
    };
  }

  /**
   * Ends one of the loop's writes by starting the next, at once: it takes
   * every acknowledgement that became ready while this one was under way.
   * Waiting acknowledgements go with a claim for the slots they free and
   * every other free one, in one call, when the outbox has
   * {@linkcode ProcessableOutbox.acknowledgeAndClaim}: one commit instead of
   * two. Without it, acknowledgements go first, as they free slots for the
   * claim, unless at least half the slots are free already and the claim is
   * waiting (keeping handlers busy). With nothing to write the writer goes
   * idle, and the next finished handler starts a write itself.
   */
  #nextWrite(): void {
    const acknowledgements = this.#acknowledgements.length > 0;
    const claim = this.#claimTurn;
    if (
      acknowledgements && !this.#stopping &&
      this.#outbox.acknowledgeAndClaim !== undefined
    ) {
      this.#writerTo("folding");
      this.#folding = this.#acknowledgeAndClaim();
    } else if (
      claim !== undefined &&
      (!acknowledgements ||
        2 * (this.#budget() - this.#held()) >= this.#budget())
    ) {
      this.#writerTo("claiming");
      this.#claimTurn = undefined;
      claim();
    } else if (acknowledgements) {
      this.#writerTo("acknowledging");
      void this.#acknowledgeBatch();
    } else {
      this.#writerTo("idle");
    }
  }

  /**
   * Runs the outbox's schedules (`Outbox.runSchedules`) as the loop claims:
   * at an idle loop's read, and at most once a second while it is busy; one
   * read while nothing is due.
   */
  async #runSchedules(idle: boolean): Promise<void> {
    const now = this.#o.monotonicNow();
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
    const readAt = this.#o.monotonicNow();
    try {
      const dueInMs = await this.#outbox.nextDueInMs(
        this.#o.queue === undefined ? {} : { queue: this.#o.queue },
      );
      return dueInMs === null ? undefined : readAt + dueInMs;
    } catch (error) {
      if (!this.#noteClosed(error)) this.#report(error);
      return undefined;
    }
  }

  /**
   * The most leases the loop holds: one per handler slot, and as many
   * again claimed ahead while it prefetches.
   */
  #budget(): number {
    return this.#o.concurrency + this.#ahead.room;
  }

  /** Leases held: slots (running, acknowledging, timed out) and claimed ahead. */
  #held(): number {
    return this.#slots.size + this.#ahead.length;
  }

  /**
   * Starts a handler for each claimed lease while a handler slot is free
   * (after the leases claimed ahead before them); the rest wait for one.
   */
  #take(leases: Lease<P>[], claimedAt: number, claimedAtWall: number): void {
    for (const lease of leases) {
      if (this.#ahead.length === 0 && this.#handlers < this.#o.concurrency) {
        this.#start(lease, claimedAt, claimedAtWall);
      } else {
        this.#ahead.hold({ lease, claimedAt, claimedAtWall });
      }
    }
  }

  /**
   * A handler settled: its slot is free for the next lease claimed ahead,
   * started at once (its acknowledgement commits beside it).
   */
  #settled(): void {
    this.#handlers--;
    this.#ahead.handlerFinished();
    while (!this.#stopping && this.#handlers < this.#o.concurrency) {
      const ahead = this.#ahead.next();
      if (ahead === undefined) break;
      this.#start(ahead.lease, ahead.claimedAt, ahead.claimedAtWall);
    }
  }

  #start(lease: Lease<P>, claimedAt: number, claimedAtWall: number): void {
    this.#counters.claimed++;
    const slot = this.#keeper.open(lease, claimedAt, claimedAtWall);
    this.#slots.add(slot);
    const context: HandlerContext = {
      signal: slot.controller.signal,
      throwIfLost: () => {
        this.#keeper.checkOverdue(slot);
        slot.controller.signal.throwIfAborted();
      },
      transaction: (fn) => handlerTransaction(this.#transactionHost, slot, fn),
    };
    let outcome: Promise<unknown>;
    try {
      outcome = Promise.resolve(
        this.#telemetry.handle(
          slot,
          lease,
          () => runAsHandler(this, slot, () => this.#handler(lease, context)),
        ),
      );
    } catch (error) {
      outcome = Promise.reject(error);
    }
    this.#handlers++;
    // Neither path rejects: #succeed and #fail report what goes wrong.
    slot.done = outcome
      .then(() => {
        this.#settled();
        return this.#succeed(slot);
      }, (error) => {
        this.#settled();
        return this.#fail(slot, error);
      })
      .finally(() => {
        this.#telemetry.end(slot);
        this.#free(slot);
      });
  }

  #succeed(slot: Slot<P>): Promise<void> {
    if (slot.state !== "running" || this.#closed) return Promise.resolve();
    this.#keeper.finish(slot);
    const acknowledged = Promise.withResolvers<void>();
    this.#acknowledgements.push({ slot, resolve: acknowledged.resolve });
    if (this.#writerState === "idle") {
      // Not at once: handlers finishing in this same turn join the write.
      // Those awaiting one promise finish in this turn's promise jobs; while
      // others still run, timers due at the same tick and I/O completions
      // delivered together finish in the callbacks after this one, before
      // the event loop's next turn.
      this.#writerTo("gathering");
      const next = () => this.#nextWrite();
      const { timers } = this.#o;
      if (timers.setImmediate !== undefined && this.#handlers > 0) {
        timers.setImmediate(next);
      } else {
        queueMicrotask(next);
      }
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
    const claimedAt = this.#o.monotonicNow();
    const claimedAtWall = this.#o.now();
    const max = this.#budget() - this.#held() - this.#unstarted +
      batch.length;
    if (max <= 0) {
      // A lease claimed ahead went back at its renewal time after these
      // handlers finished: claiming ahead stopped, and the leases still
      // held ahead take every slot these free.
      this.#writerTo("acknowledging");
      await this.#acknowledgeBatch(batch);
      return;
    }
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
        this.#writerTo("acknowledging");
        await this.#acknowledgeBatch(batch);
      }
      return;
    }
    this.#freeAcknowledged(batch);
    this.#take(leases, claimedAt, claimedAtWall);
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
    if (this.#slots.delete(slot)) this.#wakeup.wake();
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
    // Its context.transaction committed: the event is done, and counted
    // acknowledged; what the handler threw after is reported, not counted.
    if (slot.transaction !== "committed") this.#counters.failed++;
    this.#reports.handlerError(error, slot.lease);
    if (slot.state !== "running" || this.#closed) return;
    this.#keeper.finish(slot);
    await this.#release(
      slot,
      releaseFor(this.#o, slot.lease, error, this.#report),
    );
  }

  /**
   * A handler past `handlerTimeoutMs`: its signal aborts, its lease is given
   * back after the backoff, and its slot stays taken until it settles.
   */
  #timeOut(slot: Slot<P>): void {
    if (slot.state !== "running") return;
    this.#keeper.finish(slot);
    this.#slotTo(slot, "abandoned");
    const error = new DOMException(
      `Handler of event ${slot.lease.eventId} (fence ${slot.lease.fence}) ran past handlerTimeoutMs (${this.#o.handlerTimeoutMs} ms)`,
      "TimeoutError",
    );
    this.#counters.failed++;
    slot.controller.abort(error);
    this.#reports.handlerError(error, slot.lease);
    slot.released = this.#release(slot, {
      error: describeError(error),
      delayMs: backoffMs(this.#o, slot.lease.attempt, this.#report),
    });
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

  /** Counts for `counters` and for OpenTelemetry. */
  #count(slot: Slot<P>, name: Exclude<CounterName, "claimed">): void {
    this.#counters[name]++;
    this.#telemetry.count(slot, name);
  }

  /**
   * Whether the outbox can write no more, stopping the loop as for a
   * closed one if so: closed (by the caller, so nothing is reported), or
   * its database file renamed or deleted (`error` a
   * {@linkcode DatabaseMovedError}, reported once: every claim, renewal and
   * acknowledgement would fail the same way).
   */
  #noteClosed(error?: unknown): boolean {
    const moved = isInstance(error, DatabaseMovedError);
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
    this.#o.signal?.removeEventListener("abort", this.#onAbort);
    this.#wakeup.wake();
    await this.#loop;
    // Its leases start handlers that stopping must wait for, or release.
    await this.#folding;
    // Leases claimed ahead go back at once, unstarted, their attempts not
    // counted; with the outbox closed they lapse.
    this.#ahead.returnAll(this.#closed);
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
        this.#keeper.finish(slot);
        this.#slotTo(slot, "released");
        this.#keeper.lose(
          slot,
          new DOMException("The outbox is closed", "AbortError"),
        );
        this.#slots.delete(slot);
      }
      await Promise.all([...finishing, this.#ahead.returned()]);
      this.#othersStopped.resolve();
      return;
    }
    const timedOut = Promise.withResolvers<void>();
    const timer = setLongTimeout(
      this.#o.timers,
      timedOut.resolve,
      this.#o.stopTimeoutMs,
    );
    // The handlers that called stop() wait for the others first: waiting
    // for them now would wait for a handler that waits for this.
    const others = (slot: Slot<P>) => !this.#stoppers.has(slot);
    await this.#untilSettled(others, timedOut.promise);
    await Promise.all([
      ...this.#releaseRunning(others),
      this.#ahead.returned(),
    ]);
    this.#othersStopped.resolve();
    await this.#untilSettled(() => true, timedOut.promise);
    clearLongTimeout(this.#o.timers, timer);
    await Promise.all(this.#releaseRunning(() => true));
    for (const slot of this.#slots) {
      if (slot.state === "released") this.#slots.delete(slot);
    }
  }

  /**
   * Waits until no slot `which` picks holds a lease with a running (or
   * acknowledging) handler, or until `timedOut`; picks again when a handler
   * calls stop().
   */
  async #untilSettled(
    which: (slot: Slot<P>) => boolean,
    timedOut: Promise<void>,
  ): Promise<void> {
    let ended = false;
    void timedOut.then(() => ended = true);
    while (!ended) {
      const held = [...this.#slots].filter((slot) =>
        slot.state !== "abandoned" && slot.state !== "released" && which(slot)
      );
      if (!held.some((slot) => slot.state === "running")) return;
      this.#stopperJoined = Promise.withResolvers<void>();
      await Promise.race([
        Promise.all(held.map((slot) => slot.done)),
        timedOut,
        this.#stopperJoined.promise,
      ]);
    }
  }

  /**
   * Aborts and releases the running handlers `which` picks; returns what
   * to wait for: those releases, timed-out handlers' releases and the
   * acknowledgements under way of the slots it picks.
   */
  #releaseRunning(which: (slot: Slot<P>) => boolean): Promise<void>[] {
    const pending: Promise<void>[] = [];
    for (const slot of this.#slots) {
      if (!which(slot)) continue;
      if (slot.state === "abandoned") {
        pending.push(slot.released);
        continue;
      }
      if (slot.state === "released") continue;
      if (slot.state !== "running") {
        pending.push(slot.done);
        continue;
      }
      this.#keeper.finish(slot);
      this.#slotTo(slot, "released");
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
    return pending;
  }
}
