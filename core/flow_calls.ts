/**
 * The flow-control and schedule calls of an {@linkcode Outbox} (`pause`,
 * `resume`, `setLimits`, `limits`, `schedule`, `unschedule`, `schedules`,
 * `runSchedules`), as functions over its {@linkcode OutboxCore}: each
 * checks its arguments before any SQL, then runs the dialect's flow
 * statements (`core/flow.ts`, `core/schedules.ts`) on the outbox's write
 * path. docs/flow-control.md describes what they do.
 *
 * @module
 */
import { BusyError } from "../errors.ts";
import { checkName } from "../validate.ts";
import { prepareEnqueue } from "./arguments.ts";
import type { OutboxCore } from "./context.ts";
import { insertOne } from "./enqueue.ts";
import {
  checkLimits,
  flowOf,
  type QueueFlow,
  queueFlow,
  type QueueLimits,
  setLimits as storeLimits,
  setPaused,
} from "./flow.ts";
import {
  anyDue,
  checkSchedule,
  runDue,
  saveSchedule,
  type Schedule,
  scheduleOf,
  type ScheduleOptions,
} from "./schedules.ts";

/**
 * Pauses (`paused` true) or resumes a queue: from this call's commit on, a
 * claim from a paused queue returns nothing, on every connection and in
 * every process. Leases already held run to their end; enqueues go on.
 * Resuming wakes the enqueue listeners.
 *
 * @throws {TypeError} When `queue` is not a valid name (before any SQL).
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function pause(
  core: OutboxCore,
  queue: string,
  paused: boolean,
): Promise<void> {
  const op = paused ? "pause" : "resume";
  checkName(op, "queue", queue);
  const flow = flowOf(core.sql);
  await core.write(
    op,
    (now) => setPaused(core.driver, flow, queue, paused, now),
    { expire: false },
  );
  if (!paused) core.enqueued();
}

/**
 * Sets a queue's limits (`perKey`, `perSecond`), stored in the database and
 * honoured by every claim from the next one on. A field left out stays as
 * it is; `null` clears it. Wakes the enqueue listeners.
 *
 * @throws {TypeError | RangeError} When `queue` is not a valid name or a
 * limit is not a positive integer or `null`, naming it (before any SQL).
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function setLimits(
  core: OutboxCore,
  queue: string,
  limits: QueueLimits,
): Promise<void> {
  const op = "set limits";
  const checked = checkLimits(op, queue, limits);
  const flow = flowOf(core.sql);
  await core.write(op, (now) => storeLimits(core.driver, flow, checked, now));
  core.enqueued();
}

/**
 * A queue's flow control: whether it is paused, and its limits (`null`: no
 * limit).
 *
 * @throws {TypeError} When `queue` is not a valid name (before any SQL).
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function limits(
  core: OutboxCore,
  queue: string,
): Promise<QueueFlow> {
  const op = "read limits";
  checkName(op, "queue", queue);
  const flow = flowOf(core.sql);
  return await core.write(op, async () => {
    const [row] = await core.driver.query(flow.settings, [queue]);
    return queueFlow(row);
  }, { expire: false });
}

/**
 * Stores a cron schedule (replacing one of the same name): each tick
 * enqueues one event with `payload` when {@linkcode runSchedules} runs,
 * exactly once however many processes run it (its dedup key is
 * `schedule:<name>:<tick epoch ms>`).
 *
 * @throws {TypeError | RangeError} When the name, the cron expression, the
 * time zone, the payload or an option is invalid, naming it (before any
 * SQL).
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function schedule(
  core: OutboxCore,
  name: string,
  cron: string,
  payload: unknown,
  options: ScheduleOptions,
): Promise<void> {
  const op = "schedule";
  const checked = checkSchedule(op, name, cron, options, core.localNow(op));
  const { timezone: _, missed: __, ...enqueueOptions } = options;
  const event = prepareEnqueue(op, payload, enqueueOptions, core);
  if (typeof event.payload !== "string") {
    throw new TypeError(
      "Cannot schedule as 'payload' must be JSON-serializable: bytes cannot be scheduled",
    );
  }
  const { queue: __q, ...stored } = enqueueOptions;
  const flow = flowOf(core.sql);
  await core.write(op, (now) =>
    saveSchedule(core.driver, flow, {
      ...checked,
      queue: event.queue,
      payload: event.payload as string,
      options: stored,
    }, now), { expire: false });
}

/**
 * Removes a schedule; events it enqueued stay. Answers whether there was
 * one.
 *
 * @throws {TypeError} When `name` is not a valid name (before any SQL).
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function unschedule(
  core: OutboxCore,
  name: string,
): Promise<boolean> {
  const op = "unschedule";
  checkName(op, "name", name);
  const flow = flowOf(core.sql);
  return await core.write(
    op,
    async () => (await core.driver.query(flow.unschedule, [name])).length > 0,
    { expire: false },
  );
}

/**
 * The schedules by name, each with its next and latest tick.
 *
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function schedules(core: OutboxCore): Promise<Schedule[]> {
  const flow = flowOf(core.sql);
  return await core.write(
    "list schedules",
    async () => (await core.driver.query(flow.schedules)).map(scheduleOf),
    { expire: false },
  );
}

/**
 * Enqueues the ticks of every schedule that have come due by the outbox's
 * clock, each once however many processes call this, and moves each
 * schedule past now. A look that takes no write lock comes first, so
 * calling it often costs one read while nothing is due. Answers how many
 * events this call enqueued.
 *
 * @throws {BusyError} When the database stays locked past `busyTimeoutMs`.
 */
export async function runSchedules(core: OutboxCore): Promise<number> {
  const op = "run schedules";
  const flow = flowOf(core.sql);
  const look = (now: number | null) => anyDue(core.driver, flow, now);
  const { due } = await core.write(op, look, {
    expire: false,
    inOne: (now) =>
      look(now).catch((error) => {
        if (error instanceof BusyError) return undefined;
        throw error;
      }),
  });
  if (!due) return 0;
  const n = await core.write(
    op,
    (now) =>
      runDue(core.driver, flow, now, async (tick) => {
        const event = prepareEnqueue(op, null, {
          ...tick.options,
          queue: tick.queue,
          dedupKey: tick.dedupKey,
        }, core);
        const result = await insertOne(
          core.driver,
          core.sql,
          { ...event, payload: tick.payload },
          now,
        );
        return !result.deduplicated;
      }),
    { expire: false },
  );
  if (n > 0) core.enqueued();
  return n;
}
