/**
 * The general claim path, the lease rules' own (the one-statement forms in
 * `core/one_statement.ts` take the common cases): read the candidates in
 * claim order past the flow gate, make the unclaimable ones dead letters,
 * mint tokens, write the lapsed leases' entries, and claim the rows, all
 * inside the caller's transaction. Moved out of `lease.ts` unchanged.
 *
 * @module
 */
import { integerOf, type Row } from "../driver.ts";
import type { Lease } from "./shapes.ts";
import { LEASE_EXPIRED, nullableString } from "../admin.ts";
import { hex, randomBytes } from "./enqueue.ts";
import { successor, unclaimableReason } from "./arguments.ts";
import { deadLetter } from "./lease_ends.ts";
import { admit, flowOf, openGate } from "./flow.ts";
import type { LedgerRow } from "./ledger.ts";
import type { OutboxCore } from "./context.ts";

/**
 * Claims up to `max` events of `queue` at `now` for `leaseMs`, with `token`
 * (a caller's) or minted ones.
 *
 * @throws {RangeError} When a caller's `token` was used on an event before.
 * @throws {Error} When the claim's UPDATE missed a row (the caller's
 *   transaction rolls back).
 */
export async function claimCandidates<P>(
  core: OutboxCore,
  op: string,
  queue: string,
  leaseMs: number,
  max: number,
  token: string | undefined,
  now: number,
): Promise<Lease<P>[]> {
  const gate = await openGate(
    core.driver,
    flowOf(core.sql),
    queue,
    now,
    max,
  );
  if (gate.max === 0) return [];
  let candidates: Row[] = [];
  let payloads: unknown[] = [];
  // An unclaimable row is a dead letter once seen, but the claimable rows
  // read beside it are still pending and would be read again: each round
  // reads the whole batch afresh, until a round finds no unclaimable row,
  // so the batch fills as if those had never been there.
  for (let unclaimable = true; unclaimable;) {
    unclaimable = false;
    candidates = [];
    payloads = [];
    const rows = await core.driver.query(core.sql.candidates, [
      queue,
      now,
      gate.max,
      core.maxPayloadBytes,
      gate.perKey,
    ]);
    for (const row of rows) {
      const reason = unclaimableReason(
        row,
        payloads,
        core.maxPayloadBytes,
      );
      if (reason === undefined) {
        candidates.push(row);
        continue;
      }
      unclaimable = true;
      await deadLetter(core, row, reason, now);
    }
  }
  [candidates, payloads] = await admit(gate, candidates, payloads);
  if (candidates.length === 0) return [];
  const leaseUntil = now + leaseMs;
  const expired: LedgerRow[] = [];
  // 128 random bits per minted token (32 hex digits), drawn at once for
  // the batch.
  const random = randomBytes(
    token === undefined ? 16 * candidates.length : 0,
  );
  // Each lease is its row as read plus what the claim's UPDATE changes
  // (CLAIM_SET in dialects/sqlite.ts).
  const leases = candidates.map((row, i): Lease<P> => {
    const eventId = integerOf(row, "id");
    const fence = integerOf(row, "fence");
    const taken = row["state"] === "leased";
    // Taking over a lapsed lease records how the previous attempt ended,
    // before the claim's own entry.
    if (taken) {
      expired.push([eventId, fence, "expired", null, null, LEASE_EXPIRED]);
    }
    return {
      eventId,
      identity: String(row["identity"]),
      queue,
      token: token ?? hex(random, 16 * i, 16),
      fence: successor("fence", fence),
      attempt: successor("attempt", integerOf(row, "attempt")),
      maxAttempts: integerOf(row, "max_attempts"),
      leaseUntil,
      payload: payloads[i] as P,
      orderingKey: nullableString(row["ordering_key"]),
      lastError: taken ? LEASE_EXPIRED : nullableString(row["last_error"]),
    };
  });
  if (token !== undefined) {
    for (const { eventId } of leases) {
      const used = await core.driver.query(core.sql.tokenUsed, [
        eventId,
        token,
      ]);
      if (used.length > 0) {
        throw new RangeError(
          `Cannot ${op} as 'token' was used on event ${eventId} before: reuse would let a stale worker act`,
        );
      }
    }
  }
  if (expired.length > 0) {
    await core.ledger.writeUnwritten(expired.map(([eventId]) => eventId));
    await core.ledger.all(expired, now);
  }
  // The claims' own entries stay unwritten (schema.sql's
  // outbox_unwritten_attempts).
  let changes;
  if (leases.length === 1) {
    const { eventId, token: leaseToken } = leases[0]!;
    ({ changes } = await core.driver.run(core.sql.claimOne, [
      leaseUntil,
      now,
      eventId,
      leaseToken,
    ]));
  } else {
    ({ changes } = await core.driver.run(core.sql.claim, [
      leaseUntil,
      now,
      JSON.stringify(
        Object.fromEntries(leases.map((l) => [l.eventId, l.token])),
      ),
    ]));
  }
  // A lease whose row the UPDATE missed would leave its event claimable
  // by the next caller: two live holders.
  if (changes !== leases.length) {
    throw new Error(
      `Cannot ${op} as the claim changed ${changes} event rows for ${leases.length} leases: the transaction was rolled back`,
    );
  }
  // The per-key limit passed over candidates the batch had read in place
  // of other keys' events: another round, which sees these leases, fills
  // the batch with those.
  if (gate.keyTrimmed && leases.length < max) {
    const more = max - leases.length;
    leases.push(
      ...await claimCandidates<P>(core, op, queue, leaseMs, more, token, now),
    );
  }
  return leases;
}
