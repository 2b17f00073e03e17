/**
 * Keeps the lease of each slot of the processing loop: renews it every
 * `renewIntervalMs`, and fences it by the local clocks (a watchdog on the
 * monotonic clock, a check on the wall clock), aborting the handler's signal
 * when a renewal is refused or overdue.
 *
 * @module
 */
import type { Lease } from "../lease.ts";
import { LeaseLostError } from "../errors.ts";
import {
  clearLongTimeout,
  type LongTimer,
  setLongTimeout,
  type Settings,
} from "./options.ts";
import { SLOT, type SlotState, step } from "./states.ts";

/** One claimed lease and its handler (its states: `./states.ts`). */
export interface Slot<P> {
  lease: Lease<P>;
  state: SlotState;
  /** Set inside the handler's transaction once its acknowledgement is written. */
  acknowledged: boolean;
  /**
   * The handler's `context.transaction`: none yet (or the last one rolled
   * back), one running, or one committed, which acknowledged the lease.
   */
  transaction: "none" | "running" | "committed";
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

/** What the keeper needs of the processor. */
export interface KeeperHost<P> {
  /** Extends a lease, as the outbox's `renew` does. */
  renew(lease: Lease<P>, leaseMs: number): Promise<number | false>;
  /** Whether `error` means the outbox can write no more (then the loop stops). */
  noteClosed(error: unknown): boolean;
  /** Reports an error the loop survives. */
  report(error: unknown): void;
  /** Counts a lost lease. */
  lost(slot: Slot<P>): void;
  /** A handler ran past `handlerTimeoutMs`. */
  timedOut(slot: Slot<P>): void;
}

/** Renewal and self-fencing of every slot's lease. */
export class LeaseKeeper<P> {
  readonly #o: Settings;
  readonly #host: KeeperHost<P>;

  /**
   * @param settings The loop's settings (clocks, timers, lease lengths).
   * @param host The processor's side.
   */
  constructor(settings: Settings, host: KeeperHost<P>) {
    this.#o = settings;
    this.#host = host;
  }

  /**
   * A running slot for `lease`, claimed at `claimedAt` (monotonic) and
   * `claimedAtWall`, its watchdog, renewal and handler timeout armed.
   */
  open(lease: Lease<P>, claimedAt: number, claimedAtWall: number): Slot<P> {
    const o = this.#o;
    const slot: Slot<P> = {
      lease,
      state: "running",
      acknowledged: false,
      transaction: "none",
      validUntilMonotonic: claimedAt + o.leaseMs,
      validUntilWall: claimedAtWall + o.leaseMs,
      renewTimer: undefined,
      watchdogTimer: undefined,
      timeoutTimer: undefined,
      controller: new AbortController(),
      done: Promise.resolve(),
      released: Promise.resolve(),
    };
    this.#armWatchdog(slot);
    this.#scheduleRenewal(
      slot,
      claimedAt + o.renewIntervalMs - o.monotonicNow(),
    );
    if (o.handlerTimeoutMs !== undefined) {
      slot.timeoutTimer = setLongTimeout(
        o.timers,
        () => this.#host.timedOut(slot),
        o.handlerTimeoutMs,
      );
    }
    return slot;
  }

  /** Ends a running slot's handler time: `finishing`, its timers cleared. */
  finish(slot: Slot<P>): void {
    slot.state = step(SLOT, slot.state, "finishing");
    clearLongTimeout(this.#o.timers, slot.renewTimer);
    clearLongTimeout(this.#o.timers, slot.watchdogTimer);
    clearLongTimeout(this.#o.timers, slot.timeoutTimer);
  }

  /**
   * Aborts the slot's signal when its renewal is overdue by either clock;
   * returns whether the signal is aborted.
   */
  checkOverdue(slot: Slot<P>): boolean {
    if (slot.controller.signal.aborted) return true;
    if (slot.acknowledged) return false;
    const o = this.#o;
    const monotonic = o.monotonicNow() >= slot.validUntilMonotonic - o.marginMs;
    const wall = o.now() >= slot.validUntilWall - o.marginMs;
    if (!monotonic && !wall) return false;
    this.lose(
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

  /** Aborts the slot's signal with `reason`, once, and stops renewing it. */
  lose(slot: Slot<P>, reason: unknown): void {
    if (slot.controller.signal.aborted) return;
    this.#host.lost(slot);
    clearLongTimeout(this.#o.timers, slot.renewTimer);
    clearLongTimeout(this.#o.timers, slot.watchdogTimer);
    slot.controller.abort(reason);
  }

  #scheduleRenewal(slot: Slot<P>, delayMs: number): void {
    slot.renewTimer = setLongTimeout(
      this.#o.timers,
      () => void this.#renew(slot),
      delayMs,
    );
  }

  async #renew(slot: Slot<P>): Promise<void> {
    if (slot.state !== "running" || this.checkOverdue(slot)) return;
    const o = this.#o;
    const startedAt = o.monotonicNow();
    const startedAtWall = o.now();
    let leaseUntil: number | false;
    try {
      leaseUntil = await this.#host.renew(slot.lease, o.leaseMs);
    } catch (error) {
      if (this.#host.noteClosed(error)) return;
      this.#host.report(error);
      // The watchdog still guards the deadline; try again soon.
      if (slot.state === "running") {
        this.#scheduleRenewal(
          slot,
          Math.max(1, Math.floor(o.renewIntervalMs / 4)),
        );
      }
      return;
    }
    if (slot.state !== "running" || slot.controller.signal.aborted) return;
    if (leaseUntil === false) {
      if (slot.acknowledged) return;
      this.lose(slot, new LeaseLostError(slot.lease.eventId, slot.lease.fence));
      return;
    }
    slot.lease = { ...slot.lease, leaseUntil };
    // Measured from before the request: the database's deadline is later.
    slot.validUntilMonotonic = startedAt + o.leaseMs;
    slot.validUntilWall = startedAtWall + o.leaseMs;
    this.#armWatchdog(slot);
    this.#scheduleRenewal(slot, o.renewIntervalMs);
  }

  #armWatchdog(slot: Slot<P>): void {
    clearLongTimeout(this.#o.timers, slot.watchdogTimer);
    const delayMs = slot.validUntilMonotonic - this.#o.marginMs -
      this.#o.monotonicNow();
    slot.watchdogTimer = setLongTimeout(this.#o.timers, () => {
      if (slot.state === "running" && !this.checkOverdue(slot)) {
        this.#armWatchdog(slot);
      }
    }, delayMs);
  }
}
