/**
 * Round trips per claim and acknowledgement on PostgreSQL, counted at the
 * driver: node-postgres sends one statement and waits for its answer before
 * the next, so each `query`, `run` or `exec` is one round trip. The counts
 * are pinned so that they cannot creep back up.
 */
import assert from "node:assert/strict";
import type { Driver, Row, RunResult, SqlValue } from "../driver.ts";
import { connectPostgres, type PostgresDriver } from "../drivers/postgres.ts";
import { type Dialect, type Lease, Outbox } from "../mod.ts";
import { sharedPostgres } from "./postgres_server.ts";

/** A connection that records every statement it sends. */
class CountingDriver implements Driver {
  readonly sent: string[] = [];
  constructor(readonly inner: PostgresDriver) {}

  query(sql: string, params?: readonly SqlValue[]): Promise<Row[]> {
    this.sent.push(sql);
    return this.inner.query(sql, params);
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<RunResult> {
    this.sent.push(sql);
    return this.inner.run(sql, params);
  }

  exec(sql: string): Promise<void> {
    this.sent.push(sql);
    return this.inner.exec(sql);
  }

  get dialect(): Dialect {
    return this.inner.dialect;
  }

  inTransaction(): boolean {
    return this.inner.inTransaction();
  }

  close(): Promise<void> {
    return this.inner.close();
  }

  /** The statements sent while `fn` ran. */
  async during(fn: () => Promise<unknown>): Promise<string[]> {
    const start = this.sent.length;
    await fn();
    return this.sent.slice(start);
  }
}

async function open(
  options: { now?: () => number } = {},
): Promise<{ outbox: Outbox; db: CountingDriver }> {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  const db = new CountingDriver(
    await connectPostgres(server.url, { schema, listen: false }),
  );
  const outbox = await Outbox.open(db, options);
  return { outbox, db };
}

for (
  const [clock, options] of [
    ["the server's clock", {}],
    ["an injected clock", { now: () => 1_000_000 }],
  ] as const
) {
  Deno.test(`postgres round trips (${clock}): a single claim is one, its acknowledgement one`, async () => {
    const { outbox, db } = await open(options);
    try {
      await outbox.enqueue({ n: 1 });
      let lease;
      const claim = await db.during(async () => lease = await outbox.claim());
      const ack = await db.during(() => outbox.acknowledge(lease!));
      assert.deepEqual([claim.length, ack.length], [1, 1]);
      assert.equal((await outbox.stats()).done, 1);
    } finally {
      await outbox.close();
    }
  });

  Deno.test(`postgres round trips (${clock}): a batch of 256 is one to claim and one to acknowledge`, async () => {
    const { outbox, db } = await open(options);
    try {
      await outbox.transaction(async (tx) => {
        for (let i = 0; i < 256; i++) await tx.enqueue({ i });
      });
      let leases: Lease[] = [];
      const claim = await db.during(async () =>
        leases = await outbox.claim({ max: 256 })
      );
      assert.equal(leases.length, 256);
      let acked: boolean[] = [];
      const ack = await db.during(async () =>
        acked = await outbox.acknowledge(leases)
      );
      assert.ok(acked.every((ok) => ok));
      assert.deepEqual([claim.length, ack.length], [1, 1]);
      assert.equal((await outbox.stats()).done, 256);
    } finally {
      await outbox.close();
    }
  });
}
