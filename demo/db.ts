/**
 * The one place the demo opens its database: every process (the demo, the
 * producer, the workers) goes through {@linkcode openDatabase}, so switching
 * drivers is a one-line change here.
 *
 * @module
 */
import { type Driver, Outbox, type OutboxOptions } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

/** The driver the demo runs on, as printed in its header. */
export const DRIVER_NAME =
  "SQLite WASM 3.54.1 + Deno file VFS (journal_mode=truncate, synchronous=full)";

/** The queue the demo's order events go to. */
export const QUEUE = "orders";

/** Opens one connection to the database file: the product's default driver. */
export function openDatabase(path: string): Promise<Driver> {
  return openSqliteWasm(path);
}

/** Opens an outbox on a fresh connection to the database file. */
export async function openOutbox(
  path: string,
  options: OutboxOptions = {},
): Promise<Outbox> {
  return await Outbox.open(await openDatabase(path), {
    queue: QUEUE,
    ...options,
  });
}

/** The demo's business table: orders, each committed with its event. */
export const ORDERS_SQL = `CREATE TABLE IF NOT EXISTS orders (
  id INTEGER PRIMARY KEY,
  customer TEXT NOT NULL,
  total_cents INTEGER NOT NULL,
  poison INTEGER NOT NULL
) STRICT`;

/** A payload of the demo's events. */
export interface OrderPlaced {
  readonly type: "order.placed";
  readonly orderId: number;
  readonly totalCents: number;
  /** A poison event: the receiver always refuses it. */
  readonly poison: boolean;
}

/** Reads `--name value` from the command line, or `fallback`. */
export function flag(
  args: readonly string[],
  name: string,
): string | undefined {
  const i = args.indexOf(`--${name}`);
  return i === -1 ? undefined : args[i + 1];
}

/** Reads a positive integer flag. */
export function intFlag(
  args: readonly string[],
  name: string,
  fallback: number,
): number {
  const text = flag(args, name);
  if (text === undefined) return fallback;
  const value = Number(text);
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(
      `--${name} must be a non-negative integer: current value is ${text}`,
    );
  }
  return value;
}
