/**
 * `outbox list <db> <state>`: the events in a state, by id, a page at a
 * time, each with its enqueue time and the start of its payload.
 *
 * @module
 */
import type { EventInfo } from "../admin.ts";
import { MAX_BATCH } from "../lease.ts";
import { count } from "./args.ts";
import {
  type Command,
  flagOption,
  stringOption,
  UsageError,
} from "./command.ts";
import { clip, payloadText, relative, table } from "./format.ts";
import { openReader } from "./open.ts";
import { FULL, QUEUE } from "./options.ts";

/** How much of a payload a row shows without `--full`. */
const PAYLOAD_CHARS = 40;
const STATES = ["pending", "leased", "dead", "done"] as const;

export const list: Command = {
  name: "list",
  synopsis: "<db> <state>",
  summary:
    "events in a state (pending, leased, dead, done), by id: when enqueued, the payload's start",
  options: {
    queue: QUEUE,
    limit: {
      type: "string",
      value: "<n>",
      help: "events per page (default 100)",
    },
    after: {
      type: "string",
      value: "<id>",
      help: "the page after this event id",
    },
    full: FULL,
  },
  async run(context) {
    const [state, ...extra] = context.rest;
    if (!STATES.includes(state as typeof STATES[number])) {
      throw new UsageError(
        `list needs a state (pending, leased, dead or done): got ${
          state === undefined ? "none" : JSON.stringify(state)
        }`,
      );
    }
    const listed = state as typeof STATES[number];
    if (extra.length > 0) {
      throw new UsageError(`unexpected ${extra.join(" ")}`);
    }
    const limitText = stringOption(context, "limit");
    const afterText = stringOption(context, "after");
    const queue = stringOption(context, "queue");
    const limit = limitText === undefined
      ? 100
      : count("--limit", limitText, 1);
    const afterId = afterText === undefined
      ? 0
      : count("--after", afterText, 0);
    await using reader = await openReader(context);
    const [rows, total, now] = await reader.snapshot(async () => {
      // One more than the page, to know whether another page follows.
      const rows = await reader.list({
        state: listed,
        limit: Math.min(limit + 1, MAX_BATCH),
        afterId,
        ...(queue === undefined ? {} : { queue }),
      });
      const total = (await reader.queues())
        .filter((q) => queue === undefined || q.queue === queue)
        .reduce((sum, q) => sum + q[listed], 0);
      return [rows, total, await reader.databaseNow()] as const;
    });
    const events = rows.slice(0, limit);
    // A full page of the largest size may or may not have a next one.
    const next = rows.length > limit ||
        (limit >= MAX_BATCH && events.length === limit)
      ? events.at(-1)!.id
      : null;
    if (context.json) {
      context.out(JSON.stringify({ state: listed, events, next, total }));
      return;
    }
    const at = now ?? context.now();
    const payloadChars = flagOption(context, "full") ? Infinity : PAYLOAD_CHARS;
    context.out(table(
      context.color,
      [
        "id",
        "identity",
        "queue",
        "attempt",
        "enqueued",
        listed === "leased"
          ? "lease until"
          : listed === "pending"
          ? "due"
          : "since",
        "payload",
        "last error",
      ],
      events.map((event: EventInfo) => [
        event.id,
        event.identity,
        event.queue,
        `${event.attempt}/${event.maxAttempts}`,
        relative(event.createdAt, at),
        relative(
          listed === "dead" || listed === "done"
            ? event.updatedAt
            : event.dueAt,
          at,
        ),
        payloadText(event.payload, payloadChars),
        clip(event.lastError ?? "-", 60),
      ]),
      [0],
    ));
    context.out(
      `showing ${events.length} of ${total} ${listed}${
        afterId > 0 ? ` after id ${afterId}` : ""
      }${next === null ? "" : `; next page: --after ${next}`}`,
    );
  },
};
