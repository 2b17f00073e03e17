/**
 * The check and encoding of an event's payload: bytes as they are, or JSON
 * text that parses back to the very value enqueued (`Lease.payload` is "the
 * payload as enqueued"), anything JSON would change refused before any SQL.
 *
 * @module
 */
import type { SqlValue } from "../driver.ts";
import { describe } from "../validate.ts";

const encoder = new TextEncoder();

const objectPrototype = Object.prototype;
const hasOwn = Object.prototype.hasOwnProperty;
const isEnumerable = Object.prototype.propertyIsEnumerable;

/**
 * Throws a TypeError naming the place inside `payload` (`payload.a[2]`)
 * that JSON would not give back as it is: NaN and the infinities,
 * undefined elements (an undefined member of an object is dropped, as JSON
 * drops it, and reads back as undefined all the same), functions, symbols,
 * BigInts, array holes, an array's named properties, symbol keys, objects
 * other than plain ones (a prototype of `Object.prototype` or `null`) and
 * arrays (a Map, a Set, a Date, an ArrayBuffer, a typed array, a class
 * instance, a boxed primitive), objects with a `toJSON` method, and cycles.
 * A top-level `Uint8Array` is a bytes payload, and allowed.
 *
 * @param op What was being done, for the message.
 * @param field The payload's name in the message (`"events[3].payload"`).
 * @param payload The payload as passed.
 * @throws {TypeError} When JSON would change or refuse the payload.
 */
export function checkPayload(op: string, field: string, payload: unknown) {
  if (payload instanceof Uint8Array) return;
  checkedCopy(op, field, payload);
}

/**
 * `payload` checked and copied in one walk that reads each of its values
 * once: the copy, plain data alone, is what gets serialized, so a getter or
 * a Proxy that answers differently at a second read cannot put a value in
 * the stored text that the check never saw.
 */
function checkedCopy(op: string, field: string, payload: unknown): unknown {
  const walk: Walk = { why: "", value: undefined, keys: [], holders: [] };
  let copied: unknown;
  try {
    copied = copy(payload, 0, walk);
  } catch (error) {
    // Nesting past the stack's depth, or a getter or a Proxy's trap threw.
    throw new TypeError(`Cannot ${op} as '${field}' must be JSON data`, {
      cause: error,
    });
  }
  if (copied === REFUSED) throw refusal(op, field, walk);
  return copied;
}

// Nesting this deep is looked at for cycles; shallower nesting cannot hold
// one without passing it (a cycle repeats forever).
const MAX_DEPTH = 1000;

// What copy() returns for a refused value, having said why in its Walk.
const REFUSED = Symbol("refused");
// The reason given for nesting past MAX_DEPTH, until refusal() tells a
// cycle from deep nesting.
const TOO_DEEP = "deep";

/** Where and why copy() refused, for the message. */
interface Walk {
  /** Why `value` is refused: "" (its type), or ", not a cycle" and so on. */
  why: string;
  /** The refused value. */
  value: unknown;
  /** The keys from `value` up to the payload, innermost first. */
  keys: (string | number)[];
  /** The objects holding those keys, innermost first. */
  holders: object[];
}

function refuse(walk: Walk, value: unknown, why: string): typeof REFUSED {
  walk.value = value;
  walk.why = why;
  return REFUSED;
}

// The fast path: no paths built, one read of each value.
function copy(value: unknown, depth: number, walk: Walk): unknown {
  switch (typeof value) {
    case "string":
    case "boolean":
      return value;
    case "number":
      return Number.isFinite(value) ? value : refuse(walk, value, "");
    case "object":
      break;
    default:
      return refuse(walk, value, "");
  }
  if (value === null) return null;
  if (depth > MAX_DEPTH) return refuse(walk, value, TOO_DEEP);
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) {
      return refuse(walk, value, "");
    }
    const length = value.length;
    const out: unknown[] = [];
    for (let i = 0; i < length; i++) {
      if (!(i in value)) {
        return refuse(walk, value, `, without holes (index ${i})`);
      }
      const element = copy(value[i], depth + 1, walk);
      if (element === REFUSED) {
        walk.keys.push(i);
        walk.holders.push(value);
        return REFUSED;
      }
      out.push(element);
    }
    if (hasNamedProperty(value)) {
      return refuse(walk, value, ", without named properties");
    }
    if ("toJSON" in value && value.toJSON !== undefined) {
      return refuse(walk, value, ", without a toJSON method");
    }
    return out;
  }
  const prototype = Object.getPrototypeOf(value);
  if (prototype !== objectPrototype && prototype !== null) {
    return refuse(walk, value, "");
  }
  const record = value as Record<string, unknown>;
  if (hasOwn.call(record, "toJSON")) {
    return refuse(walk, value, ", without a toJSON method");
  }
  const out: Record<string, unknown> = {};
  for (const key in record) {
    // An undefined member is dropped, as JSON drops it: reading it back
    // gives undefined all the same.
    const member = record[key];
    if (member === undefined) continue;
    const copied = copy(member, depth + 1, walk);
    if (copied === REFUSED) {
      walk.keys.push(key);
      walk.holders.push(value);
      return REFUSED;
    }
    if (key === "__proto__") {
      // An own member named so, which assignment would take as the
      // copy's prototype.
      Object.defineProperty(out, key, {
        value: copied,
        enumerable: true,
        writable: true,
        configurable: true,
      });
    } else {
      out[key] = copied;
    }
  }
  // JSON drops symbol keys.
  const symbols = Object.getOwnPropertySymbols(record);
  if (
    symbols.length !== 0 &&
    symbols.some((symbol) => isEnumerable.call(record, symbol))
  ) {
    return refuse(walk, value, ", without symbol keys");
  }
  return out;
}

// The message for what copy() refused, from what its walk kept: no value
// of the payload is read again.
function refusal(op: string, field: string, walk: Walk): TypeError {
  const keys = walk.keys.reverse();
  // The values on the way down: the payload, then what each key held.
  const values: unknown[] = [...walk.holders.reverse(), walk.value];
  let at = keys.length;
  let why = walk.why;
  if (why === TOO_DEEP) {
    // A cycle shows as the first value met again below itself.
    why = ` nested at most ${MAX_DEPTH} deep`;
    for (let i = 1; i < values.length; i++) {
      if (values.indexOf(values[i]) < i) {
        at = i;
        why = ", not a cycle";
        break;
      }
    }
  }
  let path = field;
  for (const key of keys.slice(0, at)) {
    path += typeof key === "number" ? `[${key}]` : member(key);
  }
  return new TypeError(
    `Cannot ${op} as '${
      clip(path)
    }' must be JSON data (a plain object, an array, a string, a finite number, a boolean or null, which JSON gives back as it is)${why}: current value is ${
      what(values[at])
    }`,
  );
}

// JSON writes an array's elements only: an enumerable own key past its
// indices (a hole-free array has exactly `length` index keys) is dropped.
function hasNamedProperty(array: unknown[]): boolean {
  return Object.keys(array).length !== array.length;
}

function member(key: string): string {
  return /^[A-Za-z_$][\w$]*$/.test(key)
    ? `.${key}`
    : `[${JSON.stringify(key)}]`;
}

function what(value: unknown): string {
  if (value === undefined || typeof value !== "object" || value === null) {
    return describe(value);
  }
  if (Array.isArray(value)) return "an array";
  const prototype = Object.getPrototypeOf(value);
  if (prototype === objectPrototype || prototype === null) return "an object";
  const name = typeof prototype?.constructor === "function"
    ? prototype.constructor.name
    : "";
  if (name === "") return "an object with a prototype";
  return `${/^[AEIO]/.test(name) ? "an" : "a"} ${name}`;
}

// A path nested deep enough to be refused for it is shown by its ends.
function clip(field: string): string {
  return field.length <= 120
    ? field
    : `${field.slice(0, 60)}…${field.slice(-40)}`;
}

/**
 * A payload as stored: JSON text, or bytes as they are; refused, with a
 * TypeError, when JSON would change it (see {@linkcode checkPayload}) and,
 * with a RangeError, past `maxBytes`.
 */
export function encodePayload(
  op: string,
  field: string,
  payload: unknown,
  maxBytes: number,
): SqlValue {
  if (payload instanceof Uint8Array) {
    // Checked before any copy: an oversized buffer never reaches the WASM heap.
    if (payload.byteLength > maxBytes) {
      throw tooLarge(op, field, payload.byteLength, maxBytes);
    }
    return payload;
  }
  // The copy, not the payload: what was checked is what is stored.
  const json = JSON.stringify(checkedCopy(op, field, payload));
  // UTF-8 is at most 3 bytes per UTF-16 unit, so short texts skip the count.
  if (json.length * 3 > maxBytes) {
    const bytes = encoder.encode(json).byteLength;
    if (bytes > maxBytes) throw tooLarge(op, field, bytes, maxBytes);
  }
  return json;
}

function tooLarge(
  op: string,
  field: string,
  bytes: number,
  maxBytes: number,
): RangeError {
  return new RangeError(
    `Cannot ${op} as '${field}' must be at most ${maxBytes} bytes ('maxPayloadBytes'): current size is ${bytes} bytes`,
  );
}
