/**
 * Reading the command line's values: counts, durations, event ids. Each
 * refusal is a {@linkcode UsageError} that names the argument.
 *
 * @module
 */
import { MAX_BATCH } from "../lease.ts";
import { type Context, UsageError } from "./command.ts";

const UNITS: Record<string, number> = {
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
};

/** Refuses any argument after the database. */
export function noArguments(context: Context, command: string): void {
  if (context.rest.length > 0) {
    throw new UsageError(
      `${command} takes no argument after the database: got ${
        context.rest.join(" ")
      }`,
    );
  }
}

/** The event ids after the database: at least one, at most `MAX_BATCH`. */
export function someIds(context: Context, command: string): number[] {
  if (context.rest.length === 0) {
    throw new UsageError(`${command} needs an event id`);
  }
  if (context.rest.length > MAX_BATCH) {
    throw new UsageError(
      `${command} takes at most ${MAX_BATCH} event ids: got ${context.rest.length}`,
    );
  }
  return context.rest.map((id) => count("event id", id, 1));
}

/** A whole number written in digits, at least `min`. */
export function count(name: string, text: string, min: number): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n < min) {
    throw new UsageError(
      `${name} must be an integer of at least ${min}: got ${
        JSON.stringify(text)
      }`,
    );
  }
  return n;
}

/**
 * `500ms`, `30s`, `15m`, `12h`, `7d`, or several together (`1h30m`), in
 * milliseconds, from `min` to `max`.
 */
export function duration(
  name: string,
  text: string,
  { min = 0, max = Number.MAX_SAFE_INTEGER } = {},
): number {
  const parts = [...text.matchAll(/(\d+)(ms|s|m|h|d)/g)];
  if (parts.length === 0 || parts.map((p) => p[0]).join("") !== text) {
    throw new UsageError(
      `${name} must be a duration like 500ms, 30s, 15m, 12h, 7d or 1h30m: got ${
        JSON.stringify(text)
      }`,
    );
  }
  const ms = parts.reduce(
    (sum, [, n, unit]) => sum + Number(n) * UNITS[unit!]!,
    0,
  );
  if (!Number.isSafeInteger(ms) || ms > max) {
    throw new UsageError(
      `${name} must be at most ${spelled(max)}: got ${JSON.stringify(text)}`,
    );
  }
  if (ms < min) {
    throw new UsageError(
      `${name} must be at least ${spelled(min)}: got ${JSON.stringify(text)}`,
    );
  }
  return ms;
}

/** A duration as {@linkcode duration} reads it, in its largest exact unit. */
function spelled(ms: number): string {
  const [unit, size] = Object.entries(UNITS).findLast(([, size]) =>
    ms % size === 0
  )!;
  return `${ms / size}${unit}`;
}
