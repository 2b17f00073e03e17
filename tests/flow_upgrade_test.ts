/**
 * Databases of every older schema version that hold data upgrade to the
 * flow-control schema (SQLite version 7 and on, PostgreSQL's flow step) and their
 * events are claimed with the new features as before.
 */
import assert from "node:assert/strict";
import {
  Outbox,
  POSTGRES_SCHEMA_VERSION,
  SQLITE_SCHEMA_VERSION,
} from "../mod.ts";
import { connectPostgres } from "../drivers/postgres.ts";
import { UPGRADES, VERSION_TABLE_SQL } from "../dialects/sqlite.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { asPostgresVersion7, driverTest, ManualClock } from "./helpers.ts";
import { SQLITE_DRIVERS } from "./drivers.ts";

/** What every upgraded database must do: old events first, then the new features. */
async function exercise(outbox: Outbox, clock: ManualClock): Promise<void> {
  await outbox.enqueue("urgent", { priority: 9 });
  const first = await outbox.claim({ max: 3 });
  assert.deepEqual(first.map((l) => l.payload), ["urgent", "old-1", "old-2"]);
  await outbox.pause("default");
  await outbox.enqueue("later");
  assert.equal(await outbox.claim(), null);
  await outbox.resume("default");
  await outbox.setLimits("default", { perKey: 1, perSecond: 100 });
  await outbox.enqueue("k1", { concurrencyKey: "k" });
  await outbox.enqueue("k2", { concurrencyKey: "k" });
  const next = await outbox.claim({ max: 10 });
  assert.deepEqual(next.map((l) => l.payload), ["later", "k1"]);
  clock.set(Date.UTC(2026, 0, 1));
  await outbox.schedule("s", "* * * * *", "tick");
  clock.advance(60_000);
  assert.equal(await outbox.runSchedules(), 1);
}

for (const driver of SQLITE_DRIVERS.filter((d) => d.file)) {
  for (const older of [4, 5, 6, 7]) {
    driverTest(
      driver,
      `open() upgrades a version ${older} database holding events to version ${SQLITE_SCHEMA_VERSION}, whose events keep their order at priority 0`,
      async ({ clock, open, raw }) => {
        await raw.exec(
          await Deno.readTextFile(
            new URL("./fixtures/schema_v4.sql", import.meta.url),
          ),
        );
        for (const [n, payload] of ["old-1", "old-2"].entries()) {
          await raw.run(
            `INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts, created_at, updated_at, identity)
            VALUES ('default', 'pending', ?, 0, 5, 0, 0, ?)`,
            [
              JSON.stringify(payload),
              `0190b2c4-7d3e-7a11-8f00-00000000000${n}`,
            ],
          );
        }
        if (older >= 5) {
          await raw.exec(VERSION_TABLE_SQL);
          await raw.exec("PRAGMA user_version = 0");
          for (let v = 4; v < older; v++) {
            await raw.exec(UPGRADES.get(v)!);
            await raw.run(
              "INSERT INTO outbox_schema (version, applied_at) VALUES (?, 0)",
              [v + 1],
            );
          }
          if (older === 5) {
            await raw.run(
              "INSERT INTO outbox_schema (version, applied_at) VALUES (4, 0)",
            );
          }
        }
        const [outbox] = await open();
        const [row] = await raw.query(
          "SELECT max(version) AS version FROM outbox_schema",
        );
        assert.equal(row?.["version"], SQLITE_SCHEMA_VERSION);
        await exercise(outbox!, clock);
      },
    );
  }
}

Deno.test("postgres: opening a version 6 schema holding events adds the flow step; its events keep their order at priority 0", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  {
    await using outbox = await Outbox.open(
      await connectPostgres(server.url, { schema }),
      { now: () => 0 },
    );
    await outbox.enqueue("old-1");
    await outbox.enqueue("old-2");
  }
  {
    // Back to version 6's shape, its events kept.
    await using db = await connectPostgres(server.url, { schema });
    await asPostgresVersion7(db);
    await db.exec(`
      DROP VIEW outbox_ledger;
      DROP VIEW outbox_unwritten_attempts;
      DROP INDEX outbox_events_claim_priority;
      DROP INDEX outbox_events_concurrency;
      ALTER TABLE outbox_events DROP COLUMN priority;
      ALTER TABLE outbox_events DROP COLUMN concurrency_key;
      DROP TABLE outbox_queues;
      DROP TABLE outbox_schedules;
      CREATE INDEX outbox_events_claim ON outbox_events (queue, due_at, id)
        WHERE state IN ('pending', 'leased');
      DELETE FROM outbox_schema WHERE version = 7`);
  }
  const clock = new ManualClock();
  await using outbox = await Outbox.open(
    await connectPostgres(server.url, { schema }),
    { now: clock.now },
  );
  await using db = await connectPostgres(server.url, { schema });
  const [row] = await db.query(
    "SELECT max(version) AS version FROM outbox_schema",
  );
  assert.equal(row?.["version"], POSTGRES_SCHEMA_VERSION);
  await exercise(outbox, clock);
});
