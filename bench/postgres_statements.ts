/**
 * Where the server's time goes in issue 39's batch claim+ack (256), for
 * this outbox, graphile-worker and pg-boss on one server: each side's
 * statements as `pg_stat_statements` counts them (calls, execution time,
 * WAL bytes), per 256 events, after the same untimed fill and warm-up.
 * Execution time is the server's own, without round trips, parsing or the
 * commit's WAL flush; the wall rate of each side is printed beside it.
 *
 * ```sh
 * deno run -A bench/postgres_statements.ts [--smoke]
 * ```
 *
 * Prints a Markdown table. Not part of `deno task bench`: it restarts its
 * server with `pg_stat_statements` loaded, a profile rather than a row.
 *
 * @module
 */
import { connectPostgres, openPostgres } from "../drivers/postgres.ts";
import { startPostgres } from "../scripts/postgres_server.ts";
import { graphileSide } from "./loop_bench.ts";
import { startBoss } from "./pg_boss.ts";
import { bossSide, outboxSide } from "./postgres_bench.ts";

const smoke = Deno.args.includes("--smoke");
const MAX = smoke ? 8 : 256;
const BATCHES = smoke ? 2 : 16;
const BLOCKS = smoke ? 1 : 3;
const EVENTS = MAX * BATCHES;

const server = await startPostgres();
try {
  {
    const admin = await connectPostgres(server.url, { listen: false });
    await admin.run(
      "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'",
    );
    await admin.run("ALTER SYSTEM SET pg_stat_statements.track = 'all'");
    await admin.close();
    await server.restart();
  }
  await using monitor = await connectPostgres(server.url, { listen: false });
  await monitor.run("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  const outbox = await openPostgres(server.url, { listen: false });
  const boss = await startBoss(server.url, 1);
  const queue = "bench_statements";
  await boss.createQueue(queue);
  await using graphile = await graphileSide(server.url, "noop", MAX, EVENTS, {
    localQueue: { size: MAX },
    completeJobBatchDelay: 0,
  });
  const cycles = (side: ReturnType<typeof outboxSide>) => ({
    prepare: () => side.fill(EVENTS),
    async block() {
      let events = 0;
      for (let b = 0; b < BATCHES; b++) events += await side.cycle(MAX);
      return events;
    },
  });
  const sides = [
    ["leased-outbox claim({ max }) + acknowledge", cycles(outboxSide(outbox))],
    ["graphile-worker run(), localQueue", graphile],
    ["pg-boss fetch({ batchSize }) + complete", cycles(bossSide(boss, queue))],
  ] as const;
  const lines = [
    `Server execution time per ${MAX} events (pg_stat_statements), ${BLOCKS} blocks of ${EVENTS} events each`,
    "",
    "| side | statement | calls per block | ms per 256 events | WAL B/event |",
    "|---|---|---:|---:|---:|",
  ];
  for (const [name, side] of sides) {
    await side.prepare?.();
    await side.block();
    let events = 0;
    let wallMs = 0;
    let stats: Record<string, unknown>[] = [];
    for (let b = 0; b < BLOCKS; b++) {
      await side.prepare?.();
      // Only the timed blocks are counted, not their fills.
      await monitor.run("SELECT pg_stat_statements_reset()");
      const started = performance.now();
      events += await side.block();
      wallMs += performance.now() - started;
      const rows = await monitor.query(
        `SELECT query AS statement, calls, total_exec_time AS ms, wal_bytes::float8 AS wal
        FROM pg_stat_statements
        WHERE query NOT ILIKE '%pg_stat_statements%'`,
      );
      stats = b === 0 ? rows : merge(stats, rows);
    }
    stats.sort((a, b) => Number(b["ms"]) - Number(a["ms"]));
    const per = 256 / events;
    let total = 0;
    for (const row of stats) {
      const ms = Number(row["ms"]) * per;
      total += ms;
      if (ms < 0.01) continue;
      lines.push(
        `| ${name} | ${label(String(row["statement"]))} | ${
          (Number(row["calls"]) / BLOCKS).toFixed(1)
        } | ${ms.toFixed(2)} | ${(Number(row["wal"]) / events).toFixed(0)} |`,
      );
    }
    lines.push(
      `| ${name} | **all statements** (wall: ${
        Math.round(events / wallMs * 1000).toLocaleString("en-US")
      } events/s) | | **${total.toFixed(2)}** | |`,
    );
  }
  console.log(lines.join("\n"));
  await boss.stop({ graceful: false, close: true });
  await outbox.close();
} finally {
  await server.stop();
}

/** Sums two readings of pg_stat_statements by statement. */
function merge(
  a: Record<string, unknown>[],
  b: Record<string, unknown>[],
): Record<string, unknown>[] {
  const sums = new Map(a.map((row) => [row["statement"], { ...row }]));
  for (const row of b) {
    const sum = sums.get(row["statement"]);
    if (sum === undefined) sums.set(row["statement"], { ...row });
    else {
      for (const key of ["calls", "ms", "wal"]) {
        sum[key] = Number(sum[key]) + Number(row[key]);
      }
    }
  }
  return [...sums.values()];
}

/** A statement's name: this outbox's by what it does, others' first words. */
function label(sql: string): string {
  const claims = sql.includes("claimed AS (UPDATE outbox_events");
  const acknowledges = sql.includes("acked AS (DELETE FROM outbox_events");
  if (claims && acknowledges) return "acknowledgeAndClaim (one statement)";
  if (claims) return "claim (one statement)";
  if (acknowledges) return "acknowledge (one statement)";
  const words = sql.replace(/\s+/g, " ").trim();
  return `\`${words.slice(0, 60).replaceAll("|", "\\|")}…\``;
}
