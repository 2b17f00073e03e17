/**
 * A call that would wait for the transaction its caller's code runs in
 * (an outbox's `transaction(fn)`, an inbox's `accept(fn)`, on the same
 * connection) throws at once, and its message names the transaction
 * actually open there.
 */
import assert from "node:assert/strict";
import { Inbox, Outbox } from "../mod.ts";
import { DRIVERS } from "./drivers.ts";

const IDENTITY = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
const CASES = DRIVERS.filter((d) =>
  ["wasm memory", "node:sqlite file", "postgres"].includes(d.name)
);

for (const driver of CASES) {
  Deno.test(`${driver.name}: outbox.transaction() inside inbox.accept's fn on the same connection throws at once naming the acceptance, and nothing is recorded`, async () => {
    const connections = await driver.open(1);
    try {
      const db = connections.drivers[0]!;
      await using outbox = await Outbox.open(db);
      await using inbox = await Inbox.open(db);
      await assert.rejects(
        inbox.accept(IDENTITY, 1, async () => {
          await outbox.transaction((tx) => tx.enqueue({ x: 1 }));
        }),
        {
          name: "Error",
          message:
            "Cannot run transaction on the outbox inside an inbox's accept(fn) on the same connection: the acceptance's transaction is open there, and its handle runs SQL only (tx.run, tx.query); make the call after accept() returns, or it would wait for the transaction that waits for it",
        },
      );
      assert.equal((await outbox.stats()).pending, 0);
      assert.equal(
        (await inbox.accept(IDENTITY, 1, () => Promise.resolve("applied")))
          .status,
        "accepted",
      );
    } finally {
      await connections.close();
    }
  });

  Deno.test(`${driver.name}: inbox.accept() inside outbox.transaction's fn on the same connection throws at once naming the outbox's transaction, and nothing commits`, async () => {
    const connections = await driver.open(1);
    try {
      const db = connections.drivers[0]!;
      await using outbox = await Outbox.open(db);
      await using inbox = await Inbox.open(db);
      await assert.rejects(
        outbox.transaction(async (tx) => {
          await tx.enqueue({ x: 1 });
          await inbox.accept(IDENTITY, 1, () => Promise.resolve());
        }),
        {
          name: "Error",
          message:
            "Cannot accept inside an outbox's transaction(fn) on the same connection: use its handle (tx.run, tx.query), or the call would wait for the transaction that waits for it",
        },
      );
      assert.equal((await outbox.stats()).pending, 0);
    } finally {
      await connections.close();
    }
  });
}
