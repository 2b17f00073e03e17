/** Flow control and schedules in the browser (issue 40), through the bundle in headless Chromium. */
import assert from "node:assert/strict";
import {
  blankPage,
  browserTest,
  openSession,
  PATHS,
} from "./fixtures/browser/harness.ts";

Deno.test(
  {
    name:
      "browser: a worker outbox pauses and resumes a queue, claims by priority, honours a per-key limit and runs a schedule",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const page = await blankPage(session);
    const seen = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openWorkerOutbox("flow");
      const payloads = (leases: { payload: unknown }[]) =>
        leases.map((l) => l.payload);
      await outbox.enqueue("low");
      await outbox.enqueue("high", { priority: 5 });
      await outbox.pause("default");
      const paused = await outbox.claim({ max: 5 });
      const queues = await outbox.queues();
      await outbox.resume("default");
      const byPriority = payloads(await outbox.claim({ max: 5 }));
      await outbox.setLimits("keyed", { perKey: 1 });
      for (const n of [1, 2]) {
        await outbox.enqueue(`k${n}`, { queue: "keyed", concurrencyKey: "k" });
      }
      const keyed = payloads(await outbox.claim({ queue: "keyed", max: 5 }));
      const limits = await outbox.limits("keyed");
      await outbox.schedule("every-second", "* * * * * *", "tick", {
        queue: "cron",
      });
      let ran = 0;
      while (ran === 0) {
        await new Promise((resolve) => setTimeout(resolve, 200));
        ran = await outbox.runSchedules();
      }
      const ticks = payloads(await outbox.claim({ queue: "cron", max: 5 }));
      const schedules = (await outbox.schedules()).map((s: { name: string }) =>
        s.name
      );
      await outbox.close();
      return {
        paused: payloads(paused),
        flagged: queues[0].paused,
        byPriority,
        keyed,
        limits,
        ran,
        ticks,
        schedules,
      };
    }, PATHS);
    assert.deepEqual(seen, {
      paused: [],
      flagged: true,
      byPriority: ["high", "low"],
      keyed: ["k1"],
      limits: { paused: false, perKey: 1, perSecond: null },
      ran: 1,
      ticks: ["tick"],
      schedules: ["every-second"],
    });
  },
);

Deno.test(
  {
    name:
      "browser: enqueue() and schedule() of a worker and a shared outbox refuse a payload JSON would change with a TypeError naming the place, and store nothing",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const page = await blankPage(session);
    const seen = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const refused = async (call: () => Promise<unknown>) => {
        try {
          await call();
          return "stored";
        } catch (error) {
          const { name, message } = error as Error;
          return `${name}: ${message.replace(/ \(a plain.*as it is\)/, "")}`;
        }
      };
      const out: Record<string, unknown> = {};
      for (const open of ["openWorkerOutbox", "openSharedOutbox"]) {
        const outbox = await m[open](`fidelity-${open}`);
        out[open] = [
          await refused(() => outbox.enqueue({ f: () => 1 })),
          await refused(() => outbox.enqueue({ at: new Date(0) })),
          await refused(() => outbox.enqueue([new Map()])),
          await refused(() => outbox.schedule("s", "* * * * *", { a: NaN })),
          (await outbox.claim({ max: 5 })).length,
          (await outbox.schedules()).length,
        ];
        await outbox.close();
      }
      return out;
    }, PATHS);
    const expected = [
      "TypeError: Cannot enqueue as 'payload.f' must be JSON data: current value is a function",
      "TypeError: Cannot enqueue as 'payload.at' must be JSON data: current value is a Date",
      "TypeError: Cannot enqueue as 'payload[0]' must be JSON data: current value is a Map",
      "TypeError: Cannot schedule as 'payload.a' must be JSON data: current value is NaN",
      0,
      0,
    ];
    assert.deepEqual(seen, {
      openWorkerOutbox: expected,
      openSharedOutbox: expected,
    });
  },
);
