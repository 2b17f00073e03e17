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

for (const immediate of [false, true]) {
  for (
    const [concurrency, commits] of [
      // A claim of one, then one acknowledgement with the next claim per
      // event; the last one's claim comes back empty, and so does the idle
      // loop's claim after its read.
      [1, 1 + EVENTS + 1],
      // A claim of four, then each batch of four acknowledged with the next
      // claim of four, and the idle loop's claim.
      [4, 1 + EVENTS / 4 + 1],
      [16, 1 + EVENTS / 16 + 1],
    ] as const
  ) {
    Deno.test(
      `at concurrency ${concurrency} the loop drains ${EVENTS} events in ${commits} commits without a timer firing${
        immediate ? ", with setImmediate" : ""
      }`,
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
