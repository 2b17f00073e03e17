/**
 * `outbox cancel <db> <event>...`: the pending ones among the events named
 * become dead letters marked `cancelled`, undelivered, in one transaction
 * (a failure cancels none of them). Only a pending event is cancelled: a
 * leased one is being delivered (its worker would find its acknowledgement
 * refused without knowing why), and a finished one has nothing left to
 * cancel. Each event left alone is reported with its state and why.
 *
 * @module
 */
import type { Outbox } from "../lease.ts";
import { someIds } from "./args.ts";
import type { Command } from "./command.ts";
import { openOutbox } from "./open.ts";

/** An event named but not cancelled, and why. */
interface LeftAlone {
  readonly id: number;
  /** Its state after the cancel, or `missing` when there is no such event. */
  readonly state: string;
  readonly reason: string;
}

export const cancel: Command = {
  name: "cancel",
  synopsis: "<db> <event>...",
  summary:
    'the pending ones among these events to the dead letters ("cancelled"), undelivered, in one transaction (a failure cancels none); any other is left alone, and the output says why for each',
  async run(context) {
    const ids = [...new Set(someIds(context, "cancel"))];
    await using outbox = await openOutbox(context);
    const cancelled = await outbox.cancel(ids);
    const done = new Set(cancelled);
    const leftAlone: LeftAlone[] = [];
    for (const id of ids) {
      if (!done.has(id)) leftAlone.push(await whyLeftAlone(outbox, id));
    }
    if (context.json) {
      context.out(JSON.stringify({ cancelled, leftAlone }));
      return;
    }
    context.out(
      `cancelled ${cancelled.length} of ${ids.length}${
        cancelled.length === 0 ? "" : `: ${cancelled.join(" ")}`
      }`,
    );
    const byReason = Map.groupBy(leftAlone, (event) => event.reason);
    for (const [reason, events] of byReason) {
      context.out(
        `left alone, ${reason}: ${events.map((event) => event.id).join(" ")}`,
      );
    }
  },
};

/**
 * The state of an event that cancel left alone, read after it: it was not
 * pending when cancel ran, or did not exist.
 */
async function whyLeftAlone(outbox: Outbox, id: number): Promise<LeftAlone> {
  const event = await outbox.explain(id);
  if (event === null) return { id, state: "missing", reason: "no such event" };
  const reason = {
    leased:
      "being delivered by a worker (leased; cancel it again if it comes back to pending)",
    done: "already delivered (done)",
    dead: event.lastError === "cancelled"
      ? "already cancelled (dead)"
      : "already a dead letter (dead)",
    pending: "pending again (it was leased when cancel ran; run cancel again)",
  }[event.state];
  return { id, state: event.state, reason };
}
