/**
 * `deno run -A bench/pages_bench.ts [--state-index '<SQL>']`: B-tree pages
 * written per commit, counted rather than timed, so a 2-core machine shared
 * with other work reads the same figure every run. The WASM file runs in WAL
 * mode with checkpoints by hand; after each commit `PRAGMA
 * wal_checkpoint(PASSIVE)` answers how many frames (pages) the WAL holds,
 * and a TRUNCATE checkpoint empties it again.
 *
 * Counted on 50,000 done events and 7,680 pending in one queue: a batch
 * `claim({ max: 256 })`, its `acknowledge(leases)`, and a lone `enqueue()`
 * (each its own commit), averaged over 20 batches and 200 enqueues.
 * `--state-index` replaces the dashboard's index `outbox_events_state` by the
 * given statements first (e.g. `DROP INDEX outbox_events_state`), to weigh a
 * layout before writing its upgrade step. Prints one line of JSON.
 *
 * @module
 */
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

const at = Deno.args.indexOf("--state-index");
const stateIndex = at === -1 ? undefined : Deno.args[at + 1];
const dir = await Deno.makeTempDir({ prefix: "pages_bench_" });
try {
  await using driver = await openSqliteWasm(`${dir}/pages.db`, {
    journalMode: "wal",
  });
  await using outbox = await Outbox.open(driver, { leaseMs: 3_600_000 });
  await driver.exec("PRAGMA wal_autocheckpoint = 0");
  if (stateIndex !== undefined) await driver.exec(stateIndex);
  const fill = (count: number, state: "done" | "pending", batch: number) =>
    outbox.transaction((tx) =>
      tx.run(
        `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
        INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts,
          created_at, updated_at, done_at, identity)
        SELECT 'default', ?2, '{"n":' || i || '}', 1, 5, 1, 1,
          CASE ?2 WHEN 'done' THEN 1 END,
          printf('00000000-0000-7000-8%03x-%012x', ?3, i)
        FROM n`,
        [count, state, batch],
      )
    );
  await fill(50_000, "done", 1);
  await fill(256 * 30, "pending", 2);
  /** Pages the WAL took since the last call. */
  const pages = async () => {
    const [row] = await driver.query("PRAGMA wal_checkpoint(PASSIVE)");
    await driver.query("PRAGMA wal_checkpoint(TRUNCATE)");
    return Number(row?.["log"]);
  };
  await pages();
  const batches = 20;
  const enqueues = 200;
  let claim = 0;
  let acknowledge = 0;
  let enqueue = 0;
  for (let i = 0; i < batches; i++) {
    const leases = await outbox.claim({ max: 256 });
    claim += await pages();
    await outbox.acknowledge(leases);
    acknowledge += await pages();
  }
  for (let i = 0; i < enqueues; i++) {
    await outbox.enqueue({ i });
    enqueue += await pages();
  }
  console.log(JSON.stringify({
    stateIndex: stateIndex ?? null,
    pagesPerBatchClaim: claim / batches,
    pagesPerBatchAcknowledge: acknowledge / batches,
    pagesPerEnqueue: enqueue / enqueues,
  }));
} finally {
  await Deno.remove(dir, { recursive: true });
}
