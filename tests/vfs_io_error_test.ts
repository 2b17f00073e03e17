/**
 * I/O errors from the disk under the Deno file VFS: the n-th write, sync or
 * truncate of a claim or an acknowledgement fails, for every n the call
 * reaches. The call must fail with SQLITE_IOERR or succeed; either way the
 * connection that saw the error must agree with a fresh one about what is
 * committed, the file must pass `integrity_check`, and the next calls must
 * work (C17's "fails only that call", at the VFS instead of the driver).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type Lease, Outbox, SqliteError } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { Libc } from "../deno/libc.ts";
import { ManualClock } from "./helpers.ts";

type FileMethod = "write" | "sync" | "truncate";
const METHODS: readonly FileMethod[] = ["write", "sync", "truncate"];
const SQLITE_IOERR = 10;

/**
 * Runs `fn` with the n-th call of `method` on any file (the VFS does all
 * its I/O through libc) failing as a full disk would, and tells whether
 * that call came.
 */
async function failingNth(
  method: FileMethod,
  n: number,
  fn: () => Promise<unknown>,
): Promise<{ reached: boolean; error: unknown }> {
  const prototype = Libc.prototype as unknown as Record<
    FileMethod,
    (...args: unknown[]) => unknown
  >;
  const original = prototype[method];
  let calls = 0;
  prototype[method] = function (this: Libc, ...args: unknown[]) {
    if (++calls === n) throw new Error(`injected: no space left (${method})`);
    return original.apply(this, args);
  };
  try {
    await fn();
    return { reached: calls >= n, error: undefined };
  } catch (error) {
    return { reached: calls >= n, error };
  } finally {
    prototype[method] = original;
  }
}

/** Counts per state, as one connection sees them. */
async function states(outbox: Outbox): Promise<string> {
  const { pending, leased, done } = await outbox.stats();
  return JSON.stringify({ pending, leased, done });
}

const OPERATIONS = {
  "a claim": async (outbox: Outbox) => {
    await outbox.claim({ max: 2 });
  },
  "an acknowledgement": async (outbox: Outbox, leases: Lease[]) => {
    await outbox.acknowledge(leases);
  },
} as const;

// A WAL commit appends and syncs; it truncates nothing.
const MODES = [
  ["truncate", METHODS],
  ["wal", ["write", "sync"]],
] as const;

for (const [journalMode, methods] of MODES) {
  for (const method of methods) {
    for (const [name, operation] of Object.entries(OPERATIONS)) {
      Deno.test(`in ${journalMode} mode, an I/O error in any ${method} of ${name} fails only that call, and the connection sees what is on disk`, async () => {
        const dir = await Deno.makeTempDir({ prefix: "vfs_io_error_" });
        try {
          let reached = true;
          let failed = 0;
          for (let n = 1; reached; n++) {
            const path = join(dir, `${n}.db`);
            const clock = new ManualClock();
            await using outbox = await Outbox.open(
              await openSqliteWasm(path, { journalMode }),
              { now: clock.now },
            );
            for (let i = 0; i < 3; i++) await outbox.enqueue(i);
            const leases = await outbox.claim({ max: 2 });
            const before = await states(outbox);
            const run = await failingNth(
              method,
              n,
              () => operation(outbox, leases),
            );
            reached = run.reached;
            if (run.error !== undefined) {
              failed++;
              assert.ok(
                run.error instanceof SqliteError &&
                  run.error.primaryCode === SQLITE_IOERR,
                `n=${n}: ${run.error}`,
              );
              // SQLite's words, then the VFS's reason.
              assert.match(
                run.error.message,
                new RegExp(
                  `^disk I/O error: injected: no space left \\(${method}\\)$`,
                ),
                `n=${n}`,
              );
            } else assert.ok(!reached, `n=${n}: the failure went unreported`);
            await using fresh = await Outbox.open(await openSqliteWasm(path), {
              now: clock.now,
            });
            const seen = await states(outbox);
            assert.equal(seen, await states(fresh), `n=${n}`);
            if (run.error === undefined) assert.notEqual(seen, before);
            const [check] = await (await fresh.transaction((tx) =>
              tx.query("PRAGMA integrity_check")
            ));
            assert.deepEqual(check, { integrity_check: "ok" }, `n=${n}`);
            // The next calls work, on the connection that saw the error.
            await outbox.enqueue("next");
            assert.notEqual(await outbox.claim(), null, `n=${n}`);
          }
          assert.ok(failed > 0);
        } finally {
          await Deno.remove(dir, { recursive: true });
        }
      });
    }
  }
}
