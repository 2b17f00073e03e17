/**
 * The processing loop's options, checked once at start, its long timers and
 * the error text an event keeps.
 *
 * @module
 */
import {
  type Clock,
  type Lease,
  MAX_BATCH,
  MAX_DURATION_MS,
} from "../lease.ts";
import {
  checkBoolean,
  checkFunction,
  checkInteger,
  checkName,
  checkOptions,
  checkSignal,
  describe,
  missing,
} from "../validate.ts";
import type { ProcessableOutbox, ProcessOptions, Timers } from "./types.ts";

/** The operation named in the loop's argument errors. */
export const OP = "process events";

const PROCESS_OPTIONS = [
  "signal",
  "queue",
  "concurrency",
  "prefetch",
  "leaseMs",
  "renewIntervalMs",
  "marginMs",
  "pollMinMs",
  "pollMaxMs",
  "backoffMinMs",
  "backoffMaxMs",
  "backoffMultiplier",
  "backoffJitter",
  "stopTimeoutMs",
  "handlerTimeoutMs",
  "onHandlerError",
  "now",
  "monotonicNow",
  "timers",
  "random",
  "onError",
];

const immediate = (globalThis as {
  setImmediate?: (callback: () => void) => unknown;
}).setImmediate;

/** The runtime's timers, with `setImmediate` where it has one. */
const DEFAULT_TIMERS: Timers = {
  setTimeout: (callback, delayMs) => setTimeout(callback, delayMs),
  clearTimeout: (handle) => clearTimeout(handle as number),
  ...(immediate === undefined
    ? {}
    : { setImmediate: (callback: () => void) => void immediate(callback) }),
};

/** Every option of {@linkcode ProcessOptions} checked, with its default filled in. */
export interface Settings {
  readonly queue: string | undefined;
  readonly concurrency: number;
  /** Leases claimed ahead of free handler slots: `concurrency`, or 0. */
  readonly prefetch: number;
  readonly leaseMs: number;
  readonly renewIntervalMs: number;
  readonly marginMs: number;
  readonly pollMinMs: number;
  readonly pollMaxMs: number;
  readonly backoffMinMs: number;
  readonly backoffMaxMs: number;
  readonly backoffMultiplier: number;
  readonly backoffJitter: number;
  readonly stopTimeoutMs: number;
  readonly handlerTimeoutMs: number | undefined;
  readonly now: Clock;
  readonly monotonicNow: () => number;
  readonly timers: Timers;
  readonly random: () => number;
  readonly onError: (error: unknown) => void;
  readonly onHandlerError:
    | ((error: unknown, lease: Lease<unknown>) => void)
    | undefined;
  readonly signal: AbortSignal | undefined;
}

/**
 * Checks the arguments of `processEvents` and fills in every default.
 *
 * @param outbox The outbox to claim from (its `leaseMs` is the default).
 * @param handler Checked to be a function.
 * @param options The caller's options.
 * @returns The settings the loop runs with.
 * @throws {TypeError | RangeError} When an argument or option is invalid,
 * naming it.
 */
export function settingsOf(
  outbox: ProcessableOutbox<unknown>,
  handler: unknown,
  options: ProcessOptions,
): Settings {
  if (outbox === null || typeof outbox !== "object") {
    throw new TypeError(
      `Cannot ${OP} as 'outbox' must be an outbox: current value is ${
        outbox === null ? "null" : typeof outbox
      }`,
    );
  }
  // Checked before the processor subscribes to anything or claims.
  for (const method of OUTBOX_METHODS) {
    if (
      typeof (outbox as unknown as Record<string, unknown>)[method] !==
        "function"
    ) {
      throw new TypeError(
        `Cannot ${OP} as 'outbox' must be an outbox: its '${method}' is not a function`,
      );
    }
  }
  checkFunction(OP, "handler", handler);
  checkOptions(OP, options, PROCESS_OPTIONS);
  const integer = (field: keyof ProcessOptions, min: number, max: number) =>
    checkInteger(OP, field, options[field], min, max);
  const queue = options.queue === undefined
    ? undefined
    : checkName(OP, "queue", options.queue);
  const concurrency = integer("concurrency", 1, MAX_BATCH) ?? 1;
  // null is refused as for every other option, not taken for the default;
  // the outbox's own leaseMs is checked too (an outbox of the application's
  // making may have none).
  const leaseMs = integer("leaseMs", 3, MAX_DURATION_MS) ??
    checkInteger(OP, "outbox.leaseMs", outbox.leaseMs, 3, MAX_DURATION_MS) ??
    missing(OP, "outbox.leaseMs");
  const renewIntervalMs = integer("renewIntervalMs", 1, MAX_DURATION_MS) ??
    Math.floor(leaseMs / 3);
  const marginMs = integer("marginMs", 0, MAX_DURATION_MS) ??
    Math.floor(leaseMs / 5);
  if (renewIntervalMs + marginMs >= leaseMs) {
    throw new RangeError(
      `Cannot ${OP} as 'renewIntervalMs' + 'marginMs' must be below 'leaseMs' (${leaseMs}): current value is ${
        renewIntervalMs + marginMs
      }`,
    );
  }
  const pollMinMs = integer("pollMinMs", 1, MAX_DURATION_MS) ?? 100;
  const pollMaxMs = integer("pollMaxMs", pollMinMs, MAX_DURATION_MS) ??
    Math.max(5_000, pollMinMs);
  const backoffMinMs = integer("backoffMinMs", 0, MAX_DURATION_MS) ?? 1_000;
  const backoffMaxMs = integer("backoffMaxMs", backoffMinMs, MAX_DURATION_MS) ??
    Math.max(60_000, backoffMinMs);
  const prefetch = checkBoolean(OP, "prefetch", options.prefetch, true)
    ? concurrency
    : 0;
  return {
    queue,
    concurrency,
    prefetch,
    leaseMs,
    renewIntervalMs,
    marginMs,
    pollMinMs,
    pollMaxMs,
    backoffMinMs,
    backoffMaxMs,
    backoffMultiplier: real(
      "backoffMultiplier",
      options.backoffMultiplier,
      1,
      Infinity,
      2,
    ),
    backoffJitter: real("backoffJitter", options.backoffJitter, 0, 1, 1),
    stopTimeoutMs: integer("stopTimeoutMs", 0, MAX_DURATION_MS) ?? 10_000,
    handlerTimeoutMs: integer("handlerTimeoutMs", 1, MAX_DURATION_MS),
    now: fn("now", options.now) ?? Date.now,
    monotonicNow: fn("monotonicNow", options.monotonicNow) ??
      (() => performance.now()),
    random: fn("random", options.random) ?? Math.random,
    onError: fn("onError", options.onError) ?? console.error,
    onHandlerError: fn("onHandlerError", options.onHandlerError),
    timers: timersOf(options.timers),
    signal: checkSignal(OP, "signal", options.signal),
  };
}

// What the processor calls on its outbox (the optional ones checked where
// they are called).
const OUTBOX_METHODS = [
  "claim",
  "acknowledge",
  "renew",
  "release",
  "stats",
  "explain",
  "nextDueInMs",
  "onEnqueue",
] as const;

function timersOf(timers: unknown): Timers {
  if (timers === undefined) return DEFAULT_TIMERS;
  if (timers === null || typeof timers !== "object") {
    throw new TypeError(
      `Cannot ${OP} as 'timers' must be an object of setTimeout and clearTimeout: current value is ${
        describe(timers)
      }`,
    );
  }
  const given = timers as Record<string, unknown>;
  for (const method of ["setTimeout", "clearTimeout", "setImmediate"]) {
    if (
      (method !== "setImmediate" || given[method] !== undefined) &&
      typeof given[method] !== "function"
    ) {
      throw new TypeError(
        `Cannot ${OP} as 'timers.${method}' must be a function: current value is ${
          describe(given[method])
        }`,
      );
    }
  }
  return timers as Timers;
}

function real(
  field: string,
  value: unknown,
  min: number,
  max: number,
  fallback: number,
): number {
  if (value === undefined) return fallback;
  const kind = max === Infinity
    ? `a finite number of at least ${min}`
    : `a number from ${min} to ${max}`;
  if (typeof value !== "number") {
    throw new TypeError(
      `Cannot ${OP} as '${field}' must be ${kind}: current value is ${typeof value}`,
    );
  }
  if (!Number.isFinite(value) || value < min || value > max) {
    throw new RangeError(
      `Cannot ${OP} as '${field}' must be ${kind}: current value is ${value}`,
    );
  }
  return value;
}

function fn<F>(field: string, value: F | undefined): F | undefined {
  return value === undefined ? value : checkFunction(OP, field, value);
}

/** The longest delay `setTimeout` honours: longer ones fire at once. */
const MAX_TIMER_MS = 2_147_483_647;

/** A timer that may outlast `setTimeout`'s limit, re-armed in steps. */
export interface LongTimer {
  handle: unknown;
}

/**
 * Calls `callback` after `delayMs`, however long: `setTimeout` turns delays
 * past 2^31 − 1 ms (about 24.8 days) into 1 ms, so longer ones are chained.
 */
export function setLongTimeout(
  timers: Timers,
  callback: () => void,
  delayMs: number,
): LongTimer {
  const timer: LongTimer = { handle: undefined };
  const arm = (remainingMs: number) => {
    const stepMs = Math.min(remainingMs, MAX_TIMER_MS);
    timer.handle = timers.setTimeout(
      () => stepMs < remainingMs ? arm(remainingMs - stepMs) : callback(),
      stepMs,
    );
  };
  arm(Math.max(0, delayMs));
  return timer;
}

/** Cancels a {@linkcode setLongTimeout} timer, if any. */
export function clearLongTimeout(
  timers: Timers,
  timer: LongTimer | undefined,
): void {
  if (timer !== undefined) timers.clearTimeout(timer.handle);
}
