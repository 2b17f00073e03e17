/**
 * `outbox stats <db>`: counts per queue and state, the oldest pending
 * event's age, and acknowledgements in the last minute; and the summary
 * that `watch` refreshes.
 *
 * @module
 */
import type { QueueCounts } from "../admin.ts";
import type { OutboxReader } from "../reader.ts";
import { noArguments } from "./args.ts";
import { type Command, type Context, stringOption } from "./command.ts";
import { age, printable, table } from "./format.ts";
import { flowNote } from "./flow.ts";
import { openReader, readWal } from "./open.ts";
import { QUEUE } from "./options.ts";

const RATE_WINDOW_MS = 60_000;

/** One queue's line of the summary. */
export interface QueueSummary {
  readonly queue: string;
  readonly pending: number;
  readonly leased: number;
  readonly done: number;
  readonly dead: number;
  readonly oldestPendingAgeMs: number;
  readonly acknowledgedLastMinute: number;
  /** Flow control (`outbox pause`, `outbox limits`), when set. */
  readonly paused?: true;
  readonly perKey?: number;
  readonly perSecond?: number;
}

/**
 * What `stats --json` prints: the totals, when (`at`, ISO 8601), and each
 * queue. Fields added later (a WAL's size) are printed by the table too.
 */
export interface Summary extends Omit<QueueSummary, "queue"> {
  readonly at: string;
  readonly queues: QueueSummary[];
  readonly [extra: string]: unknown;
}

/** The summary's own fields; any other is printed below the table. */
const FIELDS = new Set([
  "at",
  "queues",
  "pending",
  "leased",
  "done",
  "dead",
  "oldestPendingAgeMs",
  "acknowledgedLastMinute",
]);

export const stats: Command = {
  name: "stats",
  synopsis: "<db>",
  summary:
    "counts per queue and state, oldest pending, acks in the last minute",
  options: { queue: QUEUE },
  async run(context) {
    noArguments(context, "stats");
    await using reader = await openReader(context);
    const summary = await readSummary(reader, context);
    const wal = await readWal(context);
    context.out(
      context.json ? JSON.stringify({ ...summary, wal }) : [
        summaryText(context, summary),
        ...(wal === null ? [] : [
          `WAL ${wal.sizeBytes} bytes${
            wal.checkpointHeldBack ? ", checkpoints held back by a reader" : ""
          }`,
        ]),
      ].join("\n"),
    );
  },
};

/** The table of a summary, then a `name: value` line per extra field. */
export function summaryText(context: Context, summary: Summary): string {
  // A queue paused or limited adds a column (cli/flow.ts's note).
  const flow = summary.queues.some((q) => flowNote(q) !== "-");
  const extras = Object.entries(summary).filter(([key, value]) =>
    !FIELDS.has(key) && value !== undefined
  ).map(([key, value]) =>
    printable(
      `${key}: ${typeof value === "string" ? value : JSON.stringify(value)}`,
    )
  );
  return [
    table(
      context.color,
      [
        "queue",
        "pending",
        "leased",
        "done",
        "dead",
        "oldest pending",
        "acks last 60 s",
        ...flow ? ["flow"] : [],
      ],
      [...summary.queues, { ...summary, queue: "total" }].map((q) => [
        q.queue,
        q.pending,
        q.leased,
        q.done,
        q.dead,
        q.pending === 0 ? "-" : age(q.oldestPendingAgeMs),
        q.acknowledgedLastMinute,
        ...flow ? ["queues" in q ? "" : flowNote(q)] : [],
      ]),
      [1, 2, 3, 4, 6],
    ),
    ...extras,
  ].join("\n");
}

/** Reads the counts in one snapshot, aged by the database's clock. */
export async function readSummary(
  reader: OutboxReader,
  context: Context,
): Promise<Summary> {
  const [now, all, acknowledged] = await reader.snapshot(async () => {
    // PostgreSQL's outboxes judge by the server's clock: ages and the rate's
    // window by the same one, whatever this machine's clock says.
    const now = await reader.databaseNow() ?? context.now();
    return [
      now,
      await reader.queues(),
      await reader.acknowledgedSince(now - RATE_WINDOW_MS),
    ] as const;
  });
  const queue = stringOption(context, "queue");
  const queues = all.filter((q) => queue === undefined || q.queue === queue);
  const rows = queues.map((q: QueueCounts): QueueSummary => ({
    queue: q.queue,
    pending: q.pending,
    leased: q.leased,
    done: q.done,
    dead: q.dead,
    oldestPendingAgeMs: q.oldestPendingAt === null
      ? 0
      : Math.max(0, now - q.oldestPendingAt),
    acknowledgedLastMinute: acknowledged.get(q.queue) ?? 0,
    ...q.paused ? { paused: true as const } : {},
    ...q.perKey === undefined ? {} : { perKey: q.perKey },
    ...q.perSecond === undefined ? {} : { perSecond: q.perSecond },
  }));
  const sum = (key: "pending" | "leased" | "done" | "dead") =>
    rows.reduce((total, row) => total + row[key], 0);
  return {
    at: new Date(now).toISOString(),
    pending: sum("pending"),
    leased: sum("leased"),
    done: sum("done"),
    dead: sum("dead"),
    oldestPendingAgeMs: Math.max(0, ...rows.map((r) => r.oldestPendingAgeMs)),
    acknowledgedLastMinute: rows.reduce(
      (total, r) => total + r.acknowledgedLastMinute,
      0,
    ),
    queues: rows,
  };
}
