/**
 * The statements of enqueueing, inside a transaction the caller runs: one
 * event, a batch in one statement, and a group commit's calls each undone
 * alone under a savepoint when the shared statement fails; a batch inside
 * the application's `transaction(fn)` all or none under one (SQLite).
 *
 * @module
 */
import {
  type Driver,
  integerOf,
  safeInteger,
  type SqlValue,
} from "../driver.ts";
import { uuidv7 } from "../identity.ts";
import { insertOrFind, type InsertTarget } from "./insert_or_find.ts";
import type { Dialect, EnqueueResult } from "../types.ts";

// A batch mints a token per event: a table halves the cost of formatting.
const HEX = Array.from(
  { length: 256 },
  (_, byte) => byte.toString(16).padStart(2, "0"),
);
const HEX_DIGITS = new TextEncoder().encode("0123456789abcdef");
const ascii = new TextDecoder("latin1");

/** Where an enqueue inserts, for `insertOrFind`. */
function eventsTable(sql: Dialect): InsertTarget {
  return {
    table: "outbox_events",
    keys: "its dedup key or identity",
    oneWriter: sql.oneWriter === true,
  };
}

/** One event as validated before any SQL: what `insertOne` inserts. */
export interface PreparedEnqueue {
  readonly queue: string;
  readonly payload: SqlValue;
  readonly dedupKey: string | null;
  readonly orderingKey: string | null;
  readonly identity: string | null;
  readonly delayMs: number;
  readonly maxAttempts: number;
  readonly priority: number;
  readonly concurrencyKey: string | null;
}

/** How one call of a shared transaction ended. */
export type Settled<T> = { readonly value: T } | { readonly error: unknown };

/**
 * Inserts one event (or finds the one its `dedupKey` or `identity` matched),
 * inside the caller's transaction.
 *
 * @throws {DedupRaceError} When the event its key met was purged before it
 * could be read, round after round (`insertOrFind`).
 * @throws {ConstraintError} When a trigger skipped the insert (SQLite's
 * `RAISE(IGNORE)`, PostgreSQL's NULL from a `BEFORE INSERT` trigger), or
 * the application's own constraint refused it.
 */
export async function insertOne(
  driver: Driver,
  sql: Dialect,
  event: PreparedEnqueue,
  now: number,
): Promise<EnqueueResult> {
  const identity = event.identity ?? uuidv7(now);
  const bytes = event.payload instanceof Uint8Array;
  const params = [
    event.queue,
    bytes ? null : event.payload,
    event.dedupKey,
    event.orderingKey,
    now + event.delayMs,
    event.maxAttempts,
    now,
    now,
    identity,
    bytes ? event.payload : null,
    event.priority,
    event.concurrencyKey,
  ];
  return await insertOrFind("enqueue", eventsTable(sql), async () => {
    const [inserted] = await driver.query(sql.insert, params);
    if (inserted !== undefined) {
      return {
        eventId: integerOf(inserted, "id"),
        identity,
        deduplicated: false,
      };
    }
    const [row] = await driver.query(sql.existing, [
      event.queue,
      event.dedupKey,
      identity,
    ]);
    return row === undefined ? undefined : {
      eventId: integerOf(row, "id"),
      identity: String(row["identity"]),
      deduplicated: true,
    };
  });
}

/**
 * Inserts `events` with one statement, each as `insertOne`
 * would in turn; the skipped ones' events are looked up with one more.
 * `now` null (`insertAllInOne`, outside a transaction): the statement reads
 * the server's clock, and minted identities carry this process's.
 *
 * @throws {DedupRaceError} When events the batch's keys met were purged
 * before they could be read, round after round (`insertOrFind`).
 * @throws {ConstraintError} When a trigger skipped an event's insert
 * (SQLite's `RAISE(IGNORE)`, PostgreSQL's NULL from a `BEFORE INSERT`
 * trigger), or the application's own constraint refused it.
 */
export async function insertAll(
  driver: Driver,
  sql: Dialect,
  events: readonly PreparedEnqueue[],
  now: number | null,
): Promise<EnqueueResult[]> {
  if (events.length === 0) return [];
  const mintedAt = now ?? Date.now();
  const identities = events.map((event) => event.identity ?? uuidv7(mintedAt));
  const results: EnqueueResult[] = new Array(events.length);
  // The elements whose skipped insert found no event, inserted again (with
  // the identities minted for them) in the next round: their ids come
  // after those of the batch's others.
  let pending = events.map((_, i) => i);
  return await insertOrFind("enqueue", eventsTable(sql), async () => {
    const first = pending.length === events.length;
    const round = await insertSome(
      driver,
      sql,
      first ? events : pending.map((i) => events[i]!),
      first ? identities : pending.map((i) => identities[i]!),
      now,
    );
    const left: number[] = [];
    pending.forEach((i, n) => {
      const result = round[n];
      if (result === undefined) left.push(i);
      else results[i] = result;
    });
    pending = left;
    return pending.length === 0 ? results : undefined;
  });
}

/**
 * One round of `insertAll`: inserts `events` (with `identities`) and looks
 * up the events the skipped ones met; answers each one's result, or
 * `undefined` where the lookup found none.
 */
async function insertSome(
  driver: Driver,
  sql: Dialect,
  events: readonly PreparedEnqueue[],
  identities: readonly string[],
  now: number | null,
): Promise<(EnqueueResult | undefined)[]> {
  const [first] = events as [PreparedEnqueue];
  const alike = events.every((event) =>
    typeof event.payload === "string" && event.queue === first.queue &&
    event.dedupKey === null && event.orderingKey === null &&
    event.priority === 0 && event.concurrencyKey === null &&
    event.delayMs === first.delayMs && event.maxAttempts === first.maxAttempts
  );
  if (
    alike && sql.insertMinted !== undefined &&
    events.every((event) => event.identity === null)
  ) {
    return await insertMinted(
      driver,
      sql.insertMinted,
      events,
      identities,
      now,
    );
  }
  const rows = alike
    ? await driver.query(sql.insertAlike, [
      now,
      JSON.stringify(
        events.map((event, i) => [event.payload, identities[i]]),
      ),
      first.queue,
      first.delayMs,
      first.maxAttempts,
    ])
    : await driver.query(sql.insertAll, [
      now,
      JSON.stringify(events.map((event, i) => {
        const { payload } = event;
        const bytes = payload instanceof Uint8Array;
        return [
          event.queue,
          bytes ? null : payload,
          bytes ? hex(payload, 0, payload.length) : null,
          event.dedupKey,
          event.orderingKey,
          event.delayMs,
          event.maxAttempts,
          identities[i],
          event.priority,
          event.concurrencyKey,
        ];
      })),
    ]);
  const inserted = new Map(rows.map((row) => [String(row["identity"]), row]));
  // A row is the first element's with its identity, queue and dedup key:
  // an earlier element with all three the same would have been inserted
  // instead, or skipped for a conflict the later one meets too.
  const ids = events.map((event, i) => {
    const row = inserted.get(identities[i]!);
    if (
      row === undefined || row["queue"] !== event.queue ||
      (row["dedup_key"] ?? null) !== event.dedupKey
    ) {
      return undefined;
    }
    inserted.delete(identities[i]!);
    return integerOf(row, "id");
  });
  const results = ids.map((id, i): EnqueueResult | undefined =>
    id === undefined
      ? undefined
      : { eventId: id, identity: identities[i]!, deduplicated: false }
  );
  if (!ids.includes(undefined)) return results;
  // A skipped element met an earlier element's event or another
  // transaction's, never a later element's: a key that a later one went in
  // with was free at its turn, so it met the owner of its other key, and
  // is looked up by that one alone. (Not by id: on PostgreSQL a
  // transaction that drew its ids after the batch can own the key.)
  const later = new Set<string>();
  const skipped: [string, string | null, string | null][] = [];
  const skippedAt: number[] = [];
  for (let i = events.length - 1; i >= 0; i--) {
    const event = events[i]!;
    const key = event.dedupKey === null
      ? null
      : JSON.stringify([event.queue, event.dedupKey]);
    if (ids[i] !== undefined) {
      later.add(identities[i]!);
      if (key !== null) later.add(key);
      continue;
    }
    skipped.push([
      event.queue,
      key !== null && later.has(key) ? null : event.dedupKey,
      later.has(identities[i]!) ? null : identities[i]!,
    ]);
    skippedAt.push(i);
  }
  const found = new Map(
    (await driver.query(sql.existingAll, [
      JSON.stringify(skipped),
    ])).map((row) => [Number(row["n"]), row]),
  );
  skippedAt.forEach((i, n) => {
    const row = found.get(n);
    if (row === undefined) return;
    results[i] = {
      eventId: integerOf(row, "id"),
      identity: String(row["identity"]),
      deduplicated: true,
    };
  });
  return results;
}

/**
 * `insertSome` of alike events (JSON text payloads) whose identities the
 * outbox minted (`identities`, UUIDv7 text, which an array literal holds
 * unquoted), with the dialect's `insertMinted`: the payloads travel as the
 * elements of one JSON array, as they are (each is JSON text), the
 * identities as an array, and every event goes in.
 */
async function insertMinted(
  driver: Driver,
  statement: string,
  events: readonly PreparedEnqueue[],
  identities: readonly string[],
  now: number | null,
): Promise<EnqueueResult[]> {
  const [first] = events as [PreparedEnqueue];
  const [row] = await driver.query(statement, [
    now,
    `[${events.map((event) => event.payload).join(",")}]`,
    first.queue,
    first.delayMs,
    first.maxAttempts,
    `{${identities.join(",")}}`,
  ]);
  return String(row?.["ids"]).split(",").map((id, i) => ({
    eventId: parseId(id),
    identity: identities[i]!,
    deduplicated: false,
  }));
}

/** An id as `integerOf` reads one: a safe integer, or `UnsafeIntegerError`. */
function parseId(text: string): number {
  const id = Number(text);
  return safeInteger("id", Number.isSafeInteger(id) ? id : BigInt(text));
}

/**
 * The statements of a group of enqueues: a lone call as ever; several in
 * one statement under a savepoint, and when that fails, each under a
 * savepoint of its own, so that only the failing call's promise rejects.
 */
export async function insertGroup(
  driver: Driver,
  sql: Dialect,
  events: readonly PreparedEnqueue[],
  now: number,
): Promise<Settled<EnqueueResult>[]> {
  if (events.length === 1) {
    return [{ value: await insertOne(driver, sql, events[0]!, now) }];
  }
  const all = await undoable(
    driver,
    sql,
    () => insertAll(driver, sql, events, now),
  );
  if ("value" in all) return all.value.map((value) => ({ value }));
  const settled: Settled<EnqueueResult>[] = [];
  for (const event of events) {
    settled.push(
      await undoable(driver, sql, () => insertOne(driver, sql, event, now)),
    );
  }
  return settled;
}

/**
 * Runs `fn` under a savepoint: its failure is undone and returned.
 * Throws `fn`'s error when the savepoint cannot be rolled back to, as when
 * the engine rolled the whole transaction back (SQLite does on an I/O
 * error or a full disk, and for a trigger's `RAISE(ROLLBACK)`): the
 * transaction must then fail as a whole (a group commit runs its calls
 * again each alone when a constraint did it: `group_commit.ts`).
 */
async function undoable<T>(
  driver: Driver,
  sql: Dialect,
  fn: () => Promise<T>,
): Promise<Settled<T>> {
  await driver.run(sql.savepoint);
  try {
    const value = await fn();
    await driver.run(sql.releaseSavepoint);
    return { value };
  } catch (error) {
    try {
      await driver.run(sql.rollbackToSavepoint);
      await driver.run(sql.releaseSavepoint);
    } catch {
      throw error;
    }
    return { error };
  }
}

/**
 * Runs `fn`, a batch of statements inside the caller's transaction, as one
 * unit ({@linkcode undoable}): rolled back to its savepoint when it fails
 * part-way, so that a caller that catches the error commits none of its
 * writes (a `transaction(fn)`'s `tx.enqueueBatch` on SQLite), and its error
 * thrown.
 */
export async function allOrNone<T>(
  driver: Driver,
  sql: Dialect,
  fn: () => Promise<T>,
): Promise<T> {
  const settled = await undoable(driver, sql, fn);
  if ("error" in settled) throw settled.error;
  return settled.value;
}

/** `n` bytes from the platform's CSPRNG. */
export function randomBytes(n: number): Uint8Array {
  const bytes = new Uint8Array(n);
  // getRandomValues fills at most 65,536 bytes per call.
  for (let i = 0; i < n; i += 65_536) {
    crypto.getRandomValues(bytes.subarray(i, i + 65_536));
  }
  return bytes;
}

/** `length` bytes of `bytes` from `start` as lowercase hex. */
export function hex(bytes: Uint8Array, start: number, length: number): string {
  if (length <= 64) {
    let text = "";
    for (let i = start; i < start + length; i++) text += HEX[bytes[i]!];
    return text;
  }
  // A payload's bytes: the digits written as bytes and decoded once, since
  // a string grown pair by pair took 6 s for 20 MiB.
  const digits = new Uint8Array(2 * length);
  for (let i = 0; i < length; i++) {
    const byte = bytes[start + i]!;
    digits[2 * i] = HEX_DIGITS[byte >> 4]!;
    digits[2 * i + 1] = HEX_DIGITS[byte & 15]!;
  }
  return ascii.decode(digits);
}

/** A payload's size as the batch statement carries it, about. */
export function payloadSize(event: PreparedEnqueue): number {
  return event.payload instanceof Uint8Array
    ? 2 * event.payload.byteLength
    : String(event.payload).length;
}
