/**
 * `deno task bench:dashboard`: the dashboard's overview on a database of
 * 1,000,000 events (five queues; 97% done, 2% pending, 1% dead, one event
 * every 60 ms over 16.7 hours, so the last hour holds 60,000), read through
 * the default WASM driver by an OutboxReader, as `outbox ui` reads it.
 * Prints the median and the slowest of 20 overviews, and, as the anchor in
 * the same run, the exact `queues()` the overview no longer runs. The goal:
 * the overview's median within 200 ms. Then a page of dead letters over
 * every queue, the first and one 90% into the table (by enqueue time, a
 * seek per queue of the state index), and as their anchor the page by id
 * that walked the primary key; and a page of a state no event is in
 * (leased), which by id walked every row.
 *
 * Flags: `--events N` (default 1000000), `--runs N` (default 20).
 *
 * @module
 */
import { parseArgs } from "node:util";
import { DatabaseSync } from "node:sqlite";
import { Outbox } from "../mod.ts";
import { OutboxReader } from "../reader.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { dashboard } from "../dashboard/mod.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    events: { type: "string", default: "1000000" },
    runs: { type: "string", default: "20" },
  },
});
const events = Number(values.events);
const runs = Number(values.runs);
const START = 1_700_000_000_000;
const STEP_MS = 60;

const dir = await Deno.makeTempDir({ prefix: "outbox-dashboard-bench-" });
try {
  const path = `${dir}/big.db`;
  {
    await using _ = await Outbox.open(await openSqliteWasm(path));
  }
  // One statement builds the table: the bench measures reading, not writing.
  const db = new DatabaseSync(path);
  db.exec(`BEGIN;
    WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ${events})
    INSERT INTO outbox_events (queue, state, payload, due_at, max_attempts,
      created_at, updated_at, done_at, attempt, fence, last_error)
    SELECT 'queue-' || (i % 5),
      CASE WHEN i % 100 = 0 THEN 'dead' WHEN i % 50 = 1 THEN 'pending' ELSE 'done' END,
      '{"n":' || i || '}', ${START} + i * ${STEP_MS}, 5, ${START} + i * ${STEP_MS},
      ${START} + i * ${STEP_MS},
      CASE WHEN i % 100 = 0 OR i % 50 = 1 THEN NULL ELSE ${START} + i * ${STEP_MS} END,
      1, 1, CASE WHEN i % 100 = 0 THEN 'boom' END
    FROM c;
    COMMIT`);
  db.close();
  await using reader = await OutboxReader.open(await openSqliteWasm(path));
  const now = START + events * STEP_MS;
  const handler = dashboard(reader, { now: () => now });
  const time = async (fn: () => Promise<unknown>) => {
    const times: number[] = [];
    for (let i = 0; i < runs; i++) {
      const t = performance.now();
      await fn();
      times.push(performance.now() - t);
    }
    times.sort((a, b) => a - b);
    return {
      median: times[times.length >> 1]!,
      slowest: times.at(-1)!,
    };
  };
  const overview = await time(async () => {
    const response = await handler(new Request("http://localhost/"));
    if (response.status !== 200) throw new Error(await response.text());
    await response.text();
  });
  const exact = await time(() => reader.queues());
  const get = (path: string) => async () => {
    const response = await handler(new Request(`http://localhost${path}`));
    if (response.status !== 200) throw new Error(await response.text());
    await response.text();
  };
  const deadPage = await time(get("/events?state=dead"));
  // A page deep in the table: after the dead letter 90% of the way in.
  const deepPage = await time(
    get(`/events?state=dead&after=${Math.floor(events * 0.009) * 100}`),
  );
  // No event is leased: by id, that page walked the whole table.
  const leasedPage = await time(get("/events?state=leased"));
  const byId = await time(() => reader.list({ state: "dead", limit: 50 }));
  const leasedById = await time(() =>
    reader.list({ state: "leased", limit: 50 })
  );
  const row = (name: string, t: { median: number; slowest: number }) =>
    `| ${name} | ${t.median.toFixed(1)} ms | ${t.slowest.toFixed(1)} ms |`;
  console.log(
    `dashboard on ${
      events.toLocaleString("en")
    } events, ${runs} runs (WASM file driver)`,
  );
  console.log("| what | median | slowest |");
  console.log("|---|---:|---:|");
  console.log(row("overview (GET /), goal: median ≤ 200 ms", overview));
  console.log(row("anchor: exact queues() (the counts it replaced)", exact));
  console.log(
    row(
      "events page, state=dead, every queue (GET /events?state=dead)",
      deadPage,
    ),
  );
  console.log(
    row("events page, state=dead, every queue, 90% in (&after=)", deepPage),
  );
  console.log(
    row('anchor: list({ state: "dead" }) by id (the walk it replaced)', byId),
  );
  console.log(row("events page, state=leased (none), every queue", leasedPage));
  console.log(
    row(
      'anchor: list({ state: "leased" }) by id (a walk of every row)',
      leasedById,
    ),
  );
} finally {
  await Deno.remove(dir, { recursive: true });
}
