/**
 * The processing loop's commits per event, on the manual timers: no write
 * waits for a timer, and each write takes every acknowledgement ready.
 */
import assert from "node:assert/strict";
import type { Driver, SqlValue } from "../mod.ts";
import { openSqliteWasm } from "../drivers/sqlite_wasm.ts";
import { processEvents } from "../worker.ts";
import { fixture, settle, withImmediate } from "./worker_fixture.ts";

/** `driver`, counting the COMMITs it is sent. */
function countingCommits(driver: Driver): Driver & { commits: number } {
  const counted = {
    commits: 0,
    query: (sql: string, params?: readonly SqlValue[]) =>
      driver.query(sql, params),
    run: (sql: string, params?: readonly SqlValue[]) => {
      if (sql.startsWith("COMMIT")) counted.commits++;
      return driver.run(sql, params);
    },
    exec: (sql: string) => driver.exec(sql),
    close: () => driver.close(),
  };
  return counted;
}

const EVENTS = 64;

/** Commits to drain EVENTS at each concurrency, by how the loop runs. */
const COMMITS: {
  prefetch: boolean;
  immediate: boolean;
  commits: Record<1 | 4 | 16, number>;
  why: string;
}[] = [
  {
    prefetch: false,
    immediate: false,
    // A claim of c, then each batch of c acknowledged with the next claim of
    // c (c = 1: one commit per event); the last one's claim comes back
    // empty, and so does the idle loop's claim after its read.
    commits: {
      1: 1 + EVENTS + 1,
      4: 1 + EVENTS / 4 + 1,
      16: 1 + EVENTS / 16 + 1,
    },
    why: "",
  },
  {
    prefetch: false,
    immediate: true,
    commits: {
      1: 1 + EVENTS + 1,
      4: 1 + EVENTS / 4 + 1,
      16: 1 + EVENTS / 16 + 1,
    },
    why: ", with setImmediate",
  },
  {
    prefetch: true,
    immediate: true,
    // A claim of 2c: c handlers run, c leases wait for them. As each handler
    // finishes, the next starts at once on a lease claimed ahead, and it
    // finishes in the same turn of the event loop, so one write takes 2c
    // acknowledgements with a claim of 2c: half the commits of the loop
    // without prefetch. Then the idle loop's claim after its read.
    commits: {
      1: 1 + EVENTS / 2 + 1,
      4: 1 + EVENTS / 8 + 1,
      16: 1 + EVENTS / 32 + 1,
    },
    why: ", claiming ahead, with setImmediate",
  },
  {
    prefetch: true,
    immediate: false,
    // Without setImmediate a write starts once the promise jobs running now
    // are done. At c = 1 the handler started on the lease claimed ahead
    // settles in them: 2 acknowledgements per write, as with setImmediate.
    // At 4 and 16 the last of those handlers settle in later jobs, so the
    // writes take c + 1 and c - 1 acknowledgements in turn (5 and 3, 17 and
    // 15): one write per c events, as without prefetch; and the loop, woken
    // between the last two writes, claims once more and finds none.
    commits: {
      1: 1 + EVENTS / 2 + 1,
      4: 1 + EVENTS / 4 + 1 + 1,
      16: 1 + EVENTS / 16 + 1 + 1,
    },
    why: ", claiming ahead",
  },
];

for (const { prefetch, immediate, commits: byConcurrency, why } of COMMITS) {
  for (const concurrency of [1, 4, 16] as const) {
    const commits = byConcurrency[concurrency];
    Deno.test(
      `at concurrency ${concurrency} the loop drains ${EVENTS} events in ${commits} commits without a timer firing${why}`,
      async () => {
        const driver = countingCommits(await openSqliteWasm(":memory:"));
        await using f = await fixture(driver);
        await f.outbox.enqueueBatch(
          Array.from({ length: EVENTS }, (_, n) => ({ payload: { n } })),
        );
        const before = driver.commits;
        const drained = Promise.withResolvers<void>();
        let handled = 0;
        // The manual timers never advance: a write waiting for a timer would
        // never start.
        await using processor = processEvents(
          f.outbox,
          () => {
            if (++handled === EVENTS) drained.resolve();
          },
          f.options({
            concurrency,
            prefetch,
            pollMinMs: 60_000,
            pollMaxMs: 60_000,
            ...(immediate ? { timers: withImmediate(f.time) } : {}),
          }),
        );
        await drained.promise;
        while (processor.counters.acknowledged < EVENTS) await settle();
        // The idle loop's read and empty claim.
        await settle();
        assert.equal(driver.commits - before, commits);
        assert.equal(processor.counters.acknowledged, EVENTS);
        assert.equal((await f.outbox.stats()).done, EVENTS);
        assert.equal(f.time.ms, 0);
      },
    );
  }
}
