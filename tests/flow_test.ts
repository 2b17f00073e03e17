/** Flow control (issue 40): pause/resume, priorities, per-key and rate limits, on every driver. */
import assert from "node:assert/strict";
import { driverTest, type Harness, snapshot } from "./helpers.ts";
import { DRIVERS } from "./drivers.ts";

for (const driver of DRIVERS) {
  const test = (name: string, fn: (t: Harness) => Promise<void>) =>
    driverTest(driver, name, fn);

  test("a paused queue's claims return nothing on every connection until it is resumed, and held leases run to their end", async ({ open }) => {
    const [a, b] = await open();
    await a!.enqueue({ n: 1 });
    await a!.enqueue({ n: 2 });
    await a!.enqueue({ n: 3 }, { queue: "other" });
    const held = await a!.claim();
    await a!.pause("default");
    assert.equal(await b!.claim(), null);
    assert.deepEqual(await b!.claim({ max: 5 }), []);
    assert.deepEqual(await b!.acknowledgeAndClaim([held!], { max: 5 }), {
      acknowledged: [true],
      leases: [],
    });
    assert.deepEqual((await b!.claim({ queue: "other" }))?.payload, { n: 3 });
    await b!.resume("default");
    assert.deepEqual((await a!.claim())?.payload, { n: 2 });
  });

  test("queues() shows a paused queue with paused: true, even one with no events, and its limits", async ({ clock, open }) => {
    const [a] = await open();
    clock.set(5);
    await a!.enqueue({ n: 1 }, { queue: "mail" });
    await a!.pause("mail");
    await a!.pause("empty");
    await a!.setLimits("limited", { perKey: 2, perSecond: 10 });
    assert.deepEqual(await a!.queues(), [
      {
        queue: "empty",
        pending: 0,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: null,
        paused: true,
      },
      {
        queue: "limited",
        pending: 0,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: null,
        perKey: 2,
        perSecond: 10,
      },
      {
        queue: "mail",
        pending: 1,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: 5,
        paused: true,
      },
    ]);
    await a!.resume("mail");
    await a!.resume("empty");
    await a!.setLimits("limited", { perKey: null, perSecond: null });
    assert.deepEqual(await a!.queues(), [
      {
        queue: "mail",
        pending: 1,
        leased: 0,
        done: 0,
        dead: 0,
        oldestPendingAt: 5,
      },
    ]);
    assert.deepEqual(await a!.limits("mail"), {
      paused: false,
      perKey: null,
      perSecond: null,
    });
  });

  test("a higher priority is claimed first, ties by due time then id, and enqueueBatch takes it per element", async ({ clock, open }) => {
    const [a] = await open();
    await a!.enqueue({ n: 1 });
    await a!.enqueue({ n: 2 }, { priority: 5 });
    await a!.enqueue({ n: 3 }, { priority: -1 });
    await a!.enqueueBatch([
      { payload: { n: 4 }, priority: 5 },
      { payload: { n: 5 }, priority: 10, delayMs: 100 },
      { payload: { n: 6 } },
    ]);
    const first = await a!.claim({ max: 3 });
    assert.deepEqual(first.map((l) => l.payload), [{ n: 2 }, { n: 4 }, {
      n: 1,
    }]);
    clock.advance(100);
    const rest = await a!.claim({ max: 10 });
    assert.deepEqual(rest.map((l) => l.payload), [{ n: 5 }, { n: 6 }, {
      n: 3,
    }]);
  });

  test("inside an ordering key FIFO wins over priority", async ({ open }) => {
    const [a] = await open();
    await a!.enqueue({ n: 1 }, { orderingKey: "k", priority: 0 });
    await a!.enqueue({ n: 2 }, { orderingKey: "k", priority: 9 });
    await a!.enqueue({ n: 3 }, { priority: 1 });
    const leases = await a!.claim({ max: 10 });
    assert.deepEqual(leases.map((l) => l.payload), [{ n: 3 }, { n: 1 }]);
    await a!.acknowledge(leases);
    assert.deepEqual((await a!.claim())?.payload, { n: 2 });
  });

  test("at most perKey events of one concurrency key are leased at once across connections, and other keys are not held back", async ({ clock, open }) => {
    const [a, b] = await open();
    await a!.setLimits("default", { perKey: 2 });
    for (let n = 1; n <= 5; n++) {
      await a!.enqueue({ n }, { concurrencyKey: "busy" });
    }
    await a!.enqueue({ n: 6 }, { concurrencyKey: "quiet" });
    await a!.enqueue({ n: 7 });
    const first = await a!.claim({ max: 1, leaseMs: 1_000 });
    assert.deepEqual(first.map((l) => l.payload), [{ n: 1 }]);
    const second = await b!.claim({ max: 10, leaseMs: 1_000 });
    assert.deepEqual(second.map((l) => l.payload), [{ n: 2 }, { n: 6 }, {
      n: 7,
    }]);
    assert.equal(await a!.claim(), null);
    await b!.acknowledge(first[0]!);
    assert.deepEqual((await b!.claim({ leaseMs: 1_000 }))?.payload, { n: 3 });
    assert.equal(await a!.claim(), null);
    // Lapsed leases free their slots: the key's two oldest pending events
    // are taken, the lapsed ones of the key wait.
    clock.advance(1_000);
    const after = await a!.claim({ max: 10 });
    assert.deepEqual(after.map((l) => l.payload), [{ n: 4 }, { n: 5 }, {
      n: 6,
    }, { n: 7 }]);
  });

  test("a batch claim passing over a key at its limit fills up with other keys' events", async ({ open }) => {
    const [a] = await open();
    await a!.setLimits("default", { perKey: 2 });
    for (let n = 1; n <= 10; n++) {
      await a!.enqueue(`a${n}`, { concurrencyKey: "a" });
    }
    await a!.enqueue("b1", { concurrencyKey: "b" });
    await a!.enqueue("b2", { concurrencyKey: "b" });
    const leases = await a!.claim({ max: 4 });
    assert.deepEqual(leases.map((l) => l.payload), ["a1", "a2", "b1", "b2"]);
  });

  test("clearing perKey lifts the limit; events without a key are never limited", async ({ open }) => {
    const [a] = await open();
    await a!.setLimits("default", { perKey: 1 });
    await a!.enqueue({ n: 1 }, { concurrencyKey: "k" });
    await a!.enqueue({ n: 2 }, { concurrencyKey: "k" });
    await a!.enqueue({ n: 3 });
    await a!.enqueue({ n: 4 });
    assert.equal((await a!.claim({ max: 10 })).length, 3);
    await a!.setLimits("default", { perKey: null });
    assert.deepEqual((await a!.claim())?.payload, { n: 2 });
  });

  test("perSecond allows that many claims per second across connections, refilled by the outbox's clock", async ({ clock, open }) => {
    const [a, b] = await open();
    clock.set(1_000_000);
    await a!.setLimits("default", { perSecond: 4 });
    for (let n = 1; n <= 20; n++) await a!.enqueue({ n });
    assert.equal((await a!.claim({ max: 3 })).length, 3);
    assert.equal((await b!.claim({ max: 3 })).length, 1);
    assert.equal(await a!.claim(), null);
    clock.advance(250);
    assert.equal((await b!.claim({ max: 10 })).length, 1);
    assert.equal(await a!.claim(), null);
    // The bucket holds one second's tokens at most.
    clock.advance(10_000);
    assert.equal((await a!.claim({ max: 10 })).length, 4);
    // A clock stepping back refills nothing.
    clock.set(1_000_000);
    assert.equal(await b!.claim(), null);
  });

  test("an empty claim under a rate limit spends no tokens", async ({ clock, open }) => {
    const [a] = await open();
    clock.set(10);
    await a!.setLimits("default", { perSecond: 2 });
    assert.equal(await a!.claim(), null);
    assert.equal(await a!.claim(), null);
    await a!.enqueue({ n: 1 });
    await a!.enqueue({ n: 2 });
    await a!.enqueue({ n: 3 });
    assert.equal((await a!.claim({ max: 10 })).length, 2);
  });

  test("bad flow arguments throw naming the field before any SQL, and nothing changes", async ({ open, raw, sent }) => {
    const [a] = await open();
    await a!.enqueue({ n: 1 });
    const before = await snapshot(raw);
    const count = sent();
    await assert.rejects(
      a!.enqueue({ n: 2 }, { priority: 1.5 }),
      new RangeError(
        "Cannot enqueue as 'priority' must be an integer from -2147483647 to 2147483647: current value is 1.5",
      ),
    );
    await assert.rejects(
      a!.enqueue({ n: 2 }, { priority: "1" as unknown as number }),
      new TypeError(
        "Cannot enqueue as 'priority' must be an integer: current value is \"1\"",
      ),
    );
    await assert.rejects(
      a!.enqueueBatch([{ payload: 1 }, { payload: 2, priority: NaN }]),
      (e) =>
        e instanceof RangeError && /'events\[1\]\.priority'/.test(e.message),
    );
    await assert.rejects(
      a!.enqueue({ n: 2 }, { concurrencyKey: "" }),
      (e) => e instanceof TypeError && /'concurrencyKey'/.test(e.message),
    );
    await assert.rejects(
      a!.setLimits("default", { perKey: 0 }),
      new RangeError(
        "Cannot set limits as 'perKey' must be a positive integer at most 1000000 or null: current value is 0",
      ),
    );
    await assert.rejects(
      a!.setLimits("default", { perSecond: -1 }),
      (e) => e instanceof RangeError && /'perSecond'/.test(e.message),
    );
    await assert.rejects(
      a!.setLimits("default", { perSecond: 2.5 }),
      (e) => e instanceof RangeError && /'perSecond'/.test(e.message),
    );
    await assert.rejects(
      a!.setLimits("default", { perHour: 2 } as never),
      (e) => e instanceof TypeError && /perHour/.test(e.message),
    );
    await assert.rejects(
      a!.setLimits("", { perKey: 1 }),
      (e) => e instanceof TypeError && /'queue'/.test(e.message),
    );
    await assert.rejects(
      a!.pause(""),
      (e) => e instanceof TypeError && /'queue'/.test(e.message),
    );
    await assert.rejects(
      a!.resume(7 as unknown as string),
      (e) => e instanceof TypeError && /'queue'/.test(e.message),
    );
    assert.equal(sent(), count);
    assert.deepEqual(await snapshot(raw), before);
  });
}
