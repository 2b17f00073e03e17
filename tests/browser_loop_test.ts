/** processEvents on the browser's shared outbox, in headless Chromium. */
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
      "processEvents() runs on the shared outbox with the same outcomes and hooks, woken by another tab's enqueue",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const leader = await blankPage(session);
    await leader.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("loop", { leaseMs: 5_000 });
      const failures: string[] = [];
      const processor = m.processEvents(
        outbox,
        (lease: { payload: string; attempt: number }) => {
          if (lease.payload === "permanent") {
            throw new m.PermanentError("receiver answered 422");
          }
          if (lease.payload === "later" && lease.attempt === 1) {
            throw new m.RetryAfterError(50, "receiver answered 429");
          }
        },
        {
          concurrency: 2,
          backoffMinMs: 10,
          pollMinMs: 60_000,
          pollMaxMs: 60_000,
          onHandlerError: (error: Error) => failures.push(error.name),
        },
      );
      for (const payload of ["permanent", "later", "ok"]) {
        await outbox.enqueue(payload);
      }
      Object.assign(globalThis, { outbox, processor, failures });
    }, PATHS);
    const waitFor = (done: number) =>
      leader.evaluate(async (done) => {
        const { outbox } = globalThis as unknown as {
          outbox: {
            stats(): Promise<
              { done: number; dead: number; storage: unknown; wal?: unknown }
            >;
          };
        };
        for (;;) {
          const stats = await outbox.stats();
          if (stats.done >= done) return stats;
          await new Promise((r) => setTimeout(r, 20));
        }
      }, done);
    // The WAL's size (OPFS runs WAL): wal_growth_test.ts's subject.
    const { storage: _, wal: __, ...counts } = await waitFor(2);
    assert.deepEqual(counts, {
      pending: 0,
      leased: 0,
      done: 2,
      dead: 1,
      oldestPendingAgeMs: 0,
    });
    const follower = await blankPage(session);
    const startedAt = Date.now();
    await follower.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("loop");
      await outbox.enqueue("from a follower");
    }, PATHS);
    // The poll is a minute away: only the enqueue event can wake the loop.
    assert.equal((await waitFor(3)).done, 3);
    assert.ok(Date.now() - startedAt < 10_000);
    const result = await leader.evaluate(async () => {
      const { outbox, processor, failures } = globalThis as unknown as {
        outbox: {
          list(
            o: { state: string },
          ): Promise<{ payload: unknown; lastError: string }[]>;
        };
        processor: {
          stop(): Promise<void>;
          counters: Record<string, number>;
        };
        failures: string[];
      };
      await processor.stop();
      const dead = await outbox.list({ state: "dead" });
      return {
        failures,
        dead: dead.map((e) => [e.payload, e.lastError]),
        counters: processor.counters,
      };
    });
    assert.deepEqual(result.failures, ["PermanentError", "RetryAfterError"]);
    assert.deepEqual(result.dead, [[
      "permanent",
      "PermanentError: receiver answered 422",
    ]]);
    assert.equal(result.counters["acknowledged"], 3);
    assert.equal(result.counters["dead"], 1);
  },
);
