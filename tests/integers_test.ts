/**
 * Integers never round: SQLite's 64-bit integers past ±2^53 are refused with
 * UnsafeIntegerError on every driver, and a claim never hands out a lease its
 * UPDATE did not write.
 */
import assert from "node:assert/strict";
import { UnsafeIntegerError } from "../mod.ts";
import { driverTest, type Harness } from "./helpers.ts";
import { SQLITE_DRIVERS } from "./drivers.ts";

const MAX = Number.MAX_SAFE_INTEGER;
const INSERT_EVENT =
  `INSERT INTO outbox_events (queue, state, payload, due_at, fence, attempt, max_attempts, created_at, updated_at)
  VALUES (?, 'pending', 'null', 0, ?, ?, ?, 0, 0)`;

/**
 * Pushes the next event id to 2^53 + 1, as if purge() had deleted an event
 * of id 2^53 (schema.sql's outbox_id_floor).
 */
async function seedSequence(raw: Harness["raw"]): Promise<void> {
  await raw.run("UPDATE outbox_id_floor SET seq = ?", [2n ** 53n]);
}

for (const driver of SQLITE_DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("a claim refuses an event id past 2^53 and no second claim takes the event", async ({ open, raw }) => {
    const [a, b] = await open();
    await seedSequence(raw);
    await raw.run(
      INSERT_EVENT.replace("(queue,", "(id, queue,").replace(
        "VALUES (",
        "VALUES (?, ",
      ),
      [2n ** 53n + 1n, "default", 0, 0, 5],
    );
    for (const outbox of [a!, b!]) {
      await assert.rejects(() => outbox.claim(), (error) => {
        assert.ok(error instanceof UnsafeIntegerError);
        assert.equal(error.column, "id");
        assert.equal(error.value, 2n ** 53n + 1n);
        return true;
      });
    }
    assert.deepEqual(
      await raw.query("SELECT id, state, fence, token FROM outbox_events"),
      [{ id: 2n ** 53n + 1n, state: "pending", fence: 0, token: null }],
    );
  });

  test("an enqueue whose new id is past 2^53 is refused and adds no event", async ({ open, raw }) => {
    const [a] = await open();
    await seedSequence(raw);
    await assert.rejects(() => a!.enqueue({ n: 1 }), UnsafeIntegerError);
    assert.deepEqual(
      await raw.query("SELECT count(*) AS n FROM outbox_events"),
      [{ n: 0 }],
    );
  });

  test("a claim refuses to take a fence or attempt past 2^53 - 1 and changes nothing", async ({ open, raw }) => {
    const [a] = await open();
    await raw.run(INSERT_EVENT, ["fence", MAX, 0, 5]);
    await raw.run(INSERT_EVENT, ["attempt", 0, MAX, MAX]);
    await raw.run(INSERT_EVENT, ["max", 0, 0, 2n ** 60n]);
    const before = await raw.query("SELECT * FROM outbox_events ORDER BY id");
    const refused = async (queue: string, column: string, value: bigint) =>
      await assert.rejects(() => a!.claim({ queue }), (error) => {
        assert.ok(error instanceof UnsafeIntegerError);
        assert.equal(error.column, column);
        assert.equal(error.value, value);
        return true;
      });
    await refused("fence", "fence", 2n ** 53n);
    await refused("attempt", "attempt", 2n ** 53n);
    await refused("max", "max_attempts", 2n ** 60n);
    assert.deepEqual(
      await raw.query("SELECT * FROM outbox_events ORDER BY id"),
      before,
    );
  });

  test("explain, deadLetters and stats refuse a stored integer past 2^53 rather than round it", async ({ open, raw }) => {
    const [a] = await open();
    const { eventId } = await a!.enqueue({ n: 1 });
    await raw.run(
      "UPDATE outbox_events SET state = 'dead', done_at = 0, created_at = ?, fence = ? WHERE id = ?",
      [2n ** 53n + 1n, 2n ** 60n, eventId],
    );
    await assert.rejects(() => a!.explain(eventId), UnsafeIntegerError);
    await assert.rejects(() => a!.deadLetters(), UnsafeIntegerError);
    // created_at stays past 2^53: stats reads it for the oldest pending age.
    await raw.run(
      "UPDATE outbox_events SET state = 'pending', fence = 0 WHERE id = ?",
      [eventId],
    );
    await assert.rejects(() => a!.stats(), UnsafeIntegerError);
  });

  test("a claim whose UPDATE misses a leased row fails and leaves the event to one holder at most", async ({ open, raw }) => {
    const [a, b] = await open();
    const { eventId } = await a!.enqueue({ n: 1 });
    // A trigger that makes SQLite skip the claim's row: the UPDATE then
    // changes nothing although the candidate was read.
    await raw.exec(
      `CREATE TRIGGER skip_claim BEFORE UPDATE ON outbox_events
       WHEN NEW.state = 'leased' BEGIN SELECT RAISE(IGNORE); END`,
    );
    await assert.rejects(() => a!.claim(), /changed 0 event rows for 1 leases/);
    await assert.rejects(
      () => b!.claim({ max: 4 }),
      /changed 0 event rows for 1 leases/,
    );
    await raw.exec("DROP TRIGGER skip_claim");
    const lease = await b!.claim();
    assert.equal(lease?.eventId, eventId);
    assert.equal(lease?.fence, 1);
    assert.equal(await a!.claim(), null);
  });
}
