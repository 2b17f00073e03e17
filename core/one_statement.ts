/**
 * The lease rules' one-statement forms, for dialects that have them
 * (PostgreSQL, where every round trip costs): a claim, an acknowledgement,
 * and both at once, each outside a transaction, refusing (changing nothing)
 * whatever needs the general path's ledger entries or dead letters first.
 *
 * @module
 */
import { integerOf } from "../driver.ts";
import { decodePayload, nullableString } from "../admin.ts";
import type { OutboxCore } from "./context.ts";
import { hex, randomBytes } from "./enqueue.ts";
import type { CheckedLease } from "./ledger.ts";
import type { Lease } from "./shapes.ts";

/**
 * The claim as the dialect's one statement, when it has one: resolves to
 * the leases, or to `undefined` when the statement refused an
 * unclaimable candidate, having changed nothing of it (the general path
 * then makes it a dead letter). With `acknowledge`, the statement first
 * acknowledges those leases, all of them or, refusing, none.
 */
export function claimInOne<P>(
  core: OutboxCore,
  op: string,
  queue: string,
  leaseMs: number,
  max: number,
  acknowledge?: readonly CheckedLease[],
): ((now: number | null) => Promise<Lease<P>[] | undefined>) | undefined {
  const sql = acknowledge === undefined
    ? core.sql.claimInOne
    : core.sql.acknowledgeAndClaimInOne;
  if (sql === undefined) return undefined;
  return async (now) => {
    // 128 random bits per token, minted for every lease the claim may take.
    const tokens = hex(randomBytes(16 * max), 0, 16 * max);
    const rows = await core.driver.query(sql, [
      now,
      queue,
      max,
      core.maxPayloadBytes,
      leaseMs,
      tokens,
      ...acknowledge === undefined ? [] : [
        leasesJson(acknowledge),
      ],
    ]);
    core.checkNow(op, rows[0]?.["now"]);
    if (rows[0]?.["refused"] === 1) return undefined;
    return rows.filter((row) => row["id"] !== null).map((row) => ({
      eventId: integerOf(row, "id"),
      identity: String(row["identity"]),
      queue,
      token: String(row["token"]),
      fence: integerOf(row, "fence"),
      attempt: integerOf(row, "attempt"),
      maxAttempts: integerOf(row, "max_attempts"),
      leaseUntil: integerOf(row, "lease_until"),
      payload: decodePayload(row["payload_bytes"] ?? row["payload"]) as P,
      orderingKey: nullableString(row["ordering_key"]),
      lastError: nullableString(row["last_error"]),
    }));
  };
}

/**
 * The acknowledgement as the dialect's one statement, when it has one:
 * resolves to `true` per lease, or to `undefined` when a lease was stale
 * (or listed twice), having changed nothing: the general path then writes
 * the stale entries in order.
 */
export function acknowledgeInOne(
  core: OutboxCore,
  op: string,
  leases: readonly CheckedLease[],
): ((now: number | null) => Promise<boolean[] | undefined>) | undefined {
  const one = leases.length === 1;
  const sql = one ? core.sql.acknowledgeInOne : core.sql.acknowledgeAllInOne;
  if (sql === undefined) return undefined;
  return async (now) => {
    const [row] = await core.driver.query(
      sql,
      one ? [now, leases[0]!.eventId, leases[0]!.token, leases[0]!.fence] : [
        now,
        leasesJson(leases),
      ],
    );
    core.checkNow(op, row?.["now"]);
    return row?.["acknowledged"] === leases.length
      ? leases.map(() => true)
      : undefined;
  };
}

/**
 * Leases as the one-statement acknowledgements take them: a JSON array of
 * [event id, fence, token].
 */
function leasesJson(leases: readonly CheckedLease[]): string {
  return JSON.stringify(leases.map((l) => [l.eventId, l.fence, l.token]));
}
