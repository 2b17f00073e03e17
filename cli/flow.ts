/**
 * The `outbox` tool's flow-control commands (issue 40): `pause` and
 * `resume <db> <queue>`, `limits <db> <queue> [--per-key N|none]
 * [--per-second N|none]`, `schedules <db>`; and the note `stats` adds to a
 * queue with flow control. Each takes what it needs of the command line
 * as a {@linkcode FlowContext}, so any command table can call it.
 *
 * @module
 */
import type { Outbox } from "../lease.ts";
import type { QueueCounts } from "../admin.ts";
import { describe } from "../validate.ts";

/** What a flow command needs of the command line. */
export interface FlowContext {
  /** The arguments after the database. */
  readonly rest: readonly string[];
  /** `--json`. */
  readonly json: boolean;
  /** `--per-key` and `--per-second` as given. */
  readonly perKey?: string | undefined;
  readonly perSecond?: string | undefined;
  readonly out: (line: string) => void;
  /** Opens the database's outbox for writing. */
  open(): Promise<Outbox>;
  /** Lays out rows under headers, as the tool's other tables. */
  table(headers: string[], rows: (string | number)[][]): string;
}

/** The usage lines of the flow commands. */
export const FLOW_USAGE =
  `  pause <db> <queue>           stop claims from a queue (held leases run on) until resume
  resume <db> <queue>          let claims take a paused queue's events again
  limits <db> <queue>          a queue's limits; with --per-key N and --per-second N (none
                               clears one) sets them first
  schedules <db>               the cron schedules, their next and latest ticks`;

/** The usage lines of the flow options. */
export const FLOW_OPTIONS_USAGE =
  `  --per-key <n|none>     limits: most leases of one concurrency key at once
  --per-second <n|none>  limits: most claims a second from the queue`;

function queueArgument(context: FlowContext, command: string): string {
  const [queue, ...extra] = context.rest;
  if (queue === undefined || extra.length > 0) {
    throw new TypeError(
      `${command} takes one queue after the database: got ${
        context.rest.length === 0 ? "none" : context.rest.join(" ")
      }`,
    );
  }
  return queue;
}

/** `pause` (paused true) and `resume` (false). */
export async function pauseCommand(
  context: FlowContext,
  paused: boolean,
): Promise<void> {
  const command = paused ? "pause" : "resume";
  const queue = queueArgument(context, command);
  await using outbox = await context.open();
  await (paused ? outbox.pause(queue) : outbox.resume(queue));
  context.out(
    context.json
      ? JSON.stringify({ queue, paused })
      : `${paused ? "paused" : "resumed"} queue ${queue}`,
  );
}

/** `--per-key` or `--per-second`: a positive integer, or `none` (null). */
function limitOption(
  name: string,
  text: string | undefined,
): number | null | undefined {
  if (text === undefined) return undefined;
  if (text === "none") return null;
  if (!/^\d+$/.test(text)) {
    throw new TypeError(
      `--${name} must be a positive integer or none: got ${describe(text)}`,
    );
  }
  return Number(text);
}

/** `limits`: sets the limits given, then prints the queue's flow control. */
export async function limitsCommand(context: FlowContext): Promise<void> {
  const queue = queueArgument(context, "limits");
  const perKey = limitOption("per-key", context.perKey);
  const perSecond = limitOption("per-second", context.perSecond);
  await using outbox = await context.open();
  if (perKey !== undefined || perSecond !== undefined) {
    await outbox.setLimits(queue, {
      ...perKey === undefined ? {} : { perKey },
      ...perSecond === undefined ? {} : { perSecond },
    });
  }
  const flow = await outbox.limits(queue);
  context.out(
    context.json ? JSON.stringify({ queue, ...flow }) : `queue ${queue}: ${
      [
        flow.paused ? "paused" : "running",
        `per key ${flow.perKey ?? "unlimited"}`,
        `per second ${flow.perSecond ?? "unlimited"}`,
      ].join(", ")
    }`,
  );
}

/** `schedules`: every schedule, its next and latest tick. */
export async function schedulesCommand(context: FlowContext): Promise<void> {
  if (context.rest.length > 0) {
    throw new TypeError(
      `schedules takes no argument after the database: got ${
        context.rest.join(" ")
      }`,
    );
  }
  await using outbox = await context.open();
  const schedules = await outbox.schedules();
  if (context.json) {
    context.out(JSON.stringify(schedules));
    return;
  }
  const at = (ms: number | null) =>
    ms === null ? "-" : new Date(ms).toISOString();
  context.out(context.table(
    ["name", "cron", "timezone", "queue", "next tick", "latest tick"],
    schedules.map((s) => [
      s.name,
      s.cron,
      s.timezone,
      s.queue,
      at(s.nextAt),
      at(s.lastAt),
    ]),
  ));
}

/**
 * What `stats` shows of a queue's flow control: `paused`, `N per key`,
 * `N/s`, joined; `-` for none.
 */
export function flowNote(
  queue: Pick<QueueCounts, "paused" | "perKey" | "perSecond">,
): string {
  const notes = [
    ...queue.paused ? ["paused"] : [],
    ...queue.perKey === undefined ? [] : [`${queue.perKey} per key`],
    ...queue.perSecond === undefined ? [] : [`${queue.perSecond}/s`],
  ];
  return notes.length === 0 ? "-" : notes.join(", ");
}
