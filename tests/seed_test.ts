import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import { ManualClock } from "./helpers.ts";
import { DRIVERS } from "./drivers.ts";

for (const driver of DRIVERS) {
  Deno.test(`${driver.name}: seed scenario: 41, null, 41, false, true, null on two connections`, async () => {
    const connections = await driver.open();
    try {
      const clock = new ManualClock();
      const outboxes: Outbox[] = [];
      for (const d of connections.drivers) {
        outboxes.push(
          await Outbox.open(d, {
            now: clock.now,
            leaseMs: 10,
          }),
        );
      }
      const [a, b] = outboxes as [Outbox, Outbox];
      await a.transaction((tx) =>
        tx.run(
          `INSERT INTO outbox_events (id, identity, queue, state, payload, due_at, max_attempts, created_at, updated_at)
           VALUES (41, '00000000-0000-7000-8000-000000000041', 'default', 'pending', 'null', 0, 5, 0, 0)`,
        )
      );
      const claim = async (outbox: Outbox, now: number, token: string) => {
        clock.set(now);
        return (await outbox.claim({ token }))?.eventId ?? null;
      };
      const acknowledge = (outbox: Outbox, token: string, fence: number) =>
        outbox.acknowledge({ eventId: 41, token, fence } as never);
      const results = [
        await claim(a, 100, "claimA"),
        await claim(b, 109, "claimB"),
        await claim(b, 110, "claimB"),
        await acknowledge(a, "claimA", 1),
        await acknowledge(b, "claimB", 2),
        await claim(a, 120, "claimC"),
      ];
      assert.deepEqual(results, [41, null, 41, false, true, null]);
    } finally {
      await connections.close();
    }
  });
}
