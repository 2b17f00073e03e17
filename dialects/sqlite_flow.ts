/**
 * SQLite's text of the flow-control and schedule statements
 * (`core/flow.ts`, `core/schedules.ts` run them), and schema version 7's
 * frozen step, which adds what they read and write.
 *
 * @module
 */
import type { FlowStatements } from "../types.ts";
import { MIGRATION_0006 } from "./sqlite/migrations/0006_flow_control.ts";

/**
 * Version 7's step, frozen as shipped (`sqlite/migrations/0006_flow_control.ts`
 * holds its text).
 *
 * @ignore
 */
export const SQLITE_FLOW_STEP: string = MIGRATION_0006;

/** The flow statements on SQLite. */
export const SQLITE_FLOW: FlowStatements = {
  settings: `SELECT paused, per_key, per_second, tokens, refilled_at
    FROM outbox_queues WHERE queue = ?1`,
  allSettings: `SELECT queue, paused, per_key, per_second
    FROM outbox_queues ORDER BY queue`,
  // ?2: 1 paused, 0 running; ?3: now.
  pause: `INSERT INTO outbox_queues (queue, paused, updated_at)
    VALUES (?1, ?2, ?3)
    ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused,
      updated_at = excluded.updated_at`,
  // ?2/?4: 1 when perKey/perSecond is given, ?3/?5 its value (null clears
  // it), ?6 now. A new rate starts with a full bucket.
  limits: `INSERT INTO outbox_queues
      (queue, per_key, per_second, tokens, refilled_at, updated_at)
    VALUES (?1, ?3, ?5, ?5, ?6, ?6)
    ON CONFLICT (queue) DO UPDATE SET
      per_key = CASE WHEN ?2 THEN ?3 ELSE per_key END,
      per_second = CASE WHEN ?4 THEN ?5 ELSE per_second END,
      tokens = CASE WHEN ?4 THEN ?5 ELSE tokens END,
      refilled_at = CASE WHEN ?4 THEN ?6 ELSE refilled_at END,
      updated_at = ?6`,
  // A queue with nothing set keeps no row: a claim then reads none.
  prune: `DELETE FROM outbox_queues
    WHERE queue = ?1 AND paused = 0 AND per_key IS NULL AND per_second IS NULL`,
  // ?2: tokens left, ?3: when.
  take: `UPDATE outbox_queues SET tokens = ?2, refilled_at = ?3
    WHERE queue = ?1`,
  schedule: `INSERT INTO outbox_schedules
      (name, cron, timezone, queue, payload, options, missed, next_at, updated_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron,
      timezone = excluded.timezone, queue = excluded.queue,
      payload = excluded.payload, options = excluded.options,
      missed = excluded.missed, next_at = excluded.next_at,
      updated_at = excluded.updated_at`,
  unschedule: "DELETE FROM outbox_schedules WHERE name = ?1 RETURNING name",
  schedules: `SELECT name, cron, timezone, queue, payload, options, missed,
      next_at, last_at
    FROM outbox_schedules ORDER BY name`,
  // ?1: now. Outside a transaction: the processing loop's cheap look.
  anyDue: `SELECT ?1 AS now,
    EXISTS (SELECT 1 FROM outbox_schedules WHERE next_at <= ?1) AS due`,
  due: `SELECT name, cron, timezone, queue, payload, options, missed,
      next_at, last_at
    FROM outbox_schedules WHERE next_at <= ?1 ORDER BY name`,
  // ?2: the next tick, ?3: the latest tick enqueued, ?4: now.
  advance: `UPDATE outbox_schedules
    SET next_at = ?2, last_at = ?3, updated_at = ?4
    WHERE name = ?1`,
};
