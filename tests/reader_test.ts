import assert from "node:assert/strict";
import { join } from "node:path";
import { Outbox } from "../lease.ts";
import { OutboxReader } from "../reader.ts";
import { SchemaVersionError } from "../errors.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { ManualClock } from "./helpers.ts";

/** A file with events in every state, and a read-only connection to it. */
async function fixture() {
  const dir = await Deno.makeTempDir({ prefix: "reader-test-" });
  const path = join(dir, "outbox.db");
  const clock = new ManualClock(1_000_000);
  // A rollback journal: its snapshot holds writers back (see below).
  const outbox = await Outbox.open(
    await openSqliteWasm(path, { journalMode: "truncate" }),
    {
      now: clock.now,
      maxAttempts: 1,
      busyTimeoutMs: 100,
    },
  );
  const ids = [];
  for (const queue of ["mail", "mail", "mail", "webhooks"]) {
    ids.push((await outbox.enqueue({ queue }, { queue })).eventId);
    clock.advance(10);
  }
  const first = await outbox.claim({ queue: "mail" });
  await outbox.acknowledge(first!);
  const second = await outbox.claim({ queue: "mail" });
  await outbox.release(second!, { error: "refused" });
  await outbox.claim({ queue: "mail" });
  const readOnly = () =>
    openSqliteWasm(new URL(`file://${path}?mode=ro`), { busyTimeoutMs: 0 });
  return {
    dir,
    path,
    clock,
    outbox,
    ids,
    readOnly,
    async [Symbol.asyncDispose]() {
      await outbox.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

Deno.test("OutboxReader reads counts, lists and ledgers through a read-only connection, as Outbox does", async () => {
  await using f = await fixture();
  await using reader = await OutboxReader.open(await f.readOnly());
  assert.deepEqual(await reader.queues(), await f.outbox.queues());
  for (const state of ["pending", "leased", "done", "dead"] as const) {
    assert.deepEqual(
      await reader.list({ state }),
      await f.outbox.list({ state }),
    );
  }
  assert.deepEqual(
    await reader.list({ state: "pending", queue: "mail" }),
    [],
  );
  const explained = await f.outbox.explain(f.ids[1]!);
  assert.deepEqual(await reader.explain(f.ids[1]!), explained);
  assert.deepEqual(await reader.explain(explained!.identity), explained);
  assert.equal(await reader.explain(99), null);
  assert.deepEqual(
    [...await reader.acknowledgedSince(1_000_000)],
    [["mail", 1]],
  );
  assert.deepEqual([...await reader.acknowledgedSince(1_000_041)], []);
});

Deno.test("OutboxReader runs reads called together one after another, and a snapshot's reads in one transaction", async () => {
  await using f = await fixture();
  await using reader = await OutboxReader.open(await f.readOnly());
  const [queues, pending, dead] = await Promise.all([
    reader.queues(),
    reader.list({ state: "pending" }),
    reader.list({ state: "dead" }),
  ]);
  assert.equal(queues.length, 2);
  assert.deepEqual(pending.map((e) => e.queue), ["webhooks"]);
  assert.deepEqual(dead.map((e) => e.lastError), ["refused"]);

  // A writer cannot commit while the snapshot holds its read lock.
  const blocked = await reader.snapshot(async () => {
    await reader.queues();
    const error = await f.outbox.enqueue({ late: true }).then(
      () => undefined,
      (error: Error) => error.name,
    );
    return [error, (await reader.queues())[1]?.pending];
  });
  assert.deepEqual(blocked, ["BusyError", 1]);
});

Deno.test("OutboxReader refuses a database without an outbox, or with another schema version, and writes nothing to it", async () => {
  const dir = await Deno.makeTempDir({ prefix: "reader-test-" });
  const path = join(dir, "other.db");
  {
    await using db = await openSqliteWasm(path);
    await db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
  }
  const before = await Deno.readFile(path);
  await assert.rejects(
    async () => await OutboxReader.open(await openSqliteWasm(path)),
    {
      name: "Error",
      message:
        "Cannot open outbox reader as the database has no outbox (no table outbox_events)",
    },
  );
  assert.deepEqual(await Deno.readFile(path), before);
  {
    await using db = await openSqliteWasm(path);
    await db.exec(
      "CREATE TABLE outbox_events (id INTEGER PRIMARY KEY); CREATE TABLE outbox_schema (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL); INSERT INTO outbox_schema VALUES (2, 0)",
    );
  }
  await assert.rejects(
    async () => await OutboxReader.open(await openSqliteWasm(path)),
    /has outbox schema version 2, not \d: Outbox.open upgrades an older one$/,
  );
  // A newer file is no older one to upgrade: a newer release reads it.
  {
    await using db = await openSqliteWasm(path);
    await db.exec("INSERT INTO outbox_schema VALUES (99, 0)");
  }
  await assert.rejects(
    async () => await OutboxReader.open(await openSqliteWasm(path)),
    (error) => {
      assert.ok(error instanceof SchemaVersionError);
      assert.equal(error.version, 99);
      assert.equal(
        error.message,
        `Cannot open outbox reader as the database has outbox schema version 99, newer than this release's ${error.supported}: run a release that knows version 99`,
      );
      return true;
    },
  );
  await Deno.remove(dir, { recursive: true });
});

Deno.test("OutboxReader checks its arguments before any SQL, naming the field", async () => {
  await using f = await fixture();
  await using reader = await OutboxReader.open(await f.readOnly());
  await assert.rejects(() => reader.list({ state: "sleeping" as "dead" }), {
    name: "TypeError",
    message:
      'Cannot list events as \'state\' must be "pending", "leased", "done" or "dead": current value is "sleeping"',
  });
  await assert.rejects(() => reader.list({ state: "dead", limit: 0 }), {
    name: "RangeError",
  });
  await assert.rejects(() => reader.explain(0), { name: "RangeError" });
  await assert.rejects(() => reader.explain("not-a-uuid"), {
    name: "TypeError",
  });
  await assert.rejects(() => reader.acknowledgedSince(-1), {
    name: "RangeError",
  });
  await assert.rejects(
    async () =>
      await OutboxReader.open(await f.readOnly(), { busyTimeoutMs: -1 }),
    { name: "RangeError" },
  );
  for (const [driver, shown] of [[5, "5"], [null, "null"], [{}, "undefined"]]) {
    await assert.rejects(
      () => OutboxReader.open(driver as never),
      new TypeError(
        driver === null || typeof driver !== "object"
          ? `Cannot open outbox reader as 'driver' must be a Driver: current value is ${shown}`
          : `Cannot open outbox reader as 'driver.query' must be a function: current value is ${shown}`,
      ),
    );
  }
});
