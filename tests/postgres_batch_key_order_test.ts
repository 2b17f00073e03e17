/**
 * Two batches holding the same dedup keys (or identities) in opposite
 * orders, enqueued at once on two connections of the real server: each
 * takes its keys' locks (their entries in outbox_keys' unique indexes) in
 * one canonical order, so neither waits for a key the other holds while
 * holding one the other waits for. No deadlock is detected (none of the
 * connections sees SQLSTATE 40P01, so nothing is rerun), and each key ends
 * with one event, which both batches answer.
 */
import assert from "node:assert/strict";
import type { Driver, Row, RunResult, SqlValue } from "../driver.ts";
import { connectPostgres, type PostgresDriver } from "../drivers/postgres.ts";
import {
  type Dialect,
  type EnqueueResult,
  Outbox,
  PostgresError,
} from "../mod.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { ManualClock } from "./helpers.ts";

/** A connection that counts the deadlocks the server reported to it. */
class DeadlockCounting implements Driver {
  deadlocks = 0;
  readonly dialect: Dialect;

  constructor(readonly inner: PostgresDriver) {
    this.dialect = inner.dialect;
  }

  #count<T>(call: Promise<T>): Promise<T> {
    return call.catch((error) => {
      if (error instanceof PostgresError && error.code === "40P01") {
        this.deadlocks++;
      }
      throw error;
    });
  }

  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]> {
    return this.#count(this.inner.query(sql, params));
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult> {
    return this.#count(this.inner.run(sql, params));
  }

  exec(sql: string): Promise<void> {
    return this.#count(this.inner.exec(sql));
  }

  inTransaction(): boolean {
    return this.inner.inTransaction();
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

const ROUNDS = 40;
const KEYS = 64;

/** The `i`th key of round `r`, UUID text so it serves as an identity too. */
const keyOf = (r: number, i: number) =>
  `0190b2c4-7d3e-7a11-8f00-${(r * KEYS + i).toString(16).padStart(12, "0")}`;

/**
 * Runs `ROUNDS` rounds of `enqueue` on two outboxes at once, the first
 * given a round's keys in order, the second reversed; answers each side's
 * results in key order, and the deadlocks the two connections saw.
 */
async function opposite(
  enqueue: (outbox: Outbox, keys: readonly string[]) => Promise<
    EnqueueResult[]
  >,
): Promise<
  { deadlocks: number; rounds: [EnqueueResult[], EnqueueResult[]][] }
> {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const clock = new ManualClock(1_000_000);
  const dbs = [
    new DeadlockCounting(
      await connectPostgres(server.url, { schema, listen: false }),
    ),
    new DeadlockCounting(
      await connectPostgres(server.url, { schema, listen: false }),
    ),
  ];
  const [a, b] = [
    await Outbox.open(dbs[0]!, { now: clock.now }),
    await Outbox.open(dbs[1]!, { now: clock.now }),
  ];
  try {
    const rounds: [EnqueueResult[], EnqueueResult[]][] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const keys = Array.from({ length: KEYS }, (_, i) => keyOf(r, i));
      const [forward, backward] = await Promise.all([
        enqueue(a, keys),
        enqueue(b, keys.toReversed()),
      ]);
      rounds.push([forward, backward.toReversed()]);
    }
    const [row] = await dbs[0]!.inner.query(
      "SELECT count(*)::integer AS events, count(DISTINCT identity)::integer AS identities FROM outbox_events",
    );
    assert.deepEqual(row, {
      events: ROUNDS * KEYS,
      identities: ROUNDS * KEYS,
    });
    return {
      deadlocks: dbs[0]!.deadlocks + dbs[1]!.deadlocks,
      rounds,
    };
  } finally {
    await a.close();
    await b.close();
  }
}

/** Asserts each key has one event, inserted by one side, met by the other. */
function assertOnePerKey(
  rounds: readonly [EnqueueResult[], EnqueueResult[]][],
): void {
  for (const [forward, backward] of rounds) {
    forward.forEach((mine, i) => {
      const theirs = backward[i]!;
      assert.equal(mine.eventId, theirs.eventId);
      assert.equal(mine.identity, theirs.identity);
      assert.notEqual(mine.deduplicated, theirs.deduplicated);
    });
  }
}

Deno.test("postgres: two batches with the same dedup keys in opposite orders, enqueued at once, never deadlock and map each key to one event", async () => {
  const { deadlocks, rounds } = await opposite((outbox, keys) =>
    outbox.enqueueBatch(
      keys.map((key) => ({ payload: { key }, dedupKey: key })),
    )
  );
  assert.equal(deadlocks, 0);
  assertOnePerKey(rounds);
});

Deno.test("postgres: two batches with the same identities in opposite orders, enqueued at once, never deadlock and map each identity to one event", async () => {
  const { deadlocks, rounds } = await opposite((outbox, keys) =>
    outbox.enqueueBatch(keys.map((key) => ({ payload: {}, identity: key })))
  );
  assert.equal(deadlocks, 0);
  assertOnePerKey(rounds);
  rounds.forEach(([forward], r) =>
    forward.forEach((result, i) => assert.equal(result.identity, keyOf(r, i)))
  );
});

Deno.test("postgres: two groups of concurrent enqueues with the same dedup keys in opposite orders never deadlock and map each key to one event", async () => {
  const { deadlocks, rounds } = await opposite((outbox, keys) =>
    Promise.all(
      keys.map((key) => outbox.enqueue({ key }, { dedupKey: key })),
    )
  );
  assert.equal(deadlocks, 0);
  assertOnePerKey(rounds);
});
