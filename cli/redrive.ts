/**
 * `outbox redrive <db> [event...]` and `outbox retry <db> <event>...`: dead
 * letters back to pending with a fresh attempt count, in one transaction.
 *
 * @module
 */
import { someIds } from "./args.ts";
import {
  type Command,
  type Context,
  stringOption,
  UsageError,
} from "./command.ts";
import { openOutbox } from "./open.ts";
import { QUEUE } from "./options.ts";

export const redrive: Command = {
  name: "redrive",
  synopsis: "<db> [event...]",
  summary:
    "dead letters (these, or all of --queue, or all) back to pending, in one transaction",
  options: { queue: QUEUE },
  run: (context) => redriveEvents(context, "redrive"),
};

export const retry: Command = {
  name: "retry",
  synopsis: "<db> <event>...",
  summary: "the same, for the events named",
  run(context) {
    someIds(context, "retry");
    return redriveEvents(context, "retry");
  },
};

async function redriveEvents(context: Context, command: string) {
  const queue = stringOption(context, "queue");
  const ids = context.rest.length === 0 ? undefined : someIds(context, command);
  if (ids !== undefined && queue !== undefined) {
    throw new UsageError(`${command} takes event ids or --queue, not both`);
  }
  await using outbox = await openOutbox(context);
  const redriven = await outbox.redrive(
    ids !== undefined ? { ids } : queue === undefined ? {} : { queue },
  );
  context.out(
    context.json
      ? JSON.stringify({ redriven })
      : `redrove ${redriven} dead letters`,
  );
}
