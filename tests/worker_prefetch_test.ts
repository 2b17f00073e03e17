/**
 * The processing loop's leases claimed ahead (`prefetch`): the next handler
 * starts as one finishes, before its acknowledgement commits; leases claimed
 * ahead are given back unstarted, their attempts not counted, at stop and
 * when their renewal falls due; per-key order holds.
 */
import assert from "node:assert/strict";
import type { Lease } from "../mod.ts";
import { processEvents } from "../worker.ts";
import { DRIVERS } from "./drivers.ts";
import { driverTest } from "./helpers.ts";
import { fixture } from "./worker_fixture.ts";

/** A handler held until the test opens the gate of its event's `n`. */
function gates() {
  const open = new Map<number, PromiseWithResolvers<void>>();
  const gate = (n: number) => {
    if (!open.has(n)) open.set(n, Promise.withResolvers<void>());
    return open.get(n)!;
  };
  const started: number[] = [];
  return {
    started,
    handler: (lease: Lease) => {
      const { n } = lease.payload as { n: number };
      started.push(n);
      return gate(n).promise;
    },
    open: (n: number) => gate(n).resolve(),
    openAll: () => {
      for (let n = 0; n < 100; n++) gate(n).resolve();
    },
  };
}

Deno.test("at concurrency 1 the loop holds two leases, and a handler that finishes is followed by the next before its acknowledgement commits", async () => {
  await using f = await fixture();
  for (let n = 0; n < 3; n++) await f.outbox.enqueue({ n });
  const g = gates();
  const acknowledgement = Promise.withResolvers<void>();
  const fold = f.outbox.acknowledgeAndClaim.bind(f.outbox);
  let folds = 0;
  f.outbox.acknowledgeAndClaim = async (...args) => {
    if (++folds === 1) await acknowledgement.promise;
    return await fold(...args);
  };
  await using processor = processEvents(f.outbox, g.handler, f.options());
  await f.time.advance(0, f.wall);
  assert.deepEqual(g.started, [0]);
  assert.equal((await f.outbox.stats()).leased, 2);
  g.open(0);
  await f.time.advance(0, f.wall);
  // The acknowledgement of 0 is still under way; 1 runs on the lease
  // claimed ahead.
  assert.equal(folds, 1);
  assert.deepEqual(g.started, [0, 1]);
  assert.equal(processor.counters.acknowledged, 0);
  acknowledgement.resolve();
  await f.time.advance(0, f.wall);
  assert.equal(processor.counters.acknowledged, 1);
  // 0 done, 1 running, 2 claimed ahead.
  assert.deepEqual(await f.outbox.stats().then((s) => [s.done, s.leased]), [
    1,
    2,
  ]);
  g.openAll();
  await f.time.advance(0, f.wall);
  assert.equal(processor.counters.acknowledged, 3);
});

Deno.test("stop() gives back the leases claimed ahead unstarted, their attempts not counted: a last-attempt event stays pending", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 0 }, { maxAttempts: 1 });
  const { eventId } = await f.outbox.enqueue({ n: 1 }, { maxAttempts: 1 });
  const g = gates();
  const processor = processEvents(f.outbox, g.handler, f.options());
  await f.time.advance(0, f.wall);
  assert.deepEqual(g.started, [0]);
  const stopped = processor.stop();
  await f.time.advance(0, f.wall);
  // Given back at once, while stop() waits for the running handler.
  const event = await f.outbox.explain(eventId);
  assert.equal(event?.state, "pending");
  assert.equal(event?.attempt, 0);
  assert.deepEqual(event?.history.map((entry) => entry.kind), [
    "claimed",
    "released",
  ]);
  g.open(0);
  await stopped;
  assert.deepEqual(g.started, [0]);
  assert.equal(processor.counters.acknowledged, 1);
  assert.equal(processor.counters.released, 0);
  // Claimed again, it is its first attempt, at the next fence.
  const lease = await f.outbox.claim();
  assert.deepEqual([lease?.eventId, lease?.attempt, lease?.fence], [
    eventId,
    1,
    2,
  ]);
});

Deno.test("a lease claimed ahead is given back when its renewal falls due before a handler slot frees, and the loop claims ahead again once a handler finishes", async () => {
  await using f = await fixture();
  for (let n = 0; n < 3; n++) await f.outbox.enqueue({ n });
  const g = gates();
  await using processor = processEvents(f.outbox, g.handler, f.options());
  await f.time.advance(0, f.wall);
  assert.equal((await f.outbox.stats()).leased, 2);
  // renewIntervalMs is leaseMs / 3: 333 ms. The running lease renews, the
  // one claimed ahead goes back, and nothing else is claimed ahead.
  await f.time.advance(333, f.wall);
  const stats = await f.outbox.stats();
  assert.deepEqual([stats.leased, stats.pending], [1, 2]);
  await f.time.advance(1_000, f.wall);
  assert.equal((await f.outbox.stats()).leased, 1);
  g.open(0);
  await f.time.advance(0, f.wall);
  // 0 acknowledged with a claim of one to run and one ahead: 2 first, as 1
  // is due again from when it was given back, after 2.
  assert.deepEqual(g.started, [0, 2]);
  assert.deepEqual(await f.outbox.stats().then((s) => [s.done, s.leased]), [
    1,
    2,
  ]);
  g.openAll();
  await f.time.advance(0, f.wall);
  assert.equal(processor.counters.acknowledged, 3);
  assert.equal(f.errors.length, 0);
});

Deno.test("a lease claimed ahead whose renewal time passed while the event loop stalled is given back, not started, and runs later as its first attempt", async () => {
  await using f = await fixture();
  await f.outbox.enqueue({ n: 0 });
  const { eventId } = await f.outbox.enqueue({ n: 1 });
  const g = gates();
  const attempts: number[] = [];
  await using processor = processEvents(f.outbox, (lease) => {
    attempts.push(lease.attempt);
    return g.handler(lease);
  }, f.options());
  await f.time.advance(0, f.wall);
  // No timer fires: the renewals of both leases are overdue when 0 ends.
  f.time.jump(400, f.wall);
  g.open(0);
  g.open(1);
  await f.time.advance(0, f.wall);
  await f.time.advance(0, f.wall);
  assert.deepEqual(g.started, [0, 1]);
  assert.deepEqual(attempts, [1, 1]);
  assert.equal(processor.counters.acknowledged, 2);
  const history = (await f.outbox.explain(eventId))!.history;
  assert.deepEqual(history.map((entry) => entry.kind), [
    "claimed",
    "released",
    "claimed",
    "acknowledged",
  ]);
});

Deno.test("a lease claimed ahead holds the later events of its ordering key back: each key's events run in order", async () => {
  await using f = await fixture();
  for (let n = 0; n < 3; n++) {
    await f.outbox.enqueue({ n }, { orderingKey: "k" });
  }
  await f.outbox.enqueue({ n: 3 });
  const g = gates();
  await using processor = processEvents(f.outbox, g.handler, f.options());
  await f.time.advance(0, f.wall);
  // The claim of two found 0, and 3 past the held-back 1 and 2.
  assert.deepEqual(g.started, [0]);
  assert.equal((await f.outbox.stats()).leased, 2);
  g.openAll();
  for (let i = 0; i < 4; i++) await f.time.advance(0, f.wall);
  assert.deepEqual(g.started, [0, 3, 1, 2]);
  assert.equal(processor.counters.acknowledged, 4);
});

Deno.test("prefetch: false claims no more leases than handler slots", async () => {
  await using f = await fixture();
  for (let n = 0; n < 4; n++) await f.outbox.enqueue({ n });
  const g = gates();
  await using _processor = processEvents(
    f.outbox,
    g.handler,
    f.options({ concurrency: 2, prefetch: false }),
  );
  await f.time.advance(0, f.wall);
  assert.equal((await f.outbox.stats()).leased, 2);
  g.openAll();
  await f.time.advance(0, f.wall);
});

Deno.test("a prefetch that is not a boolean is refused at start, naming the field", async () => {
  await using f = await fixture();
  assert.throws(
    () => processEvents(f.outbox, () => {}, { prefetch: 1 as never }),
    {
      name: "TypeError",
      message:
        "Cannot process events as 'prefetch' must be a boolean: current value is 1",
    },
  );
});

for (const driver of DRIVERS) {
  driverTest(
    driver,
    "release() with attempted: false gives the claim's attempt back, so a last attempt stays pending, and keeps the fence",
    async ({ open }) => {
      const [outbox] = await open();
      const { eventId } = await outbox!.enqueue({}, { maxAttempts: 1 });
      const lease = await outbox!.claim();
      assert.equal(lease?.attempt, 1);
      assert.equal(await outbox!.release(lease!, { attempted: false }), true);
      const event = await outbox!.explain(eventId);
      assert.deepEqual([event?.state, event?.attempt, event?.fence], [
        "pending",
        0,
        1,
      ]);
      const again = await outbox!.claim();
      assert.deepEqual([again?.attempt, again?.fence], [1, 2]);
      // Counted, the same last attempt makes it a dead letter.
      assert.equal(await outbox!.release(again!), true);
      assert.equal((await outbox!.explain(eventId))?.state, "dead");
    },
  );

  driverTest(
    driver,
    "release() with an attempted that is not a boolean is refused before any SQL",
    async ({ open, sent }) => {
      const [outbox] = await open();
      await outbox!.enqueue({});
      const lease = await outbox!.claim();
      const before = sent();
      await assert.rejects(
        outbox!.release(lease!, { attempted: "no" as never }),
        {
          name: "TypeError",
          message:
            "Cannot release as 'attempted' must be a boolean: current value is \"no\"",
        },
      );
      assert.equal(sent(), before);
    },
  );
}

Deno.test("a lease given back at its renewal time while an acknowledgement waits for the writer leaves the loop holding its budget: that acknowledgement goes alone, with no claim of zero leases and no error reported", async () => {
  await using f = await fixture();
  for (let n = 0; n < 9; n++) await f.outbox.enqueue({ n });
  const g = gates();
  // The first acknowledgeAndClaim waits for the test: the writer is busy.
  const writer = Promise.withResolvers<void>();
  let calls = 0;
  const outbox = new Proxy(f.outbox, {
    get(target, key) {
      const value = Reflect.get(target, key);
      if (key !== "acknowledgeAndClaim") {
        return typeof value === "function" ? value.bind(target) : value;
      }
      return async (...args: Parameters<typeof target.acknowledgeAndClaim>) => {
        if (++calls === 1) await writer.promise;
        return target.acknowledgeAndClaim(...args);
      };
    },
  });
  await using processor = processEvents(
    outbox,
    g.handler,
    f.options({ concurrency: 3 }),
  );
  // 0, 1 and 2 run; 3, 4 and 5 are claimed ahead at 0.
  await f.time.advance(0, f.wall);
  assert.deepEqual(g.started, [0, 1, 2]);
  // 0 finishes at 100, and 3 starts: 0's acknowledgement waits for the
  // writer. 1 finishes at 330, and 4 starts: its acknowledgement waits too.
  await f.time.advance(100, f.wall);
  g.open(0);
  await f.time.advance(230, f.wall);
  g.open(1);
  await f.time.advance(0, f.wall);
  assert.deepEqual(g.started, [0, 1, 2, 3, 4]);
  // At 333, 5 is due for renewal: it goes back, and the loop claims
  // nothing ahead until a handler finishes; 1's acknowledgement then frees
  // no slot for a claim.
  await f.time.advance(3, f.wall);
  writer.resolve();
  await f.time.advance(0, f.wall);
  await f.time.advance(0, f.wall);
  assert.deepEqual(f.errors.map(String), []);
  g.openAll();
  await f.time.advance(2_000, f.wall);
  assert.equal(processor.counters.acknowledged, 9);
  assert.deepEqual(f.errors.map(String), []);
});
