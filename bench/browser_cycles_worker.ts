/**
 * A database worker for `bench/browser_profile.ts`: the real host and core,
 * with the bench-only method `cycles(n)`, which runs `n` claim+acknowledge
 * cycles inside the worker (no message per call) and returns their rate in
 * cycles per second. Against the same cycles called from the page, it
 * splits a cycle's time into the worker's own and the messaging's.
 *
 * @module
 */
import { serveOutbox, type WorkerScope } from "../browser/host.ts";
import { Outbox } from "../lease.ts";

serveOutbox(globalThis as unknown as WorkerScope, async (driver, options) => {
  const outbox = await Outbox.open(driver, options);
  return Object.assign(outbox, {
    async cycles(n: number): Promise<number> {
      const start = performance.now();
      for (let i = 0; i < n; i++) {
        await outbox.acknowledge((await outbox.claim())!);
      }
      return n / ((performance.now() - start) / 1000);
    },
  });
});
