/** Cron schedules (issue 40) on every driver, with the injected clock. */
import assert from "node:assert/strict";
import { processEvents } from "../mod.ts";
import { driverTest, type Harness, snapshot } from "./helpers.ts";
import { DRIVERS } from "./drivers.ts";

const T0 = Date.UTC(2026, 0, 1, 0, 0, 0);
const MINUTE = 60_000;

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("runSchedules() enqueues one event per tick with its dedup key, and a second runner enqueues nothing", async ({ clock, open }) => {
    const [a, b] = await open();
    clock.set(T0 + 30_000);
    await a!.schedule("every-minute", "* * * * *", { kind: "tick" }, {
      queue: "cron",
      priority: 3,
    });
    assert.equal(await a!.runSchedules(), 0);
    clock.set(T0 + MINUTE);
    assert.equal(await a!.runSchedules(), 1);
    assert.equal(await b!.runSchedules(), 0);
    const lease = await b!.claim({ queue: "cron" });
    assert.deepEqual(lease?.payload, { kind: "tick" });
    const [info] = await a!.list({ state: "leased" });
    assert.equal(info?.dedupKey, `schedule:every-minute:${T0 + MINUTE}`);
    assert.deepEqual(await a!.schedules(), [{
      name: "every-minute",
      cron: "* * * * *",
      timezone: "UTC",
      queue: "cron",
      payload: { kind: "tick" },
      missed: "latest",
      nextAt: T0 + 2 * MINUTE,
      lastAt: T0 + MINUTE,
      options: { priority: 3 },
    }]);
  });

  test("missed ticks: 'latest' enqueues only the latest, 'all' every one in order", async ({ clock, open }) => {
    const [a] = await open();
    clock.set(T0);
    await a!.schedule("latest", "* * * * *", { s: "latest" }, {
      queue: "l",
    });
    await a!.schedule("all", "* * * * *", { s: "all" }, {
      queue: "a",
      missed: "all",
    });
    clock.set(T0 + 5 * MINUTE + 10_000);
    assert.equal(await a!.runSchedules(), 6);
    const latest = await a!.list({ state: "pending", queue: "l" });
    assert.deepEqual(latest.map((e) => e.dedupKey), [
      `schedule:latest:${T0 + 5 * MINUTE}`,
    ]);
    const all = await a!.list({ state: "pending", queue: "a" });
    assert.deepEqual(
      all.map((e) => e.dedupKey),
      [1, 2, 3, 4, 5].map((m) => `schedule:all:${T0 + m * MINUTE}`),
    );
    assert.equal(await a!.runSchedules(), 0);
  });

  test("a schedule reads its cron expression in its IANA time zone", async ({ clock, open }) => {
    const [a] = await open();
    clock.set(Date.UTC(2026, 6, 1, 0, 0));
    await a!.schedule("paris", "0 9 * * *", { at: "9" }, {
      timezone: "Europe/Paris",
    });
    const [schedule] = await a!.schedules();
    // 09:00 in Paris in July is 07:00 UTC.
    assert.equal(schedule?.nextAt, Date.UTC(2026, 6, 1, 7, 0));
  });

  test("unschedule() removes a schedule and keeps its events; schedule() again replaces one", async ({ clock, open }) => {
    const [a] = await open();
    clock.set(T0);
    await a!.schedule("s", "* * * * *", 1);
    await a!.schedule("s", "0 * * * *", 2);
    assert.equal((await a!.schedules())[0]?.nextAt, T0 + 60 * MINUTE);
    clock.set(T0 + 60 * MINUTE);
    assert.equal(await a!.runSchedules(), 1);
    assert.equal(await a!.unschedule("s"), true);
    assert.equal(await a!.unschedule("s"), false);
    clock.set(T0 + 120 * MINUTE);
    assert.equal(await a!.runSchedules(), 0);
    assert.deepEqual((await a!.claim())?.payload, 2);
  });

  test("processEvents runs the schedules as part of its loop and delivers their events", async ({ clock, open }) => {
    const [a, b] = await open();
    clock.set(T0);
    await a!.schedule("minute", "* * * * *", { kind: "tick" });
    clock.set(T0 + MINUTE);
    const delivered = Promise.withResolvers<unknown>();
    const processors = [a!, b!].map((outbox) =>
      processEvents(outbox, (lease) => delivered.resolve(lease.payload), {
        pollMinMs: 10,
        pollMaxMs: 20,
      })
    );
    try {
      assert.deepEqual(await delivered.promise, { kind: "tick" });
    } finally {
      await Promise.all(processors.map((p) => p.stop()));
    }
    assert.deepEqual(
      (await a!.list({ state: "done" })).map((e) => e.dedupKey),
      [`schedule:minute:${T0 + MINUTE}`],
    );
  });

  test("schedule() refuses a cron that never fires after the lease clock's now, naming cron, before any SQL", async ({ clock, open, raw, sent }) => {
    clock.set(T0);
    const [a] = await open();
    const before = await snapshot(raw);
    const count = sent();
    for (
      const cron of [
        "* * * * * * 1999",
        "0 0 0 1 1 * 2020",
        "0 0 0 1 6 * 2025",
        "0 0 0 29 2 * 2027",
        "0 0 30 2 *",
      ]
    ) {
      await assert.rejects(
        a!.schedule("s", cron, 1),
        new RangeError(
          `Cannot schedule as 'cron' must fire after 2026-01-01T00:00:00.000Z: current value is ${
            JSON.stringify(cron)
          }`,
        ),
      );
    }
    assert.equal(sent(), count);
    assert.deepEqual(await snapshot(raw), before);
    assert.deepEqual(await a!.schedules(), []);
    // The clock's own year still has ticks ahead.
    await a!.schedule("s", "0 0 0 1 6 * 2026", 1);
    assert.deepEqual(
      (await a!.schedules()).map((s) => s.nextAt),
      [Date.UTC(2026, 5, 1)],
    );
  });

  test("bad schedule arguments throw naming the field before any SQL, and nothing changes", async ({ open, raw, sent }) => {
    const [a] = await open();
    const before = await snapshot(raw);
    const count = sent();
    await assert.rejects(
      a!.schedule("s", "not a cron", 1),
      (e) => e instanceof TypeError && /'cron'/.test(e.message),
    );
    await assert.rejects(
      a!.schedule("s", "61 * * * *", 1),
      (e) => e instanceof TypeError && /'cron'/.test(e.message),
    );
    await assert.rejects(
      a!.schedule("s", "* * * * *", 1, { timezone: "Mars/Olympus" }),
      new RangeError(
        "Cannot schedule as 'timezone' must be an IANA time zone name: current value is \"Mars/Olympus\"",
      ),
    );
    await assert.rejects(
      a!.schedule("s", "* * * * *", 1, { missed: "some" as "all" }),
      (e) => e instanceof RangeError && /'missed'/.test(e.message),
    );
    await assert.rejects(
      a!.schedule("", "* * * * *", 1),
      (e) => e instanceof TypeError && /'name'/.test(e.message),
    );
    await assert.rejects(
      a!.schedule("s", "* * * * *", 1, { queue: "" }),
      (e) => e instanceof TypeError && /'queue'/.test(e.message),
    );
    await assert.rejects(
      a!.schedule("s", "* * * * *", 1, { priority: 0.5 }),
      (e) => e instanceof RangeError && /'priority'/.test(e.message),
    );
    await assert.rejects(
      a!.schedule("s", "* * * * *", new Uint8Array(1)),
      (e) => e instanceof TypeError && /'payload'/.test(e.message),
    );
    await assert.rejects(
      a!.unschedule(""),
      (e) => e instanceof TypeError && /'name'/.test(e.message),
    );
    assert.equal(sent(), count);
    assert.deepEqual(await snapshot(raw), before);
  });
}
