/**
 * The transaction boundary, where the engine decides: a statement that
 * ends or fails the transaction (caught or not), a COMMIT the engine
 * answers with a rollback, a call made beside the application's
 * transaction on a shared handle, an inbox's error answer. Each test is
 * one of issue #34's six situations, on every driver it applies to.
 */
import assert from "node:assert/strict";
import type { Driver } from "../driver.ts";
import {
  deliveryHeaders,
  Inbox,
  Outbox,
  TransactionEndedError,
} from "../mod.ts";
import { type DriverCase, DRIVERS } from "./drivers.ts";

const ON = ["wasm file", "node:sqlite file", "postgres"];
const CASES = DRIVERS.filter((d) => ON.includes(d.name));
const SQLITE = CASES.filter((d) => d.engine === "sqlite");
const POSTGRES = CASES.filter((d) => d.engine === "postgres");
const IDENTITY = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";

/** Registers one test per driver, with a fresh database holding `orders`. */
function test(
  cases: readonly DriverCase[],
  name: string,
  fn: (db: Driver, cases: DriverCase) => Promise<void>,
): void {
  for (const driver of cases) {
    Deno.test(`${driver.name}: ${name}`, async () => {
      const connections = await driver.open(1);
      const db = connections.drivers[0]!;
      try {
        await db.exec(
          "CREATE TABLE orders (id INTEGER PRIMARY KEY); CREATE TABLE effects (id INTEGER PRIMARY KEY)",
        );
        if (driver.engine === "sqlite") {
          // Statements after which SQLite rolls the whole transaction back.
          await db.exec(
            "CREATE TABLE guard (x INTEGER); CREATE TRIGGER guard_rollback BEFORE INSERT ON guard BEGIN SELECT RAISE(ROLLBACK, 'refused'); END",
          );
        }
        await fn(db, driver);
      } finally {
        await connections.close();
      }
    });
  }
}

async function count(db: Driver, table: string): Promise<number> {
  const [row] = await db.query(`SELECT count(*) AS n FROM ${table}`);
  return Number(row?.["n"]);
}

/** SQLite's statements that end the transaction (a trigger's, a conflict's). */
const ENDING = [
  "INSERT INTO guard VALUES (1)",
  "INSERT OR ROLLBACK INTO orders (id) VALUES (1)",
];

test(
  POSTGRES,
  "a statement fn catches fails the transaction: transaction() and tx.acknowledge's transaction reject with TransactionEndedError and commit nothing",
  async (db) => {
    await using outbox = await Outbox.open(db);
    await assert.rejects(
      outbox.transaction(async (tx) => {
        await tx.run("INSERT INTO orders (id) VALUES (1)");
        await tx.enqueue({ order: 1 });
        // Best effort, as application code often does.
        await tx.run("INSERT INTO orders (id) VALUES (1)").catch(() => {});
        return "done";
      }),
      (error: unknown) =>
        error instanceof TransactionEndedError && error.status === "failed" &&
        error.statement === "INSERT INTO orders (id) VALUES (1)",
    );
    assert.equal(await count(db, "orders"), 0);
    assert.equal(await count(db, "outbox_events"), 0);

    await outbox.enqueue("work");
    const lease = await outbox.claim();
    await assert.rejects(
      outbox.transaction(async (tx) => {
        await tx.run("INSERT INTO effects (id) VALUES (1)");
        await tx.acknowledge(lease!);
        await tx.run("INSERT INTO effects (id) VALUES (1)").catch(() => {});
      }),
      TransactionEndedError,
    );
    assert.equal(await count(db, "effects"), 0);
    assert.equal((await outbox.explain(lease!.eventId))?.state, "leased");
  },
);

test(
  SQLITE,
  "a statement that rolls SQLite's transaction back, caught by fn: later tx calls throw TransactionEndedError and nothing runs in autocommit",
  async (db) => {
    await using outbox = await Outbox.open(db);
    for (const ending of ENDING) {
      await db.exec("DELETE FROM orders");
      let later: unknown;
      await assert.rejects(
        outbox.transaction(async (tx) => {
          await tx.run("INSERT INTO orders (id) VALUES (1)");
          await tx.run(ending).catch(() => {});
          later = await tx.enqueue({ order: 1 }).catch((error) => error);
          await tx.run("INSERT INTO effects (id) VALUES (1)");
        }),
        (error: unknown) =>
          error instanceof TransactionEndedError && error.status === "ended" &&
          error.statement === ending,
      );
      assert.ok(later instanceof TransactionEndedError, String(later));
      assert.match(later.message, /^Cannot enqueue as the engine rolled/);
      assert.equal(await count(db, "orders"), 0, ending);
      assert.equal(await count(db, "outbox_events"), 0, ending);
      assert.equal(await count(db, "effects"), 0, ending);
    }

    await outbox.enqueue("work");
    const lease = await outbox.claim();
    await db.exec("DELETE FROM orders");
    await assert.rejects(
      outbox.transaction(async (tx) => {
        await tx.run("INSERT INTO effects (id) VALUES (1)");
        await tx.run(ENDING[0]!).catch(() => {});
        // Caught too: the transaction still rejects, and nothing commits.
        await tx.acknowledge(lease!).catch(() => {});
      }),
      TransactionEndedError,
    );
    assert.equal(await count(db, "effects"), 0);
    assert.equal((await outbox.explain(lease!.eventId))?.state, "leased");
  },
);

test(
  CASES,
  "an inbox effect whose statement ends or fails the transaction, caught by fn, records no identity, so the redelivery applies the effect",
  async (db, driver) => {
    await using inbox = await Inbox.open(db);
    // SQLite's trigger rolls the transaction back; PostgreSQL's duplicate
    // key leaves it failed.
    const ending = driver.engine === "sqlite"
      ? ENDING[0]!
      : "INSERT INTO effects (id) VALUES (1)";
    await assert.rejects(
      inbox.accept(IDENTITY, 1, async (tx) => {
        await tx.run("INSERT INTO effects (id) VALUES (1)");
        await tx.run(ending).catch(() => {});
      }),
      (error: unknown) =>
        error instanceof TransactionEndedError && error.statement === ending &&
        error.status === (driver.engine === "sqlite" ? "ended" : "failed"),
    );
    assert.equal(db.transactionStatus?.(), "idle");
    assert.equal(await count(db, "inbox_accepted"), 0);
    assert.equal(await count(db, "effects"), 0);
    const again = await inbox.accept(IDENTITY, 1, async (tx) => {
      await tx.run("INSERT INTO effects (id) VALUES (1)");
    });
    assert.equal(again.status, "accepted");
    assert.equal(await count(db, "effects"), 1);
    assert.equal(await count(db, "inbox_accepted"), 1);
  },
);

test(
  POSTGRES,
  "the driver's COMMIT of a failed transaction, which the server answers with ROLLBACK, rejects with TransactionEndedError",
  async (db) => {
    await db.exec("BEGIN");
    await db.run("INSERT INTO orders (id) VALUES (1)");
    await assert.rejects(db.run("INSERT INTO orders (id) VALUES (1)"));
    assert.equal(db.transactionStatus?.(), "failed");
    await assert.rejects(
      db.run("COMMIT"),
      (error: unknown) =>
        error instanceof TransactionEndedError && error.status === "failed",
    );
    assert.equal(db.transactionStatus?.(), "idle");
    assert.equal(await count(db, "orders"), 0);
  },
);

/** Gives calls started before it every chance to run, a few timer turns. */
async function turns(): Promise<void> {
  for (let i = 0; i < 20; i++) {
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

function begin(driver: DriverCase): string {
  return driver.engine === "sqlite" ? "BEGIN IMMEDIATE" : "BEGIN";
}

test(
  CASES,
  "an enqueue made beside the application's transaction on a shared handle does not join it: it waits, and the application's ROLLBACK takes back only what was made inside outbox.within",
  async (db, driver) => {
    await using outbox = await Outbox.open(db);
    // Request A, on the application's handle.
    await db.exec(begin(driver));
    await db.run("INSERT INTO orders (id) VALUES (1)");
    await outbox.within(() => outbox.enqueue("A's"));
    // Request B, not part of A.
    const other = outbox.enqueue("B's");
    await turns();
    await db.exec("ROLLBACK");
    const { eventId } = await other;
    assert.equal((await outbox.explain(eventId))?.state, "pending");
    assert.deepEqual(
      (await outbox.list({ state: "pending" })).map((e) => e.payload),
      ["B's"],
    );
    assert.equal(await count(db, "orders"), 0);
  },
);

test(
  CASES,
  "an inbox beside the application's transaction on a shared handle waits for it to end, then accepts in its own transaction",
  async (db, driver) => {
    await using inbox = await Inbox.open(db);
    await db.exec(begin(driver));
    await db.run("INSERT INTO orders (id) VALUES (1)");
    const accepting = inbox.accept(IDENTITY, 1, async (tx) => {
      await tx.run("INSERT INTO effects (id) VALUES (1)");
    });
    await turns();
    await db.exec("ROLLBACK");
    assert.equal((await accepting).status, "accepted");
    assert.equal(await count(db, "effects"), 1);
    assert.equal(await count(db, "inbox_accepted"), 1);
    assert.equal(await count(db, "orders"), 0);
  },
);

test(
  CASES,
  "an accept made inside inbox.within joins the application's transaction: its ROLLBACK takes back the effect and the identity",
  async (db, driver) => {
    await using inbox = await Inbox.open(db);
    await db.exec(begin(driver));
    const result = await inbox.within(() =>
      inbox.accept(IDENTITY, 1, async (tx) => {
        await tx.run("INSERT INTO effects (id) VALUES (1)");
      })
    );
    assert.equal(result.status, "accepted");
    assert.equal(db.transactionStatus?.(), "open");
    await db.exec("ROLLBACK");
    assert.equal(await count(db, "effects"), 0);
    assert.equal(await count(db, "inbox_accepted"), 0);
  },
);

for (const status of [503, 500, 429, 408]) {
  test(
    CASES,
    `acceptRequest's fn answering ${status} rolls its effect back and records nothing, so the sender's retry applies it`,
    async (db) => {
      await using inbox = await Inbox.open(db);
      const deliver = (answer: number) =>
        inbox.acceptRequest(
          new Request("http://x/", {
            method: "POST",
            headers: deliveryHeaders({ identity: IDENTITY, fence: 1 }),
          }),
          async (tx) => {
            await tx.run("INSERT INTO effects (id) VALUES (1)");
            return new Response("answer", { status: answer });
          },
        );
      assert.equal((await deliver(status)).status, status);
      assert.equal(await count(db, "effects"), 0);
      assert.equal(await count(db, "inbox_accepted"), 0);
      assert.equal((await deliver(200)).status, 200);
      assert.equal(await count(db, "effects"), 1);
      assert.equal(await count(db, "inbox_accepted"), 1);
      const again = await deliver(200);
      assert.equal(await again.text(), "duplicate");
    },
  );
}

test(
  CASES,
  "acceptRequest's fn answering a final 4xx commits its effect and records the identity",
  async (db) => {
    await using inbox = await Inbox.open(db);
    const response = await inbox.acceptRequest(
      new Request("http://x/", {
        method: "POST",
        headers: deliveryHeaders({ identity: IDENTITY, fence: 1 }),
      }),
      async (tx) => {
        await tx.run("INSERT INTO effects (id) VALUES (1)");
        return new Response("refused", { status: 422 });
      },
    );
    assert.equal(response.status, 422);
    assert.equal(await count(db, "effects"), 1);
    assert.equal(await count(db, "inbox_accepted"), 1);
  },
);
