/**
 * A PostgreSQL session lost while its transaction sits idle between two
 * statements: terminated by `pg_terminate_backend`, or ended by the
 * server's `idle_in_transaction_session_timeout`. No statement failed, so
 * the caller gets `ConnectionLostError` (not `TransactionEndedError`),
 * nothing of the transaction commits, and the next call reconnects: for
 * `transaction(fn)`, `inbox.accept(fn)` and a reader's `snapshot(fn)`.
 */
import assert from "node:assert/strict";
import { connectPostgres, type PostgresDriver } from "../drivers/postgres.ts";
import {
  ConnectionLostError,
  Inbox,
  Outbox,
  TransactionEndedError,
} from "../mod.ts";
import { OutboxReader } from "../reader.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";

const IDENTITY = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";

async function fresh(): Promise<{ url: string; schema: string }> {
  const server = await sharedPostgres();
  return { url: server.url, schema: await server.createSchema() };
}

/** Resolves once `driver` no longer reports an open transaction (5 ms polls). */
async function untilNotOpen(driver: PostgresDriver): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (driver.transactionStatus() === "open") {
    if (Date.now() > deadline) throw new Error("the session never ended");
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Ends the session of `pid` from `admin`, and waits for `driver` to see it. */
async function terminate(
  admin: PostgresDriver,
  driver: PostgresDriver,
  pid: unknown,
): Promise<void> {
  await admin.query("SELECT pg_terminate_backend($1, 5000)", [Number(pid)]);
  await untilNotOpen(driver);
}

/** Asserts `error` is the runner's ConnectionLostError for `op`. */
function assertLost(error: unknown, op: string): void {
  assert.ok(
    error instanceof ConnectionLostError &&
      !(error instanceof TransactionEndedError),
    String(error),
  );
  assert.equal(
    error.message,
    `Cannot ${op} as the connection was lost inside the transaction: the server rolled it back, and nothing of it commits`,
  );
}

async function count(admin: PostgresDriver, table: string): Promise<number> {
  const [row] = await admin.query(`SELECT count(*)::int AS n FROM ${table}`);
  return Number(row?.["n"]);
}

for (const caught of [false, true]) {
  Deno.test(
    `postgres: a session terminated while idle inside transaction(fn) fails the next tx calls with ConnectionLostError, and transaction() too when fn ${
      caught ? "catches them and returns" : "rethrows"
    }; nothing commits and the next call reconnects`,
    async () => {
      const { url, schema } = await fresh();
      await using admin = await connectPostgres(url, { schema });
      await using driver = await connectPostgres(url, { schema });
      await driver.exec("CREATE TABLE orders (id int PRIMARY KEY)");
      await using outbox = await Outbox.open(driver);
      const inside: unknown[] = [];
      const outcome = await outbox.transaction(async (tx) => {
        await tx.run("INSERT INTO orders VALUES (1)");
        await tx.enqueue({ order: 1 });
        const [row] = await tx.query("SELECT pg_backend_pid() AS pid");
        await terminate(admin, driver, row?.["pid"]);
        try {
          await tx.enqueue({ order: 2 });
        } catch (error) {
          inside.push(error);
          if (!caught) throw error;
        }
        await tx.run("INSERT INTO orders VALUES (2)").catch((error) =>
          inside.push(error)
        );
        return "returned";
      }).then((value) => value, (error) => error);
      assert.equal(inside.length, caught ? 2 : 1);
      assertLost(inside[0], "enqueue");
      if (caught) assertLost(inside[1], "run");
      assertLost(outcome, caught ? "run transaction" : "enqueue");
      assert.equal(await count(admin, "orders"), 0);
      assert.equal(await count(admin, "outbox_events"), 0);
      await outbox.enqueue({ after: 1 });
      assert.equal(await count(admin, "outbox_events"), 1);
    },
  );
}

Deno.test("postgres: a session terminated while idle inside inbox.accept(fn) fails the next tx call and accept() with ConnectionLostError; nothing is recorded and the retry is accepted once", async () => {
  const { url, schema } = await fresh();
  await using admin = await connectPostgres(url, { schema });
  await using driver = await connectPostgres(url, { schema });
  await using inbox = await Inbox.open(driver);
  await driver.exec("CREATE TABLE mail (n int)");
  let inside: unknown;
  const outcome = await inbox.accept(IDENTITY, 1, async (tx) => {
    await tx.run("INSERT INTO mail VALUES (1)");
    const [row] = await tx.query("SELECT pg_backend_pid() AS pid");
    await terminate(admin, driver, row?.["pid"]);
    await tx.run("INSERT INTO mail VALUES (2)").catch((error) => {
      inside = error;
    });
  }).then((value) => value, (error) => error);
  assertLost(inside, "run");
  assertLost(outcome, "accept");
  assert.equal(await count(admin, "mail"), 0);
  const again = await inbox.accept(IDENTITY, 1, async (tx) => {
    await tx.run("INSERT INTO mail VALUES (9)");
  });
  assert.equal(again.status, "accepted");
  assert.equal(await count(admin, "mail"), 1);
});

Deno.test("postgres: a session terminated while idle inside a reader's snapshot(fn) fails its next read with ConnectionLostError, and the next read reconnects", async () => {
  const { url, schema } = await fresh();
  await using admin = await connectPostgres(url, { schema });
  await (await Outbox.open(admin)).enqueue({ order: 1 });
  await using driver = await connectPostgres(url, { schema });
  await using reader = await OutboxReader.open(driver);
  const outcome = await reader.snapshot(async () => {
    await reader.databaseNow();
    const [row] = await admin.query(
      "SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database() AND pid <> pg_backend_pid()",
    );
    await terminate(admin, driver, row?.["pid"]);
    return await reader.queues();
  }).then((value) => value, (error) => error);
  assertLost(outcome, "run the statement");
  const [queue] = await reader.queues();
  assert.equal(queue?.pending, 1);
});

Deno.test("postgres: a transaction(fn) idle past idle_in_transaction_session_timeout fails with ConnectionLostError, whether fn makes another tx call or returns; nothing commits", async () => {
  const server = await sharedPostgres();
  const url = await server.createDatabase();
  {
    await using setup = await connectPostgres(url);
    await setup.exec(
      `ALTER DATABASE ${
        new URL(url).pathname.slice(1)
      } SET idle_in_transaction_session_timeout = '200ms'`,
    );
  }
  await using admin = await connectPostgres(url);
  await using driver = await connectPostgres(url);
  await using outbox = await Outbox.open(driver);
  for (const another of [true, false]) {
    const outcome = await outbox.transaction(async (tx) => {
      await tx.enqueue({ first: 1 });
      // Real time is the subject: the server's timer ends the session.
      await untilNotOpen(driver);
      if (another) await tx.enqueue({ second: 1 });
    }).then((value) => value, (error) => error);
    assertLost(outcome, another ? "enqueue" : "run transaction");
  }
  assert.equal(await count(admin, "outbox_events"), 0);
});
