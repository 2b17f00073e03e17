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
 * The loop's parts live in `worker/`: its public shapes (`types.ts`), its
 * options (`options.ts`), its state machines (`states.ts`) and the
 * {@linkcode Processor} (`processor.ts`). docs/processing-loop.md tells how
 * it batches its writes.
 *
 * @module
 */
import { Processor } from "./worker/processor.ts";
import type {
  Handler,
  ProcessableOutbox,
  ProcessOptions,
} from "./worker/types.ts";

export { Processor } from "./worker/processor.ts";
export type {
  Handler,
  HandlerContext,
  ProcessableOutbox,
  ProcessOptions,
  ProcessorCounters,
  Timers,
} from "./worker/types.ts";

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
