/**
 * The argument checks every entry point shares (the outbox, the inbox, the
 * reader, the processing loop, the drivers and the browser): each refuses bad
 * input with a `TypeError` or `RangeError` that names the field, before any
 * SQL runs. Runtime-neutral, like `lease.ts`.
 *
 * @module
 */

import { isIdentity } from "./identity.ts";
import type { EventState } from "./types.ts";

const TOKEN = /^[A-Za-z0-9._~-]{1,128}$/;
const MAX_NAME_LENGTH = 1024;
/** The longest error text an event keeps, in UTF-16 code units. */
export const MAX_ERROR_LENGTH = 65_536;

/**
 * Checks that `options` is an object whose own keys are all in `known`,
 * before any option is read: a misspelt option would otherwise be ignored
 * and its default used in silence. The one check every options object goes
 * through (outbox, its calls, the processing loop, the openers, the
 * browser).
 *
 * @ignore
 * @param op What the caller was doing, for the message ("enqueue").
 * @param options The options as passed.
 * @param known Every option name the caller takes.
 * @param name What the message calls the object: `"options"`, or an
 * element's path (`"events[3]"`), which then prefixes each key.
 * @throws {TypeError} When `options` is not an object, or has a key not in
 * `known`: the message names the key and the nearest known one.
 */
export function checkOptions(
  op: string,
  options: unknown,
  known: readonly string[],
  name = "options",
): void {
  if (options === null || typeof options !== "object") {
    throw new TypeError(
      `Cannot ${op} as '${name}' must be an object: current value is ${
        describe(options)
      }`,
    );
  }
  const prefix = name === "options" ? "" : `${name}.`;
  for (const key of Object.keys(options)) {
    if (known.includes(key)) continue;
    const nearest = nearestName(key, known);
    throw new TypeError(
      `Cannot ${op} as '${prefix}${key}' is not an option${
        nearest === undefined ? "" : `: did you mean '${nearest}'?`
      } (known: ${known.map((name) => `'${name}'`).join(", ")})`,
    );
  }
}

/**
 * The known name closest to `name` by edit distance (ignoring case), when
 * it is close enough to be a slip rather than another word.
 */
function nearestName(
  name: string,
  known: readonly string[],
): string | undefined {
  let best: string | undefined;
  let bestDistance = Infinity;
  const lower = name.toLowerCase();
  for (const candidate of known) {
    const other = candidate.toLowerCase();
    // An abbreviation (`closeDb` for `closeDatabase`) counts as one slip.
    const distance = lower.length >= 3 && isAbbreviation(lower, other)
      ? 1
      : editDistance(lower, other);
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return bestDistance <= Math.max(2, Math.floor(name.length / 3))
    ? best
    : undefined;
}

/** Whether `short` is `long`'s first letter and then some of its letters, in order. */
function isAbbreviation(short: string, long: string): boolean {
  if (short[0] !== long[0]) return false;
  let j = 0;
  for (const c of short) {
    j = long.indexOf(c, j) + 1;
    if (j === 0) return false;
  }
  return true;
}

/**
 * Optimal string alignment distance: insertions, deletions, substitutions
 * and swaps of two neighbours each cost one.
 */
function editDistance(a: string, b: string): number {
  let before: number[] = [];
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let distance = Math.min(
        previous[j]! + 1,
        current[j - 1]! + 1,
        previous[j - 1]! + cost,
      );
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        distance = Math.min(distance, before[j - 2]! + 1);
      }
      current.push(distance);
    }
    before = previous;
    previous = current;
  }
  return previous[b.length]!;
}

/**
 * Validates an optional integer field; `undefined` means "use the default".
 * The one home of this check and its error text, shared by the loop.
 *
 * @ignore
 */
export function checkInteger(
  op: string,
  field: string,
  value: unknown,
  min: number,
  max: number,
): number | undefined {
  if (value === undefined) return undefined;
  const kind = min === 0
    ? "a non-negative integer"
    : min === 1
    ? "a positive integer"
    : `an integer of at least ${min}`;
  if (typeof value !== "number") {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be ${kind}: current value is ${
        describe(value)
      }`,
    );
  }
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new RangeError(
      `Cannot ${op} as '${field}' must be ${kind} at most ${max}: current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

/**
 * Validates an optional boolean field, giving `fallback` for `undefined`.
 * The one home of this check and its error text, shared by the drivers.
 *
 * @ignore
 */
export function checkBoolean(
  op: string,
  field: string,
  value: unknown,
  fallback: boolean,
): boolean {
  if (value === undefined) return fallback;
  if (typeof value !== "boolean") {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be a boolean: current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

/**
 * Validates a queue name or key: 1–1024 characters, no NUL or lone surrogate.
 *
 * @param op What the caller cannot do, for the message.
 * @param field The field's name.
 * @param value The value given.
 * @returns The name.
 * @throws {TypeError} When it is not such a string.
 * @ignore
 */
export function checkName(op: string, field: string, value: unknown): string {
  // NUL is refused because some drivers (Deno's node:sqlite) cut text there;
  // lone surrogates because SQLite stores them as U+FFFD, merging names.
  if (
    typeof value !== "string" || value.length === 0 ||
    value.length > MAX_NAME_LENGTH || value.includes("\0") ||
    !value.isWellFormed()
  ) {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be a string of 1 to ${MAX_NAME_LENGTH} characters, no NUL or lone surrogate: current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

export function checkToken(op: string, field: string, value: unknown): string {
  if (typeof value !== "string" || !TOKEN.test(value)) {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be 1 to 128 characters of A-Z a-z 0-9 . _ ~ -: current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

/**
 * Validates an event identity: canonical lowercase UUID text.
 *
 * @ignore
 */
export function checkIdentity(
  op: string,
  field: string,
  value: unknown,
): string {
  if (!isIdentity(value)) {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be a UUID in canonical lowercase text (8-4-4-4-12 hex digits): current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

export function checkError(op: string, value: unknown): string {
  if (
    typeof value !== "string" || value.length > MAX_ERROR_LENGTH ||
    value.includes("\0") || !value.isWellFormed()
  ) {
    throw new TypeError(
      `Cannot ${op} as 'error' must be a string of at most ${MAX_ERROR_LENGTH} characters, no NUL or lone surrogate: current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

export function checkEventId(
  op: string,
  value: unknown,
  field = "eventId",
): number {
  return checkInteger(op, field, value, 1, Number.MAX_SAFE_INTEGER) ??
    missing(op, field);
}

/**
 * Validates an event state.
 *
 * @ignore
 * @param op What was being done, for the message.
 * @param value The state as passed.
 * @returns The state.
 * @throws {TypeError} When it is not one of the four states.
 */
export function checkState(op: string, value: unknown): EventState {
  if (
    value !== "pending" && value !== "leased" && value !== "done" &&
    value !== "dead"
  ) {
    throw new TypeError(
      `Cannot ${op} as 'state' must be "pending", "leased", "done" or "dead": current value is ${
        describe(value)
      }`,
    );
  }
  return value;
}

/**
 * Checks that `driver` is a `Driver`-shaped object: `query`,
 * `run`, `exec` and `close` functions, and the optional methods functions
 * where given.
 *
 * @ignore
 */
export function checkDriver(op: string, driver: unknown): void {
  if (driver === null || typeof driver !== "object") {
    throw new TypeError(
      `Cannot ${op} as 'driver' must be a Driver: current value is ${
        describe(driver)
      }`,
    );
  }
  const given = driver as Record<string, unknown>;
  for (const method of DRIVER_METHODS) {
    const value = given[method];
    if (
      typeof value !== "function" &&
      (value !== undefined || REQUIRED_DRIVER_METHODS.includes(method))
    ) {
      throw new TypeError(
        `Cannot ${op} as 'driver.${method}' must be a function: current value is ${
          describe(value)
        }`,
      );
    }
  }
}

const REQUIRED_DRIVER_METHODS = ["query", "run", "exec", "close"];
const DRIVER_METHODS = [
  ...REQUIRED_DRIVER_METHODS,
  "busyWait",
  "watchEnqueues",
  "inTransaction",
  "transactionStatus",
];

/**
 * `value` when it is one of `allowed`, `undefined` when it is undefined;
 * a `TypeError` when it is not a string, a `RangeError` naming `field` and
 * the choices (then `why`) when it is another string.
 *
 * @ignore
 */
export function checkOneOf<T extends string>(
  op: string,
  field: string,
  value: unknown,
  allowed: readonly T[],
  why = "",
): T | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "string") {
    throw new TypeError(
      `Cannot ${op} as '${field}' must be a string: current value is ${
        describe(value)
      }`,
    );
  }
  if (!(allowed as readonly string[]).includes(value)) {
    throw new RangeError(
      `Cannot ${op} as '${field}' must be one of ${
        allowed.join(", ")
      }: current value is ${value}${why}`,
    );
  }
  return value as T;
}

/**
 * A SQLite driver's `journalMode` option checked against the modes it
 * offers (the same four on every driver), saying why `"off"` and
 * `"memory"` are not among them.
 *
 * @ignore
 */
export function checkJournalMode<T extends string>(
  op: string,
  value: unknown,
  allowed: readonly T[],
): T | undefined {
  return checkOneOf(
    op,
    "journalMode",
    value,
    allowed,
    value === "off" || value === "memory"
      ? " (no journal, or one in memory, cannot roll back a transaction safely: a refused acknowledgement's rows would stay, or a crash could corrupt the file)"
      : "",
  );
}

/**
 * `value` when it is a function; a `TypeError` naming `field` otherwise.
 *
 * @ignore
 */
export function checkFunction<T>(
  op: string,
  field: string,
  value: T,
): T {
  if (typeof value === "function") return value;
  throw new TypeError(
    `Cannot ${op} as '${field}' must be a function: current value is ${
      describe(value)
    }`,
  );
}

/**
 * Whether `value` is an instance of `type`, false when asking throws: a
 * handler may throw anything, a revoked `Proxy` (whose prototype cannot be
 * read) or one whose `getPrototypeOf` trap throws included, and what
 * classifies it must not throw in turn.
 *
 * @ignore
 */
export function isInstance<T>(
  value: unknown,
  type: abstract new (...args: never[]) => T,
): value is T {
  try {
    return value instanceof type;
  } catch {
    return false;
  }
}

/**
 * The error text an event keeps: whatever was thrown, as text SQLite can
 * store. An `Object.create(null)` or an error whose `message` getter throws
 * cannot be printed the usual way; NUL is cut by some drivers and lone
 * surrogates become U+FFFD, so both are replaced, after cutting to the
 * longest text kept (a cut may split a surrogate pair).
 *
 * @ignore
 */
export function describeError(error: unknown): string {
  let text = "an error that cannot be printed";
  try {
    text = isInstance(error, Error)
      ? `${error.name}: ${error.message}`
      : String(error);
  } catch {
    try {
      text = `an unprintable ${Object.prototype.toString.call(error)}`;
    } catch {
      // Even its tag throws (a hostile Proxy): the default text stays.
    }
  }
  return text.replaceAll("\0", "\uFFFD").slice(0, MAX_ERROR_LENGTH)
    .toWellFormed();
}

/**
 * `value` when it is an instance of `type` (`Request`, `Headers`,
 * `AbortSignal`); a `TypeError` naming `field` and the type otherwise.
 *
 * @ignore
 */
export function checkInstance<T>(
  op: string,
  field: string,
  value: unknown,
  type: abstract new (...args: never[]) => T,
): T {
  if (value instanceof type) return value;
  const article = /^[AEIOU]/.test(type.name) ? "an" : "a";
  throw new TypeError(
    `Cannot ${op} as '${field}' must be ${article} ${type.name}: current value is ${
      describe(value)
    }`,
  );
}

/**
 * `value` when it is an `AbortSignal` or undefined; a `TypeError` naming
 * `field` otherwise.
 *
 * @ignore
 */
export function checkSignal(
  op: string,
  field: string,
  value: unknown,
): AbortSignal | undefined {
  return value === undefined
    ? undefined
    : checkInstance(op, field, value, AbortSignal);
}

/**
 * An origin option (`https://admin.example.com`) in the form browsers
 * send in an `Origin` header: scheme and host lowercase, no default port,
 * no trailing slash. `undefined` stays `undefined`.
 *
 * @ignore
 * @throws {TypeError} When it is not a string, or not an `http:` or
 * `https:` URL with nothing after its host and port (a path, query,
 * fragment or credentials).
 */
export function checkOrigin(
  op: string,
  field: string,
  value: unknown,
): string | undefined {
  if (value === undefined) return undefined;
  const refuse = () =>
    new TypeError(
      `Cannot ${op} as '${field}' must be an origin, an http: or https: URL with no path, query or fragment (e.g. "https://admin.example.com"): current value is ${
        describe(value)
      }`,
    );
  if (typeof value !== "string" || !URL.canParse(value)) throw refuse();
  const url = new URL(value);
  if (
    (url.protocol !== "http:" && url.protocol !== "https:") ||
    url.username !== "" || url.password !== "" || url.pathname !== "/" ||
    /[?#]/.test(value) ||
    // "https://host/" parses with pathname "/", as does "https://host".
    !/^[a-z][a-z0-9+.-]*:\/\/[^/?#]+\/?$/i.test(value)
  ) {
    throw refuse();
  }
  return url.origin;
}

/**
 * `value` when it is a non-empty string without whitespace or control
 * characters, `undefined` when it is undefined; a `TypeError` naming
 * `field` otherwise. For host names and addresses.
 *
 * @ignore
 */
export function checkHost(
  op: string,
  field: string,
  value: unknown,
): string | undefined {
  if (value === undefined) return undefined;
  if (
    typeof value === "string" && value !== "" && !/[\s/?#@]/.test(value) &&
    // Control characters: U+0000 to U+001F and U+007F.
    !Array.from(value).some((c) => c <= "\x1f" || c === "\x7f")
  ) {
    return value;
  }
  throw new TypeError(
    `Cannot ${op} as '${field}' must be a host name or IP address: current value is ${
      describe(value)
    }`,
  );
}

/** @ignore */
export function missing(op: string, field: string): never {
  throw new TypeError(
    `Cannot ${op} as '${field}' is required: current value is undefined`,
  );
}

/** @ignore */
export function describe(value: unknown): string {
  if (typeof value === "string") {
    return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  }
  if (typeof value === "bigint") return `${value}n`;
  if (typeof value === "function") return "a function";
  if (value instanceof Uint8Array) {
    return `a Uint8Array of ${value.byteLength} bytes`;
  }
  if (Array.isArray(value)) return "an array";
  if (value !== null && typeof value === "object") return "an object";
  return String(value);
}
