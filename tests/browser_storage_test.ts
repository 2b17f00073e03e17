/** The browser outbox's storage: a full OPFS quota, maintain(), estimates. */
import assert from "node:assert/strict";
import type { Page } from "npm:playwright-core@1.65.1";
import {
  blankPage,
  browserTest,
  openSession,
  PATHS,
  type Session,
} from "./fixtures/browser/harness.ts";
import { SqliteError, sqliteError, StorageFullError } from "../errors.ts";
import { fromWireError, toWireError } from "../browser/protocol.ts";

/**
 * Caps the storage of the session's origin at its usage now plus `bytes`,
 * through the DevTools protocol (the quota OPFS writes are checked against).
 */
async function capQuota(
  session: Session,
  page: Page,
  usage: number,
  bytes: number,
): Promise<void> {
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Storage.overrideQuotaForOrigin", {
    origin: new URL(session.server.url).origin,
    quotaSize: usage + bytes,
  });
}

Deno.test(
  {
    name:
      "a full OPFS quota fails the enqueue with StorageFullError, keeps what was stored, and the same tab writes again once a purge and maintain() free space, without a reload",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const page = await blankPage(session);
    const usage = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openSharedOutbox("full");
      Object.assign(globalThis, { m, outbox });
      return (await outbox.stats()).storage.usage as number;
    }, PATHS);
    await capQuota(session, page, usage, 3_000_000);
    const seen = await page.evaluate(async () => {
      const { m, outbox } = globalThis as unknown as {
        // deno-lint-ignore no-explicit-any
        m: any;
        // deno-lint-ignore no-explicit-any
        outbox: any;
      };
      const big = "x".repeat(100_000);
      // Fills the quota: each call either stores its event or fails typed.
      const fill = async () => {
        for (let stored = 0; stored < 1_000; stored++) {
          try {
            await outbox.enqueue({ big });
          } catch (error) {
            return { stored, error: error as Error & { code: number } };
          }
        }
        throw new Error("the quota never filled");
      };
      const first = await fill();
      const stats = await outbox.stats();
      const ids = (await outbox.list({ state: "pending", limit: 1_000 }))
        .map((event: { id: number }) => event.id);
      const cancelled = await outbox.cancel(ids);
      const purged = await outbox.purge({ olderThanMs: 0, states: ["dead"] });
      const maintained = await outbox.maintain();
      const second = await fill();
      return {
        first: {
          stored: first.stored,
          name: first.error.name,
          typed: first.error instanceof m.StorageFullError,
          sqlite: first.error instanceof m.SqliteError,
          code: first.error.code,
          message: first.error.message,
        },
        pending: stats.pending,
        cancelled: cancelled.length,
        purged,
        reclaimedBytes: maintained.reclaimedBytes,
        autoVacuum: maintained.autoVacuum,
        second: { stored: second.stored, name: second.error.name },
      };
    });
    assert.ok(seen.first.stored >= 5, `stored ${seen.first.stored}`);
    assert.deepEqual(
      [seen.first.name, seen.first.typed, seen.first.sqlite, seen.first.code],
      ["StorageFullError", true, true, 13],
    );
    assert.match(seen.first.message, /storage quota is full/);
    assert.match(seen.first.message, /purge done events and dead letters/);
    // Every event stored before the quota filled is there; the failed one
    // is not.
    assert.equal(seen.pending, seen.first.stored);
    assert.equal(seen.cancelled, seen.first.stored);
    assert.equal(seen.purged, seen.first.stored);
    assert.ok(seen.reclaimedBytes > 0, `reclaimed ${seen.reclaimedBytes}`);
    assert.equal(seen.autoVacuum, "incremental");
    // The freed space is written again, by the same connection.
    assert.ok(
      seen.second.stored >= seen.first.stored / 2,
      `stored ${seen.second.stored} after the purge, ${seen.first.stored} before`,
    );
    assert.equal(seen.second.name, "StorageFullError");
  },
);

Deno.test(
  {
    name:
      "stats() of the browser outbox reports the origin's storage estimate, and maintain() gives a purge's pages back",
    ...browserTest,
  },
  async () => {
    await using session = await openSession();
    const page = await blankPage(session);
    const seen = await page.evaluate(async (paths) => {
      const m = await import(paths.bundle);
      const outbox = await m.openWorkerOutbox("estimate");
      const before = await outbox.stats();
      const big = "y".repeat(50_000);
      for (let i = 0; i < 20; i++) await outbox.enqueue({ big, i });
      const ids = Array.from({ length: 20 }, (_, i) => i + 1);
      await outbox.cancel(ids);
      await outbox.purge({ olderThanMs: 0, states: ["dead"] });
      const maintained = await outbox.maintain();
      const estimate = await (navigator as unknown as {
        storage: { estimate(): Promise<{ quota: number }> };
      }).storage.estimate();
      const after = await outbox.stats();
      await outbox.close();
      return { before, after, maintained, estimate };
    }, PATHS);
    assert.deepEqual(Object.keys(seen.before).sort(), [
      "dead",
      "done",
      "leased",
      "oldestPendingAgeMs",
      "pending",
      "storage",
      "wal",
    ]);
    assert.ok(seen.before.storage.usage > 0);
    assert.ok(seen.before.storage.quota >= seen.before.storage.usage);
    assert.equal(seen.after.storage.quota, seen.estimate.quota);
    assert.equal(seen.maintained.autoVacuum, "incremental");
    // 20 events of 50 kB each freed at least 500 kB of pages.
    assert.ok(
      seen.maintained.reclaimedBytes >= 500_000,
      `reclaimed ${seen.maintained.reclaimedBytes}`,
    );
    assert.equal(seen.maintained.freePages, 0);
  },
);

Deno.test(
  "SQLite's SQLITE_FULL is a StorageFullError, which crosses postMessage as itself",
  () => {
    const error = sqliteError("database or disk is full", 13);
    assert.ok(error instanceof StorageFullError);
    assert.ok(error instanceof SqliteError);
    const wired = fromWireError(toWireError(error));
    assert.ok(wired instanceof StorageFullError);
    assert.deepEqual([wired.name, (wired as SqliteError).code, wired.message], [
      "StorageFullError",
      13,
      "database or disk is full",
    ]);
  },
);
