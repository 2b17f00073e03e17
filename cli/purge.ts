/**
 * `outbox purge <db> --older-than <d>`: deletes done events and dead
 * letters older than an age, 1,000 per transaction.
 *
 * @module
 */
import { duration, noArguments } from "./args.ts";
import {
  type Command,
  stringOption,
  stringsOption,
  UsageError,
} from "./command.ts";
import { message } from "./format.ts";
import { openOutbox } from "./open.ts";

export const purge: Command = {
  name: "purge",
  synopsis: "<db> --older-than <d>",
  summary:
    "delete done events and dead letters older than d, 1,000 per transaction (run it again to finish one that failed)",
  options: {
    "older-than": {
      type: "string",
      value: "<d>",
      help: "age, like 500ms, 30s, 15m, 12h, 7d or 1h30m",
    },
    state: {
      type: "string",
      multiple: true,
      value: "<s,...>",
      help: "states to delete (done, dead; default both)",
    },
  },
  async run(context) {
    noArguments(context, "purge");
    const olderThan = stringOption(context, "older-than");
    if (olderThan === undefined) {
      throw new UsageError("purge needs --older-than");
    }
    const olderThanMs = duration("--older-than", olderThan);
    const states = (stringsOption(context, "state") ?? ["done,dead"]).flatMap(
      (s) => s.split(","),
    );
    for (const state of states) {
      if (state !== "done" && state !== "dead") {
        throw new UsageError(
          `--state must be done or dead: got ${JSON.stringify(state)}`,
        );
      }
    }
    await using outbox = await openOutbox(context);
    const purged = await outbox.purge({
      olderThanMs,
      states: states as ("done" | "dead")[],
    }).catch((error) => {
      throw new Error(
        `purge stopped: ${
          message(error)
        }; batches deleted before stay deleted, and running it again finishes`,
        { cause: error },
      );
    });
    context.out(
      context.json
        ? JSON.stringify({ purged })
        : `purged ${purged} events (${
          states.join(", ")
        }) older than ${olderThan}`,
    );
  },
};
