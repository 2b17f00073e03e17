/**
 * `processor.stop()` called by one of the processor's own handlers (a
 * fatal condition that shuts the loop down): it does not wait for the
 * handler calling it, which would wait for itself until `stopTimeoutMs`,
 * and that handler's event is acknowledged when it returns. The clocks are
 * manual and never advanced past 0 ms: a stop that waited for its timeout
 * would not have returned.
 */
import assert from "node:assert/strict";
import { processEvents, type Processor } from "../worker.ts";
import { fixture } from "./worker_fixture.ts";

Deno.test("stop() called from inside a handler returns without waiting for that handler, and its event is acknowledged when the handler returns", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ fatal: true });
  const steps: string[] = [];
  const processor: Processor = processEvents(f.outbox, async () => {
    steps.push("handler");
    await processor.stop();
    steps.push("stop returned");
  }, f.options());
  await f.time.advance(0, f.wall);
  assert.deepEqual(steps, ["handler", "stop returned"]);
  await processor.stop();
  assert.equal((await f.outbox.explain(eventId))?.state, "done");
  assert.equal(processor.counters.acknowledged, 1);
  assert.equal(processor.counters.released, 0);
  assert.equal(processor.inFlight, 0);
  assert.deepEqual(f.errors, []);
});

Deno.test("stop() called from inside a handler waits for the other running handlers, and both events are acknowledged", async () => {
  await using f = await fixture();
  const first = await f.outbox.enqueue({ n: 1 });
  const second = await f.outbox.enqueue({ n: 2 });
  const gate = Promise.withResolvers<void>();
  const steps: string[] = [];
  const processor: Processor = processEvents(f.outbox, async (lease) => {
    if (lease.eventId === second.eventId) {
      await gate.promise;
      steps.push("other finished");
      return;
    }
    await processor.stop();
    steps.push("stop returned");
  }, f.options({ concurrency: 2 }));
  await f.time.advance(0, f.wall);
  assert.equal(processor.inFlight, 2);
  assert.deepEqual(steps, []);
  gate.resolve();
  await f.time.advance(0, f.wall);
  assert.deepEqual(steps, ["other finished", "stop returned"]);
  await processor.stop();
  assert.equal((await f.outbox.explain(first.eventId))?.state, "done");
  assert.equal((await f.outbox.explain(second.eventId))?.state, "done");
  assert.equal(processor.counters.acknowledged, 2);
  assert.equal(processor.counters.released, 0);
});

Deno.test("stop() called from inside a handler's context.transaction returns without waiting, and the transaction's acknowledgement commits", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ n: 1 });
  let returned = false;
  const processor: Processor = processEvents(f.outbox, async (_lease, ctx) => {
    await ctx.transaction(async (tx) => {
      await tx.enqueue({ follow: 1 });
      await processor.stop();
    });
    returned = true;
  }, f.options());
  await f.time.advance(0, f.wall);
  assert.equal(returned, true);
  await processor.stop();
  assert.equal((await f.outbox.explain(eventId))?.state, "done");
  assert.equal(processor.counters.acknowledged, 1);
  assert.equal((await f.outbox.stats()).pending, 1);
});

Deno.test("stop() called from outside while a handler also calls it waits for that handler, whose event is acknowledged", async () => {
  await using f = await fixture();
  const { eventId } = await f.outbox.enqueue({ n: 1 });
  const gate = Promise.withResolvers<void>();
  const processor: Processor = processEvents(f.outbox, async () => {
    await processor.stop();
    await gate.promise;
  }, f.options());
  await f.time.advance(0, f.wall);
  let stopped = false;
  void processor.stop().then(() => stopped = true);
  await f.time.advance(0, f.wall);
  assert.equal(stopped, false);
  gate.resolve();
  await f.time.advance(0, f.wall);
  assert.equal(stopped, true);
  assert.equal((await f.outbox.explain(eventId))?.state, "done");
});

Deno.test("stop() called inside a handler's context.transaction while another handler's acknowledgement waits for that transaction returns at once, and both events are acknowledged", async () => {
  await using f = await fixture();
  const first = await f.outbox.enqueue({ n: 1 });
  const second = await f.outbox.enqueue({ n: 2 });
  const otherReturned = Promise.withResolvers<void>();
  const steps: string[] = [];
  const processor: Processor = processEvents(f.outbox, async (lease, ctx) => {
    if (lease.eventId === second.eventId) {
      otherReturned.resolve();
      return;
    }
    await ctx.transaction(async (tx) => {
      await tx.run("SELECT 1");
      // The other handler returned: its acknowledgement needs the
      // connection this transaction holds.
      await otherReturned.promise;
      await processor.stop();
      steps.push("stop returned");
    });
  }, f.options({ concurrency: 2 }));
  await f.time.advance(0, f.wall);
  assert.deepEqual(steps, ["stop returned"]);
  await processor.stop();
  assert.deepEqual(f.errors, []);
  assert.equal((await f.outbox.explain(first.eventId))?.state, "done");
  assert.equal((await f.outbox.explain(second.eventId))?.state, "done");
  assert.equal(processor.counters.acknowledged, 2);
});

Deno.test("stop() called inside a handler's context.transaction gives back the leases claimed ahead once the transaction ends, rather than having their release refused as nested in it", async () => {
  await using f = await fixture();
  const first = await f.outbox.enqueue({ n: 1 });
  const second = await f.outbox.enqueue({ n: 2 });
  const processor: Processor = processEvents(f.outbox, async (_lease, ctx) => {
    await ctx.transaction(async (tx) => {
      await tx.run("SELECT 1");
      await processor.stop();
    });
  }, f.options({ concurrency: 1, prefetch: true }));
  await f.time.advance(0, f.wall);
  await processor.stop();
  assert.deepEqual(f.errors, []);
  assert.equal((await f.outbox.explain(first.eventId))?.state, "done");
  const ahead = await f.outbox.explain(second.eventId);
  assert.equal(ahead?.state, "pending");
  assert.equal(ahead?.attempt, 0);
  assert.equal(processor.counters.claimed, 1);
});
