/**
 * SIGKILL during group commits on a real file: two processes, each with 16
 * concurrent callers of enqueue, are killed at a random moment; then every
 * call that resolved is on disk with its id, no call that rejected is, each
 * process's events are in the order of its calls, and the file is intact.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { BusyError, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { Child } from "./fixtures/vfs_child.ts";

// `deno task test:stress` runs 25.
const TRIALS = Number(Deno.env.get("GROUP_CRASH_TRIALS") ?? 3);
const CALLERS = ["a", "b"];

interface Reported {
  resolved: Map<number, number>;
  rejected: Set<number>;
}

async function readAll(path: string) {
  const deadline = performance.now() + 20_000;
  for (;;) {
    try {
      await using db = await openSqliteWasm(path);
      const [integrity] = await db.query("PRAGMA integrity_check");
      const events = await db.query(
        "SELECT id, payload ->> 'c' AS c, payload ->> 'n' AS n FROM outbox_events ORDER BY id",
      );
      return { integrity: integrity?.["integrity_check"], events };
    } catch (error) {
      if (!(error instanceof BusyError) || performance.now() > deadline) {
        throw error;
      }
      await new Promise((resolve) =>
        setTimeout(resolve, 1 + Math.random() * 10)
      );
    }
  }
}

for (const journalMode of ["truncate", "wal"] as const) {
  Deno.test(`group commit crash (${journalMode}): ${TRIALS} SIGKILLs of two processes mid-group lose no resolved call, keep no rejected one, keep call order and leave integrity ok`, async () => {
    const dir = await Deno.makeTempDir({ prefix: "group_crash_" });
    const path = join(dir, "outbox.db");
    try {
      {
        await using outbox = await Outbox.open(
          await openSqliteWasm(path, { journalMode }),
        );
        await outbox.transaction((tx) =>
          tx.run(`CREATE TRIGGER refuse BEFORE INSERT ON outbox_events
          WHEN NEW.payload ->> 'refused'
          BEGIN SELECT RAISE(ABORT, 'refused'); END`)
        );
      }
      const reported = new Map<string, Reported>(
        CALLERS.map((c) => [c, { resolved: new Map(), rejected: new Set() }]),
      );
      for (let trial = 0; trial < TRIALS; trial++) {
        // Each trial's calls are numbered afresh: keep them apart by trial.
        const children = CALLERS.map((c) =>
          new Child(
            "group",
            path,
            journalMode,
            Number(`${trial + 1}${c === "a" ? 1 : 2}`),
          )
        );
        // Output is read from the start: a child blocked writing to a full
        // pipe would hold the write lock and stall the other.
        const committed = Promise.withResolvers<void>();
        const outputs = children.map((child, i) =>
          (async () => {
            const mine = reported.get(CALLERS[i]!)!;
            for (let line; (line = await child.next()) !== undefined;) {
              const [kind, n, id] = line.split(" ");
              const key = trial * 1e9 + Number(n);
              if (kind === "R") {
                committed.resolve();
                mine.resolved.set(key, Number(id));
              } else if (kind === "J") mine.rejected.add(key);
            }
          })().finally(() => committed.resolve())
        );
        await committed.promise;
        await new Promise((resolve) =>
          setTimeout(resolve, Math.random() * 300)
        );
        for (const child of children) child.kill();
        for (const child of children) {
          const status = await child.status();
          assert.equal(status.signal, "SIGKILL", await child.stderr());
        }
        await Promise.all(outputs);

        const { integrity, events } = await readAll(path);
        assert.equal(integrity, "ok");
        for (const [c, { resolved, rejected }] of reported) {
          const onDisk = new Map<number, number>();
          let last = -1;
          for (const row of events) {
            const caller = String(row["c"]);
            if (caller.at(-1) !== (c === "a" ? "1" : "2")) continue;
            const key = (Number(caller.slice(0, -1)) - 1) * 1e9 +
              Number(row["n"]);
            // Each process's events have ids in the order of its calls.
            assert.ok(key > last, `call ${key} of ${c} is out of order`);
            last = key;
            onDisk.set(key, Number(row["id"]));
          }
          for (const [key, id] of resolved) {
            assert.equal(onDisk.get(key), id, `resolved call ${key} of ${c}`);
          }
          for (const key of rejected) {
            assert.ok(
              !onDisk.has(key),
              `rejected call ${key} of ${c} is on disk`,
            );
          }
        }
      }
      const count = (f: (r: Reported) => number) =>
        [...reported.values()].reduce((sum, r) => sum + f(r), 0);
      assert.ok(count((r) => r.resolved.size) > 0, "the callers made progress");
      console.log(
        `${journalMode}, ${TRIALS} kills: ${
          count((r) => r.resolved.size)
        } resolved, ${count((r) => r.rejected.size)} rejected`,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}
