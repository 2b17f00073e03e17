/**
 * A handler's `context.transaction(fn)`: the handler's writes and the
 * acknowledgement of its lease in one transaction, so they commit together
 * or not at all. At most one per handler: a second would find the lease
 * acknowledged by the first.
 *
 * @module
 */
import type { Transaction } from "../lease.ts";
import { LeaseLostError } from "../errors.ts";
import type { CounterName } from "../telemetry.ts";
import type { LeaseKeeper, Slot } from "./lease_keeper.ts";
import type { ProcessableOutbox } from "./types.ts";
import { isInstance } from "../validate.ts";

/** What a handler's transaction needs of the processor. */
export interface TransactionHost<P> {
  readonly outbox: ProcessableOutbox<P>;
  readonly keeper: LeaseKeeper<P>;
  /** Counts for the processor's counters and OpenTelemetry. */
  count(slot: Slot<P>, name: Exclude<CounterName, "claimed">): void;
  /** Whether `error` means the outbox can write no more (then the loop stops). */
  noteClosed(error: unknown): boolean;
}

/**
 * Runs `fn` and acknowledges `slot`'s lease in one transaction of the
 * outbox, counting the lease acknowledged when it commits.
 *
 * @returns What `fn` returned.
 * @throws {TypeError} When the outbox runs no transactions (the browser's
 *   shared outbox forwards single calls only).
 * @throws {Error} When the handler ran one already, or one is running.
 * @throws {LeaseLostError} When the lease was taken by another worker: the
 *   handler's signal aborts, and nothing of `fn` is committed.
 */
export async function handlerTransaction<P, T>(
  host: TransactionHost<P>,
  slot: Slot<P>,
  fn: (tx: Transaction) => Promise<T>,
): Promise<T> {
  const outbox = host.outbox;
  if (outbox.transaction === undefined) {
    throw new TypeError(
      "Cannot run transaction as this outbox has none (the browser's shared outbox forwards single calls only)",
    );
  }
  // A second transaction would find the lease acknowledged by the first:
  // refused here, rather than taken for a lease another worker took.
  if (slot.transaction !== "none") {
    const { eventId, fence } = slot.lease;
    throw new Error(
      slot.transaction === "committed"
        ? `Cannot run context.transaction as this handler's first transaction acknowledged its lease already (event ${eventId}, fence ${fence}): its writes committed with it; make all of a handler's writes in one transaction`
        : `Cannot run context.transaction as this handler's transaction is still running (event ${eventId}, fence ${fence}): await it; a handler's writes go in one transaction`,
    );
  }
  slot.transaction = "running";
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
    slot.transaction = "none";
    if (isInstance(error, LeaseLostError)) {
      host.count(slot, "staleAcknowledgements");
      // Its current holder owns the event: no acknowledgement, no release.
      if (slot.state === "running") host.keeper.finish(slot);
      host.keeper.lose(slot, error);
    } else {
      host.noteClosed(error);
    }
    throw error;
  }
  slot.transaction = "committed";
  host.count(slot, "acknowledged");
  if (slot.state === "running") host.keeper.finish(slot);
  return result;
}
