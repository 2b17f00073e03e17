/**
 * How a lease's event ends outside a holder's release: acknowledged under
 * its fence and token (one lease, or a batch), made a dead letter as an
 * unclaimable candidate, or expired on its last attempt; each writes its
 * ledger entries. `lease.ts` decides when; these run the statements.
 *
 * @module
 */
import { integerOf, type Row } from "../driver.ts";
import { LEASE_EXPIRED } from "../admin.ts";
import type { OutboxCore } from "./context.ts";
import type { CheckedLease, LedgerRow } from "./ledger.ts";

/** What these need of an opened outbox. */
export type LeaseCore = Pick<OutboxCore, "driver" | "sql" | "ledger">;

/** Makes a candidate a dead letter with `reason`, in the ledger too. */
export async function deadLetter(
  core: LeaseCore,
  row: Row,
  reason: string,
  now: number,
): Promise<void> {
  const eventId = integerOf(row, "id");
  const fence = integerOf(row, "fence");
  const entries: LedgerRow[] = [];
  if (row["state"] === "leased") {
    await core.ledger.writeUnwritten([eventId]);
    entries.push([eventId, fence, "expired", null, null, LEASE_EXPIRED]);
  }
  entries.push([eventId, fence, "dead", null, null, reason]);
  await core.driver.run(core.sql.unclaimable, [now, reason, eventId]);
  await core.ledger.all(entries, now);
}

/**
 * Acknowledges one lease with plain statements: the batch's JSON would
 * cost a lone call more than its SQL does.
 */
export async function acknowledgeOne(
  core: LeaseCore,
  lease: CheckedLease,
  now: number,
): Promise<boolean> {
  const { changes } = await core.driver.run(core.sql.acknowledge, [
    now,
    lease.eventId,
    lease.token,
    lease.fence,
  ]);
  if (changes === 0) {
    await core.ledger.writeUnwritten([lease.eventId], false);
    await core.ledger.stale(lease, "stale_acknowledge", now);
    return false;
  }
  return true;
}

/** Acknowledges a batch of leases, in the order given. */
export async function acknowledgeAll(
  core: LeaseCore,
  leases: readonly CheckedLease[],
  now: number,
): Promise<boolean[]> {
  if (leases.length === 0) return [];
  // Usually every lease is current and listed once, and then the count
  // of changed rows says so: reading them back (RETURNING) cost a fifth of
  // the batch. A lease listed twice leaves one key in the object.
  await core.driver.run(core.sql.savepoint);
  const { changes } = await core.driver.run(core.sql.acknowledgeAll, [
    now,
    JSON.stringify(
      Object.fromEntries(
        leases.map((l) => [l.eventId, `${l.fence}:${l.token}`]),
      ),
    ),
  ]);
  if (changes === leases.length) {
    await core.driver.run(core.sql.releaseSavepoint);
    return leases.map(() => true);
  }
  // Some lease is stale, or listed twice (stale the second time): one at
  // a time, in the order of the calls, as the ledger records them.
  await core.driver.run(core.sql.rollbackToSavepoint);
  await core.driver.run(core.sql.releaseSavepoint);
  // Their rows first, in the dialect's one order (PostgreSQL's lockEvents:
  // by id), not the calls': two batches sharing leases in other orders
  // would each hold a row the other waits for.
  if (core.sql.lockEvents !== undefined) {
    await core.driver.query(core.sql.lockEvents, [
      JSON.stringify(leases.map((lease) => lease.eventId)),
    ]);
  }
  const results = [];
  for (const lease of leases) {
    results.push(await acknowledgeOne(core, lease, now));
  }
  return results;
}

/** Makes the exhausted leases `rows` (id, fence) dead letters. */
export async function expireLeases(
  core: LeaseCore,
  rows: readonly Row[],
  now: number,
): Promise<void> {
  if (rows.length === 0) return;
  const eventIds = rows.map((row) => integerOf(row, "id"));
  await core.ledger.writeUnwritten(eventIds);
  await core.driver.run(core.sql.expire, [now, JSON.stringify(eventIds)]);
  await core.ledger.all(
    rows.flatMap((row): LedgerRow[] => {
      const eventId = integerOf(row, "id");
      const fence = integerOf(row, "fence");
      return [
        [eventId, fence, "expired", null, null, LEASE_EXPIRED],
        [eventId, fence, "dead", null, null, LEASE_EXPIRED],
      ];
    }),
    now,
  );
}
