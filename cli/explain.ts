/**
 * `outbox explain <db> <event>`: one event, by id or identity: its state,
 * when it was enqueued, its payload, and its ledger's timeline.
 *
 * @module
 */
import type { Explanation } from "../lease.ts";
import { isIdentity } from "../identity.ts";
import { count } from "./args.ts";
import { type Command, flagOption, UsageError } from "./command.ts";
import {
  age,
  clip,
  isoTime,
  payloadText,
  printable,
  relative,
  table,
} from "./format.ts";
import { openReader } from "./open.ts";
import { FULL } from "./options.ts";

/** How much of the payload is shown without `--full`. */
const PAYLOAD_CHARS = 200;

export const explain: Command = {
  name: "explain",
  synopsis: "<db> <event>",
  summary:
    "one event (id or identity): its state, enqueue time, payload and ledger timeline",
  options: { full: FULL },
  async run(context) {
    const [key, ...extra] = context.rest;
    if (key === undefined) {
      throw new UsageError("explain needs an event id or identity");
    }
    if (extra.length > 0) throw new UsageError("explain takes one event");
    // Digits are an id; anything else must be an identity.
    if (!/^\d+$/.test(key) && !isIdentity(key)) {
      throw new UsageError(
        `explain needs an event id (decimal digits) or identity (a UUID in canonical lowercase text): got ${
          JSON.stringify(key)
        }`,
      );
    }
    const eventKey = /^\d+$/.test(key) ? count("event id", key, 1) : key;
    await using reader = await openReader(context);
    const found = await reader.snapshot(async () => {
      const event = await reader.explain(eventKey);
      if (event === null) return null;
      // The listing of its state from just before its id holds its payload
      // and enqueue time, in the same snapshot.
      const [info] = await reader.list({
        state: event.state,
        afterId: event.eventId - 1,
        limit: 1,
      });
      return {
        ...event,
        createdAt: info?.id === event.eventId ? info.createdAt : null,
        payload: info?.id === event.eventId ? info.payload : null,
        now: await reader.databaseNow(),
      };
    });
    if (found === null) throw new Error(`no event ${key}`);
    const { now, ...event } = found;
    if (context.json) {
      context.out(JSON.stringify(event));
      return;
    }
    context.out(describeEvent(event));
    if (event.createdAt !== null) {
      context.out(
        `enqueued ${isoTime(event.createdAt)} (${
          relative(event.createdAt, now ?? context.now())
        })`,
      );
    }
    const payload = payloadText(
      event.payload,
      flagOption(context, "full") ? Infinity : PAYLOAD_CHARS,
    );
    context.out(printable(`payload ${payload}`));
    const start = event.history[0]?.at ?? 0;
    context.out(
      table(
        context.color,
        ["at", "+", "fence", "what", "token", "detail"],
        event.history.map((entry) => [
          isoTime(entry.at),
          age(entry.at - start),
          entry.fence,
          entry.kind,
          entry.token === null ? "-" : clip(entry.token, 10),
          entry.leaseUntil === null
            ? clip(entry.detail ?? "", 60)
            : `lease until ${isoTime(entry.leaseUntil)}`,
        ]),
        [1, 2],
      ),
    );
  },
};

function describeEvent(event: Explanation): string {
  return printable(
    `event ${event.eventId} (${event.identity}) in queue ${event.queue}: ${event.state}, attempt ${event.attempt}/${event.maxAttempts}, fence ${event.fence}${
      event.lastError === null
        ? ""
        : `, last error ${JSON.stringify(event.lastError)}`
    }`,
  );
}
