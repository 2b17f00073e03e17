/**
 * Ledger writing: the entries of `outbox_attempts` the lease rules record
 * (claims' own entries stay unwritten on the event row until the next
 * change to it writes them, see schema.sql's `outbox_unwritten_attempts`).
 *
 * @module
 */
import type { Driver } from "../driver.ts";
import type { Dialect } from "../types.ts";
import type { LedgerEntry } from "./shapes.ts";

/** A lease as the rules check it: event, token and fence. */
export interface CheckedLease {
  readonly eventId: number;
  readonly token: string;
  readonly fence: number;
}

/** For `Dialect.ledgerAll`: event id, fence, kind, token, lease_until, detail. */
export type LedgerRow = [
  number,
  number,
  LedgerEntry["kind"],
  string | null,
  number | null,
  string | null,
];

/** Writes ledger entries through a connection in a dialect. */
export class Ledger {
  readonly #driver: Driver;
  readonly #sql: Dialect;

  constructor(driver: Driver, sql: Dialect) {
    this.#driver = driver;
    this.#sql = sql;
  }

  /**
   * Writes the entries that events' rows still hold, before an entry that
   * must follow them or a change to what they are read from. `locked`
   * tells whether this transaction holds the rows already (claims' and
   * expiry's candidates); if not, the dialect's `lockEvents` takes them
   * first.
   */
  async writeUnwritten(
    eventIds: readonly number[],
    locked = true,
  ): Promise<void> {
    const ids = JSON.stringify(eventIds);
    if (!locked && this.#sql.lockEvents) {
      await this.#driver.query(this.#sql.lockEvents, [ids]);
    }
    await this.#driver.run(this.#sql.writeUnwritten, [ids]);
  }

  /** Writes ledger entries at `at`, in order, in one statement. */
  async all(entries: readonly LedgerRow[], at: number): Promise<void> {
    await this.#driver.run(this.#sql.ledgerAll, [at, JSON.stringify(entries)]);
  }

  /**
   * Records a stale call in the ledger, after the event's unwritten entries
   * (the caller writes those); the event row itself is untouched.
   */
  async stale(
    lease: CheckedLease,
    kind: LedgerEntry["kind"],
    now: number,
  ): Promise<void> {
    await this.#driver.run(this.#sql.stale, [
      lease.eventId,
      lease.fence,
      kind,
      now,
      lease.token,
    ]);
  }

  /** Writes one entry. */
  async entry(
    eventId: number,
    fence: number,
    kind: LedgerEntry["kind"],
    at: number,
    token: string | null = null,
    leaseUntil: number | null = null,
    detail: string | null = null,
  ): Promise<void> {
    await this.#driver.run(this.#sql.ledger, [
      eventId,
      fence,
      kind,
      at,
      token,
      leaseUntil,
      detail,
    ]);
  }
}
