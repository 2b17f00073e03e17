import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../sqlite_wasm.ts";
import { ManualClock } from "./helpers.ts";

Deno.test("seed scenario: 41, null, 41, false, true, null on two connections", async () => {
  const name = `file:/seed-${crypto.randomUUID()}?vfs=memdb`;
  const clock = new ManualClock();
  await using first = await Outbox.open(await openSqliteWasm(name), {
    now: clock.now,
    leaseMs: 10,
  });
  await using second = await Outbox.open(await openSqliteWasm(name), {
    now: clock.now,
    leaseMs: 10,
  });
  await first.transaction((tx) =>
    tx.run(
      "INSERT INTO outbox_events (id, queue, state, payload, due_at, max_attempts, created_at, updated_at) VALUES (41, 'default', 'pending', 'null', 0, 5, 0, 0)",
    )
  );
  const claim = async (outbox: Outbox, now: number, token: string) => {
    clock.set(now);
    return (await outbox.claim({ token }))?.eventId ?? null;
  };
  const acknowledge = (
    outbox: Outbox,
    eventId: number,
    token: string,
    fence: number,
  ) => outbox.acknowledge({ eventId, token, fence } as never);
  const results = [
    await claim(first, 100, "claimA"),
    await claim(second, 109, "claimB"),
    await claim(second, 110, "claimB"),
    await acknowledge(first, 41, "claimA", 1),
    await acknowledge(second, 41, "claimB", 2),
    await claim(first, 120, "claimC"),
  ];
  assert.deepEqual(results, [41, null, 41, false, true, null]);
});
