/**
 * Cron schedules stored in the database: each enqueues one event per tick,
 * however many processes run them, since a tick's event carries the dedup
 * key `schedule:<name>:<tick epoch ms>` (a second runner's insert changes
 * nothing) and the schedule's `next_at` moves past it in the same
 * transaction. Cron expressions are parsed by `croner` (5 to 7 fields,
 * seconds optional), time zones are IANA names as `Intl` knows them.
 *
 * @module
 */
import { Cron } from "croner";
import type { Driver, Row } from "../driver.ts";
import { checkName, checkOptions, describe } from "../validate.ts";
import type { FlowStatements } from "./flow.ts";

/**
 * What {@linkcode Outbox.runSchedules} does with the ticks that passed
 * while no runner ran: `"latest"` enqueues only the latest of them (a
 * schedule catching up after downtime fires once); `"all"` enqueues every
 * one, oldest first, at most {@linkcode MAX_TICKS_PER_RUN} a run.
 */
export type MissedTicks = "latest" | "all";

/** The most ticks of one schedule a run enqueues with `missed: "all"`. */
export const MAX_TICKS_PER_RUN = 1_000;

/** Options of {@linkcode Outbox.schedule}. */
export interface ScheduleOptions {
  /** The queue the ticks' events go to. @default {OutboxOptions.queue} */
  readonly queue?: string;
  /**
   * The IANA time zone the cron expression is read in (`"Europe/Paris"`),
   * as `Intl` knows it. On the days daylight saving time starts and ends,
   * one minute and one hour (`30 2 * * *`) fire once (a skipped time when
   * its hour ends, a repeated one at its first occurrence), and any other
   * minute or hour field (`*`, a step, a list, a range) fires at the
   * wall-clock times that happen: none skipped, each repeated one twice
   * (croner's rule; docs/flow-control.md shows it). @default {"UTC"}
   */
  readonly timezone?: string;
  /** The missed-tick policy. @default {"latest"} */
  readonly missed?: MissedTicks;
  /** The events' priority, as {@linkcode EnqueueOptions.priority}. */
  readonly priority?: number;
  /** The events' concurrency key, as {@linkcode EnqueueOptions.concurrencyKey}. */
  readonly concurrencyKey?: string;
  /** The events' ordering key, as {@linkcode EnqueueOptions.orderingKey}. */
  readonly orderingKey?: string;
  /** The events' attempts, as {@linkcode EnqueueOptions.maxAttempts}. */
  readonly maxAttempts?: number;
}

/** A stored schedule, as {@linkcode Outbox.schedules} lists it. */
export interface Schedule {
  /** Its name, unique in the database. */
  readonly name: string;
  /** Its cron expression. */
  readonly cron: string;
  /** The time zone it is read in. */
  readonly timezone: string;
  /** The queue its events go to. */
  readonly queue: string;
  /** The payload each tick enqueues. */
  readonly payload: unknown;
  /** The missed-tick policy. */
  readonly missed: MissedTicks;
  /** The next tick to enqueue, epoch milliseconds (`null`: none ever). */
  readonly nextAt: number | null;
  /** The latest tick enqueued, epoch milliseconds, or `null`. */
  readonly lastAt: number | null;
  /** The events' options (priority, keys, attempts) as given. */
  readonly options: Readonly<Record<string, unknown>>;
}

/** The options `schedule` accepts. @ignore */
export const SCHEDULE_OPTIONS: readonly string[] = [
  "queue",
  "timezone",
  "missed",
  "priority",
  "concurrencyKey",
  "orderingKey",
  "maxAttempts",
];

/** A tick never comes: stored as `next_at`, past every clock. */
const NEVER = Number.MAX_SAFE_INTEGER;

/**
 * Validates a schedule's name, cron expression, time zone and policy
 * (the events' options are `enqueue`'s to check), and returns its parsed
 * cron. `at` is the lease clock's reading when it needs no SQL (`null`
 * for the database's clock: the expression is then checked against it in
 * the transaction that stores it, by {@linkcode saveSchedule}).
 *
 * @throws {TypeError} When the name is not a valid name, the cron
 * expression is not one croner parses, or an option is unknown.
 * @throws {RangeError} When the time zone is not one `Intl` knows, the
 * expression never fires after `at`, or `missed` is neither policy.
 * @ignore
 */
export function checkSchedule(
  op: string,
  name: unknown,
  cron: unknown,
  options: ScheduleOptions,
  at: number | null,
): { name: string; cron: Cron; timezone: string; missed: MissedTicks } {
  checkOptions(op, options, SCHEDULE_OPTIONS);
  const checkedName = checkName(op, "name", name);
  const timezone = options.timezone === undefined ? "UTC" : options.timezone;
  if (typeof timezone !== "string") {
    throw new TypeError(
      `Cannot ${op} as 'timezone' must be an IANA time zone name: current value is ${
        describe(timezone)
      }`,
    );
  }
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: timezone });
  } catch {
    throw new RangeError(
      `Cannot ${op} as 'timezone' must be an IANA time zone name: current value is ${
        describe(timezone)
      }`,
    );
  }
  const missed = options.missed === undefined ? "latest" : options.missed;
  if (missed !== "latest" && missed !== "all") {
    throw new RangeError(
      `Cannot ${op} as 'missed' must be "latest" or "all": current value is ${
        describe(missed)
      }`,
    );
  }
  if (typeof cron !== "string") {
    throw new TypeError(
      `Cannot ${op} as 'cron' must be a cron expression: current value is ${
        describe(cron)
      }`,
    );
  }
  let parsed: Cron;
  try {
    parsed = new Cron(cron, { timezone, paused: true });
  } catch (error) {
    throw new TypeError(
      `Cannot ${op} as 'cron' must be a cron expression: current value is ${
        describe(cron)
      } (${error instanceof Error ? error.message : String(error)})`,
    );
  }
  firstTick(op, parsed, at ?? 0);
  return { name: checkedName, cron: parsed, timezone, missed };
}

/**
 * The first tick of `cron` after `at` (epoch ms).
 *
 * @throws {RangeError} When there is none: the expression never fires
 * again (a past year, the 30th of February), so a stored schedule would
 * wait forever.
 */
export function firstTick(op: string, cron: Cron, at: number): number {
  const tick = cron.nextRun(new Date(at))?.getTime();
  if (tick === undefined) {
    throw new RangeError(
      `Cannot ${op} as 'cron' must fire after ${
        new Date(at).toISOString()
      }: current value is ${describe(cron.getPattern())}`,
    );
  }
  return tick;
}

/** The first tick after `at` (epoch ms), or {@linkcode NEVER}. */
function nextTick(cron: Cron, at: number): number {
  return cron.nextRun(new Date(at))?.getTime() ?? NEVER;
}

/**
 * Stores (or replaces) a schedule whose first tick is the first after `now`.
 *
 * @throws {RangeError} When there is none (see {@linkcode firstTick}).
 */
export async function saveSchedule(
  driver: Driver,
  sql: FlowStatements,
  schedule: ReturnType<typeof checkSchedule> & {
    queue: string;
    payload: string;
    options: Record<string, unknown>;
  },
  now: number,
): Promise<void> {
  await driver.run(sql.schedule, [
    schedule.name,
    schedule.cron.getPattern() ?? "",
    schedule.timezone,
    schedule.queue,
    schedule.payload,
    JSON.stringify(schedule.options),
    schedule.missed,
    firstTick("schedule", schedule.cron, now),
    now,
  ]);
}

/** Reads a schedule's row. */
export function scheduleOf(row: Row): Schedule {
  const next = Number(row["next_at"]);
  return {
    name: String(row["name"]),
    cron: String(row["cron"]),
    timezone: String(row["timezone"]),
    queue: String(row["queue"]),
    payload: JSON.parse(String(row["payload"])),
    missed: String(row["missed"]) as MissedTicks,
    nextAt: next >= NEVER ? null : next,
    lastAt: row["last_at"] == null ? null : Number(row["last_at"]),
    options: JSON.parse(String(row["options"])),
  };
}

/** One tick's event, for the caller to enqueue with `dedupKey`. */
export interface Tick {
  readonly queue: string;
  /** The payload as stored: JSON text. */
  readonly payload: string;
  readonly dedupKey: string;
  readonly options: Readonly<Record<string, unknown>>;
}

/**
 * Whether any schedule has a tick due at `now` (null: the server's
 * clock), read in one statement: the processing loop's cheap look.
 *
 * @ignore
 */
export async function anyDue(
  driver: Driver,
  sql: FlowStatements,
  now: number | null,
): Promise<{ now: number; due: boolean }> {
  const [row] = await driver.query(sql.anyDue, [now]);
  return { now: Number(row?.["now"]), due: Number(row?.["due"]) === 1 };
}

/**
 * Enqueues, through `enqueue`, the ticks of every schedule due at `now`
 * (per its missed-tick policy), and moves each schedule's `next_at` past
 * `now`, inside the caller's transaction.
 *
 * @param enqueue Enqueues one tick's event; resolves `true` when it
 * inserted one (`false`: its dedup key was taken, by another runner).
 * @returns How many events were enqueued.
 * @ignore
 */
export async function runDue(
  driver: Driver,
  sql: FlowStatements,
  now: number,
  enqueue: (tick: Tick) => Promise<boolean>,
): Promise<number> {
  let enqueued = 0;
  for (const row of await driver.query(sql.due, [now])) {
    const name = String(row["name"]);
    const cron = new Cron(String(row["cron"]), {
      timezone: String(row["timezone"]),
      paused: true,
    });
    const nextAt = Number(row["next_at"]);
    const ticks: number[] = [];
    if (row["missed"] === "all") {
      for (
        let tick = nextAt;
        tick <= now && ticks.length < MAX_TICKS_PER_RUN;
        tick = nextTick(cron, tick)
      ) {
        ticks.push(tick);
      }
    } else {
      const latest = cron.previousRuns(1, new Date(now + 1))[0]?.getTime();
      ticks.push(latest !== undefined && latest >= nextAt ? latest : nextAt);
    }
    const options = JSON.parse(String(row["options"]));
    for (const tick of ticks) {
      const inserted = await enqueue({
        queue: String(row["queue"]),
        payload: String(row["payload"]),
        dedupKey: `schedule:${name}:${tick}`,
        options,
      });
      if (inserted) enqueued++;
    }
    const last = ticks[ticks.length - 1]!;
    await driver.run(sql.advance, [
      name,
      ticks.length === MAX_TICKS_PER_RUN
        ? nextTick(cron, last)
        : nextTick(cron, now),
      last,
      now,
    ]);
  }
  return enqueued;
}
