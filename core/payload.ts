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
  let faithful: boolean;
  try {
    faithful = isFaithful(payload, 0);
  } catch (error) {
    // Nesting past the stack's depth, or a Proxy's trap threw.
    throw new TypeError(`Cannot ${op} as '${field}' must be JSON data`, {
      cause: error,
    });
  }
  if (!faithful) throw unfaithful(op, field, payload, []);
}

// Nesting this deep is looked at for cycles; shallower nesting cannot hold
// one without passing it (a cycle repeats forever).
const MAX_DEPTH = 1000;

// The fast path: no paths built, no allocation, one visit per value.
function isFaithful(value: unknown, depth: number): boolean {
  switch (typeof value) {
    case "string":
    case "boolean":
      return true;
    case "number":
      return Number.isFinite(value);
    case "object":
      break;
    default:
      return false;
  }
  if (value === null) return true;
  if (depth > MAX_DEPTH) return false;
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) return false;
    for (let i = 0; i < value.length; i++) {
      if (!(i in value) || !isFaithful(value[i], depth + 1)) return false;
    }
    return (!("toJSON" in value) || value.toJSON === undefined) &&
      !hasNamedProperty(value);
  }
  const prototype = Object.getPrototypeOf(value);
  if (prototype !== objectPrototype && prototype !== null) return false;
  const record = value as Record<string, unknown>;
  if (hasOwn.call(record, "toJSON")) return false;
  for (const key in record) {
    // An undefined member is dropped, as JSON drops it: reading it back
    // gives undefined all the same.
    const member = record[key];
    if (member !== undefined && !isFaithful(member, depth + 1)) return false;
  }
  // JSON drops symbol keys.
  const symbols = Object.getOwnPropertySymbols(record);
  return symbols.length === 0 ||
    !symbols.some((symbol) => isEnumerable.call(record, symbol));
}

// The slow path, taken once a payload is refused: finds the first refused
// place and says why.
function unfaithful(
  op: string,
  field: string,
  value: unknown,
  ancestors: object[],
): TypeError {
  const refuse = (why: string) =>
    new TypeError(
      `Cannot ${op} as '${
        clip(field)
      }' must be JSON data (a plain object, an array, a string, a finite number, a boolean or null, which JSON gives back as it is)${why}: current value is ${
        what(value)
      }`,
    );
  if (typeof value !== "object" || value === null) return refuse("");
  if (ancestors.includes(value)) return refuse(", not a cycle");
  if (ancestors.length > MAX_DEPTH) {
    return refuse(` nested at most ${MAX_DEPTH} deep`);
  }
  const inner = [...ancestors, value];
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) return refuse("");
    for (let i = 0; i < value.length; i++) {
      if (!(i in value)) return refuse(`, without holes (index ${i})`);
      if (!isFaithful(value[i], inner.length)) {
        return unfaithful(op, `${field}[${i}]`, value[i], inner);
      }
    }
    if (hasNamedProperty(value)) return refuse(", without named properties");
    return refuse(", without a toJSON method");
  }
  const prototype = Object.getPrototypeOf(value);
  if (prototype !== objectPrototype && prototype !== null) return refuse("");
  const record = value as Record<string, unknown>;
  if (hasOwn.call(record, "toJSON")) {
    return refuse(", without a toJSON method");
  }
  for (const key in record) {
    if (record[key] !== undefined && !isFaithful(record[key], inner.length)) {
      return unfaithful(op, `${field}${member(key)}`, record[key], inner);
    }
  }
  return refuse(", without symbol keys");
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
  checkPayload(op, field, payload);
  let json: string;
  try {
    json = JSON.stringify(payload);
  } catch (error) {
    // A getter that threw, or one that changed the payload under the check.
    throw new TypeError(`Cannot ${op} as '${field}' must be JSON data`, {
      cause: error,
    });
  }
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
