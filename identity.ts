/**
 * Event identities: UUIDv7 text (RFC 9562, section 5.7), minted with web
 * standard APIs only, so the lease core and browsers share it.
 *
 * @module
 */

/** Canonical UUID text, lowercase, any version and variant. */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
// 48 bits of Unix milliseconds wrap in the year 10889 (RFC 9562, 6.1).
const TIMESTAMP_RANGE = 2 ** 48;
const HEX = Array.from(
  { length: 256 },
  (_, byte) => byte.toString(16).padStart(2, "0"),
);

let lastMs = -1;
let counter = 0;
// Random bytes drawn 10 per identity from a pool filled 4,000 at a time:
// one getRandomValues call per identity cost a batch enqueue of 256 events
// a fifth of its time.
const pool = new Uint8Array(4000);
let drawn = pool.length;
// The text of lastMs's 48 bits, "xxxxxxxx-xxxx-", reused within a millisecond.
let prefixMs = -1;
let prefix = "";

/**
 * Whether `value` is canonical UUID text: 36 characters, lowercase hex in
 * 8-4-4-4-12 groups. Any version and variant is accepted, so identities
 * minted upstream (UUIDv4, v7) can be carried.
 *
 * @param value Anything.
 * @returns `true` when it is canonical UUID text.
 *
 * @example Usage
 * ```ts
 * import { isIdentity } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * assert.equal(isIdentity("0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe"), true);
 * assert.equal(isIdentity("0190B2C4-7D3E-7A11-8F00-5C0FFEE0CAFE"), false);
 * ```
 */
export function isIdentity(value: unknown): value is string {
  return typeof value === "string" && UUID.test(value);
}

/**
 * Mints a UUIDv7: 48 bits of Unix milliseconds, the version 7, 12 bits
 * `rand_a`, the variant `10`, 62 bits `rand_b`, from
 * `crypto.getRandomValues`. `rand_a` is a counter seeded at random each
 * millisecond (RFC 9562's method 1), so identities minted in one process
 * sort in the order they were minted, even within one millisecond or when
 * the clock steps back (the timestamp then stays at the latest one seen).
 *
 * @param unixMs The time to stamp, in epoch milliseconds.
 * @default {Date.now()}
 * @returns Lowercase UUID text.
 * @throws {TypeError} When `unixMs` is not a number.
 * @throws {RangeError} When `unixMs` is not finite or is below 0.
 *
 * @example Usage
 * ```ts
 * import { uuidv7 } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * const first = uuidv7();
 * const second = uuidv7();
 * assert.match(first, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
 * assert.ok(first < second);
 * ```
 */
export function uuidv7(unixMs: number = Date.now()): string {
  // NaN fails both comparisons; before 1970 there is no 48-bit stamp.
  if (typeof unixMs !== "number" || !(unixMs >= 0 && unixMs < Infinity)) {
    throw new (typeof unixMs === "number" ? RangeError : TypeError)(
      `Cannot mint a UUIDv7 as 'unixMs' must be a finite number of milliseconds of at least 0: current value is ${
        String(unixMs)
      }`,
    );
  }
  if (drawn === pool.length) {
    crypto.getRandomValues(pool);
    drawn = 0;
  }
  const r = drawn;
  drawn += 10;
  const ms = Math.floor(unixMs) % TIMESTAMP_RANGE;
  if (ms > lastMs) {
    lastMs = ms;
    // The seed leaves the counter's top bit clear, room for 2,048 more.
    counter = ((pool[r]! & 0x07) << 8) | pool[r + 1]!;
  } else if (++counter > 0xfff) {
    lastMs = (lastMs + 1) % TIMESTAMP_RANGE;
    counter = ((pool[r]! & 0x07) << 8) | pool[r + 1]!;
  }
  if (prefixMs !== lastMs) {
    prefixMs = lastMs;
    const high = Math.floor(lastMs / 2 ** 16);
    prefix = `${high.toString(16).padStart(8, "0")}-${
      (lastMs % 2 ** 16).toString(16).padStart(4, "0")
    }-`;
  }
  let text = prefix + "7" + HEX[counter >> 8]![1] + HEX[counter & 0xff] +
    "-" + HEX[0x80 | (pool[r + 2]! & 0x3f)] + HEX[pool[r + 3]!] + "-";
  for (let i = r + 4; i < r + 10; i++) text += HEX[pool[i]!];
  return text;
}

/**
 * The epoch milliseconds a UUIDv7 was stamped with (its first 48 bits).
 *
 * @param identity UUIDv7 text.
 * @returns The timestamp, in epoch milliseconds.
 * @throws {TypeError} When `identity` is not canonical UUID text of version 7.
 *
 * @example Usage
 * ```ts
 * import { uuidv7, uuidv7Time } from "@leased/outbox";
 * import assert from "node:assert/strict";
 *
 * assert.ok(uuidv7Time(uuidv7(1_700_000_000_000)) >= 1_700_000_000_000);
 * ```
 */
export function uuidv7Time(identity: string): number {
  if (!isIdentity(identity) || identity[14] !== "7") {
    throw new TypeError(
      `Cannot read the time as 'identity' must be UUIDv7 text: current value is ${
        JSON.stringify(String(identity).slice(0, 40))
      }`,
    );
  }
  return parseInt(identity.slice(0, 8) + identity.slice(9, 13), 16);
}
