/**
 * What becomes of a handler's lease when it does not succeed, and where the
 * loop's errors go: the exponential backoff of a retried event, the release
 * a thrown error asks for (a dead letter for {@linkcode PermanentError},
 * the given delay for {@linkcode RetryAfterError}, the backoff otherwise),
 * and the `onError` and `onHandlerError` hooks, which cannot stop the loop
 * by throwing.
 *
 * @module
 */
import type { Lease, ReleaseOptions } from "../lease.ts";
import { PermanentError, RetryAfterError } from "../errors.ts";
import type { Settings } from "./options.ts";
import { describeError, isInstance } from "../validate.ts";

/**
 * The delay before the next attempt of an event whose attempt `attempt`
 * (1 for the first) failed, in milliseconds: `backoffMinMs` times
 * `backoffMultiplier` per attempt after the first, at most `backoffMaxMs`,
 * less up to `backoffJitter` of it at random, as in Deno std's `retry`.
 * A `random` option that throws or returns a number outside [0, 1) is
 * reported (a `RangeError` naming it, to `report`) and no jitter is taken,
 * so the event still goes back with a valid delay.
 */
export function backoffMs(
  settings: Settings,
  attempt: number,
  report: (error: unknown) => void,
): number {
  const exponent = Math.max(0, attempt - 1);
  const capped = Math.min(
    settings.backoffMaxMs,
    settings.backoffMinMs * settings.backoffMultiplier ** exponent,
  );
  return Math.round(
    capped * (1 - settings.backoffJitter * jitter(settings, report)),
  );
}

/** `random()`'s number in [0, 1), or 0 (reported) when it gives none. */
function jitter(settings: Settings, report: (error: unknown) => void): number {
  let value: unknown;
  try {
    value = settings.random();
  } catch (error) {
    report(
      new RangeError(
        `Cannot take the backoff's jitter as the random option threw: ${
          describeError(error)
        }; the backoff is taken whole`,
      ),
    );
    return 0;
  }
  if (typeof value === "number" && value >= 0 && value < 1) return value;
  report(
    new RangeError(
      `Cannot take the backoff's jitter as the random option returned ${
        typeof value === "number" ? value : typeof value
      }, not a number in [0, 1); the backoff is taken whole`,
    ),
  );
  return 0;
}

/** How a lease whose handler threw `error` goes back, its text kept. */
export function releaseFor(
  settings: Settings,
  lease: Lease<unknown>,
  error: unknown,
  report: (error: unknown) => void,
): ReleaseOptions {
  const text = describeError(error);
  if (isInstance(error, PermanentError)) {
    return { error: text, deadLetter: true };
  }
  if (isInstance(error, RetryAfterError)) {
    return { error: text, delayMs: error.delayMs };
  }
  return { error: text, delayMs: backoffMs(settings, lease.attempt, report) };
}

/** The loop's two hooks, called so that a throwing hook cannot stop it. */
export class Reports {
  readonly #settings: Settings;

  /** @param settings Where `onError` and `onHandlerError` come from. */
  constructor(settings: Settings) {
    this.#settings = settings;
  }

  /** Reports an error the loop survives; a throwing `onError` is logged. */
  error(error: unknown): void {
    try {
      this.#settings.onError(error);
    } catch (hookError) {
      console.error("processEvents: the onError hook threw", hookError);
    }
  }

  /** Tells `onHandlerError`, if set, what a handler threw; it throwing is reported. */
  handlerError(error: unknown, lease: Lease<unknown>): void {
    if (this.#settings.onHandlerError === undefined) return;
    try {
      this.#settings.onHandlerError(error, lease);
    } catch (hookError) {
      this.error(hookError);
    }
  }
}
