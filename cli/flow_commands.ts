/**
 * `outbox pause|resume <db> <queue>`, `outbox limits <db> <queue>
 * [--per-key N|none] [--per-second N|none]` and `outbox schedules <db>`:
 * the flow-control commands (their work is in cli/flow.ts), as entries of
 * the command table.
 *
 * @module
 */
import {
  type Command,
  type Context,
  flagOption,
  stringOption,
} from "./command.ts";
import {
  type FlowContext,
  limitsCommand,
  pauseCommand,
  schedulesCommand,
} from "./flow.ts";
import { table } from "./format.ts";
import { openOutbox } from "./open.ts";

/** What the flow commands take of a command line. */
function flowContext(context: Context): FlowContext {
  return {
    rest: context.rest,
    json: context.json || flagOption(context, "json"),
    perKey: stringOption(context, "per-key"),
    perSecond: stringOption(context, "per-second"),
    out: context.out,
    open: () => openOutbox(context),
    table: (headers, rows) => table(context.color, headers, rows, []),
  };
}

export const pause: Command = {
  name: "pause",
  synopsis: "<db> <queue>",
  summary:
    "stop claims from a queue (held leases run on) until resume, in every process",
  run: (context) => pauseCommand(flowContext(context), true),
};

export const resume: Command = {
  name: "resume",
  synopsis: "<db> <queue>",
  summary: "let claims take a paused queue's events again",
  run: (context) => pauseCommand(flowContext(context), false),
};

export const limits: Command = {
  name: "limits",
  synopsis: "<db> <queue>",
  summary:
    "a queue's limits; with --per-key N and --per-second N (none clears one) sets them first",
  options: {
    "per-key": {
      type: "string",
      value: "<n|none>",
      help: "most events of one concurrency key leased at once",
    },
    "per-second": {
      type: "string",
      value: "<n|none>",
      help: "most claims a second from the queue",
    },
  },
  run: (context) => limitsCommand(flowContext(context)),
};

export const schedules: Command = {
  name: "schedules",
  synopsis: "<db>",
  summary: "the cron schedules: expression, time zone, queue, next tick",
  run: (context) => schedulesCommand(flowContext(context)),
};
