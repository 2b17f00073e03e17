/**
 * Issue 39's second raw-statement measurement: schema version 8's own
 * statements (from dialects/postgres.ts, on its own schema) against
 * candidate layouts for a version 9, each a patch of that schema and of
 * those statements, in schemas of one server. Each batch runs on every
 * layout in a fresh random order (so the machine's load falls on all
 * alike), timed, with the WAL bytes it wrote (`pg_current_wal_lsn()`;
 * autovacuum's WAL falls on whichever layout runs, so a run of one layout
 * alone gives the cleaner figure):
 *
 * - `v8`: `claimInOne`, `acknowledgeAllInOne` (leases as JSON) and
 *   `insertMinted` as version 8 shipped them (c176365), which test for a
 *   lapsed last-attempt lease with `NOT EXISTS`; `v8b`, the same again (an
 *   A/A control: how far two identical layouts read apart).
 * - `fix`: the statements as the dialect writes them now (that test read
 *   from its partial index); every layout below is a patch of `fix`.
 * - `arr`: the batch acknowledgement's leases as three arrays (`unnest` of
 *   ids, fences, tokens) instead of a JSON array.
 * - `nopk`: `outbox_done` without its primary key.
 * - `nolock`: the batch acknowledgement without `FOR UPDATE` of the leases
 *   before its DELETE (each lease's DELETE carries its fence; not all or
 *   none).
 * - `hot80`, `hot50`: a claim changes no indexed or index-predicate
 *   column: the claim index is (queue, priority DESC, due_at, id) over
 *   every row of `outbox_events` (dead letters would move out, as done
 *   events do), a claim leaves `due_at` alone and a candidate is claimable
 *   when pending or its lease lapsed (a heap test after the index scan:
 *   unexpired leases sit in the scanned range), last-attempt leases live in
 *   a side table `outbox_last_leases` (written by a claim of a last
 *   attempt, deleted by its acknowledgement), fillfactor 80 or 50.
 * - `ident`: minted identities in a unique index of `outbox_events` and of
 *   `outbox_done` (explain by identity) instead of an `outbox_keys` row.
 * - `a+b`: both.
 *
 * A study of version 8's statements: it patches their text as the dialect
 * wrote it at 5064578, and refuses to run on version 9's (the layout it
 * led to; `bench/postgres_variants.ts` measures that against version 8).
 *
 * `deno run -A bench/postgres_layout_v9.ts [rounds] [inflight] [layouts]`:
 * `inflight` unexpired leases (one hour) are claimed in the measured queue
 * before the first round and never acknowledged; `layouts`, a comma list.
 * Prints per layout and round the claim+ack and enqueue rates and WAL bytes
 * per event, each layout's ratio to `v8` and to `fix` round by round, and
 * each layout's share of HOT updates of `outbox_events`. `EXPLAIN=n`: also
 * the server's execution time of n claims and acknowledgements of 256 per
 * layout (EXPLAIN ANALYZE, timing off); `PLAN=1`: one claim's and one
 * acknowledgement's plan per layout, with buffers and WAL.
 *
 * @module
 */
import { connectPostgres } from "../drivers/postgres.ts";
import { startPostgres } from "../scripts/postgres_server.ts";
import { walPosition } from "./postgres_bench.ts";
import { POSTGRES, POSTGRES_SCHEMA } from "../dialects/postgres.ts";
import { uuidv7 } from "../identity.ts";
import type { Driver, SqlValue } from "../mod.ts";

interface Layout {
  readonly name: string;
  /** SQL run after version 8's schema. */
  readonly patch: string;
  readonly claim: string;
  /** The batch acknowledgement's SQL and parameters. */
  readonly ack: (leases: Lease[]) => [string, SqlValue[]];
  readonly enqueue: string;
}

interface Lease {
  readonly id: number;
  readonly fence: number;
  readonly token: string;
}

/** `text` with each [from, to] replaced, each `from` required to occur. */
function patched(text: string, ...edits: [string, string][]): string {
  for (const [from, to] of edits) {
    if (!text.includes(from)) throw new Error(`No ${from} in the statement`);
    text = text.replaceAll(from, to);
  }
  return text;
}

const jsonAck = (sql: string) => (leases: Lease[]): [string, SqlValue[]] => [
  sql,
  [null, JSON.stringify(leases.map((l) => [l.id, l.fence, l.token]))],
];
const JSON_LEASES =
  `SELECT (a.v ->> 0)::bigint AS id, (a.v ->> 1)::bigint AS fence,
      a.v ->> 2 AS token
    FROM jsonb_array_elements($2::jsonb) AS a (v)`;
const ARRAY_LEASES = `SELECT a.id, a.fence, a.token
    FROM unnest($2::bigint[], $3::bigint[], $4::text[]) AS a (id, fence, token)`;
const arrayAck = (sql: string) => (leases: Lease[]): [string, SqlValue[]] => [
  patched(sql, [JSON_LEASES, ARRAY_LEASES]),
  [
    null,
    `{${leases.map((l) => l.id).join(",")}}`,
    `{${leases.map((l) => l.fence).join(",")}}`,
    `{${leases.map((l) => l.token).join(",")}}`,
  ],
];

// The test for a lapsed last-attempt lease as the dialect writes it now
// (one row at most, from the partial index), and as version 8 shipped it
// (NOT EXISTS, which the planner may answer by scanning the table).
const EXHAUSTED_NOW = `(SELECT 1 FROM outbox_events
    WHERE state = 'leased' AND attempt >= max_attempts
      AND due_at <= (SELECT now FROM n)
    ORDER BY due_at LIMIT 1)`;
const EXHAUSTED_V8 = `SELECT 1 FROM outbox_events
    WHERE state = 'leased' AND attempt >= max_attempts
      AND due_at <= (SELECT now FROM n)`;
/** A statement as version 8 shipped it (c176365). */
const shipped = (sql: string) =>
  sql.replaceAll(`UNION ALL ${EXHAUSTED_NOW}`, `UNION ALL ${EXHAUSTED_V8}`)
    .replaceAll(
      `AND ${EXHAUSTED_NOW} IS NULL`,
      `AND NOT EXISTS (${EXHAUSTED_V8})`,
    );

for (const sql of [POSTGRES.claimInOne, POSTGRES.acknowledgeAllInOne]) {
  if (shipped(sql) === sql) {
    throw new Error(
      "shipped() changed nothing: this study patches schema version 8's statements (run it at 5064578); version 9's are measured by bench/postgres_variants.ts",
    );
  }
}

const V8: Layout = {
  name: "v8",
  patch: "",
  claim: shipped(POSTGRES.claimInOne),
  ack: jsonAck(shipped(POSTGRES.acknowledgeAllInOne)),
  enqueue: POSTGRES.insertMinted,
};
const FIX: Layout = {
  name: "fix",
  patch: "",
  claim: POSTGRES.claimInOne,
  ack: jsonAck(POSTGRES.acknowledgeAllInOne),
  enqueue: POSTGRES.insertMinted,
};

const EXHAUSTED_HOT = `(SELECT 1 FROM outbox_last_leases
    WHERE lease_until <= (SELECT now FROM n) LIMIT 1)`;

const hotPatch = (fillfactor: number) => `
ALTER TABLE outbox_events SET (fillfactor = ${fillfactor});
DROP INDEX outbox_events_claim_priority;
DROP INDEX outbox_events_last_attempt;
DROP INDEX outbox_events_ordering;
DROP INDEX outbox_events_ordering_leased;
DROP INDEX outbox_events_concurrency;
CREATE INDEX outbox_events_ready ON outbox_events (queue, priority DESC, due_at, id);
CREATE INDEX outbox_events_ordering ON outbox_events (queue, ordering_key, id)
  WHERE ordering_key IS NOT NULL;
CREATE INDEX outbox_events_concurrency ON outbox_events (queue, concurrency_key)
  WHERE concurrency_key IS NOT NULL;
CREATE TABLE outbox_last_leases (id bigint PRIMARY KEY, lease_until bigint NOT NULL);
CREATE INDEX outbox_last_leases_until ON outbox_last_leases (lease_until)`;

const HOT_CLAIM = patched(
  POSTGRES.claimInOne,
  [
    `e.state IN ('pending', 'leased')
      AND e.due_at <= (SELECT now FROM n)`,
    `e.due_at <= (SELECT now FROM n)
      AND (e.state = 'pending' OR e.lease_until <= (SELECT now FROM n))`,
  ],
  [" due_at = n.now + $5,", ""],
  [EXHAUSTED_NOW, EXHAUSTED_HOT],
  [
    `e.last_error)
  SELECT n.now, (EXISTS (SELECT 1 FROM refused))::integer AS refused, c.*`,
    `e.last_error),
  last AS (INSERT INTO outbox_last_leases (id, lease_until)
    SELECT id, lease_until FROM claimed WHERE attempt >= max_attempts)
  SELECT n.now, (EXISTS (SELECT 1 FROM refused))::integer AS refused, c.*`,
  ],
);
const HOT_ACK = patched(
  POSTGRES.acknowledgeAllInOne,
  [EXHAUSTED_NOW, EXHAUSTED_HOT],
  [
    `RETURNING id)
  SELECT n.now, (SELECT count(*) FROM moved)::integer AS acknowledged`,
    `RETURNING id),
  last AS (DELETE FROM outbox_last_leases
    WHERE id IN (SELECT id FROM acked))
  SELECT n.now, (SELECT count(*) FROM moved)::integer AS acknowledged`,
  ],
);

const IDENT_ENQUEUE = `WITH n AS MATERIALIZED (SELECT coalesce($1::bigint,
    floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now)
  INSERT INTO outbox_events
    (queue, state, payload, dedup_key, ordering_key, due_at,
      max_attempts, created_at, updated_at, identity)
    SELECT $3::text, 'pending', d.value ->> 0, NULL, NULL,
      (SELECT now FROM n) + $4::bigint, $5::integer, (SELECT now FROM n),
      (SELECT now FROM n), (d.value ->> 1)::uuid
    FROM json_array_elements($2::json) WITH ORDINALITY AS d (value, n)
    ORDER BY d.n
    RETURNING id, identity, queue, dedup_key`;

/**
 * The batch acknowledgement without locking the leases first (`FOR UPDATE`
 * writes a WAL record per row before the DELETE writes its own): each
 * lease's DELETE carries its fence, so each acknowledgement stands alone,
 * the statement answering how many (not all or none).
 */
const UNLOCKED_ACK = patched(
  POSTGRES.acknowledgeAllInOne,
  [
    `AND ${EXHAUSTED_NOW} IS NULL
    FOR UPDATE OF e)`,
    `AND ${EXHAUSTED_NOW} IS NULL)`,
  ],
  [
    `acked AS (DELETE FROM outbox_events AS e
    WHERE e.id IN (SELECT id FROM matched) AND NOT (SELECT count(DISTINCT id) FROM matched) <> (SELECT count(*) FROM l)
    RETURNING e.*)`,
    `acked AS (DELETE FROM outbox_events AS e USING l
    WHERE e.id IN (SELECT id FROM matched) AND e.id = l.id
      AND e.token = l.token AND e.fence = l.fence AND e.state = 'leased'
    RETURNING e.*)`,
  ],
);

const NOPK = "ALTER TABLE outbox_done DROP CONSTRAINT outbox_done_pkey";

const LAYOUTS: Layout[] = [
  V8,
  { ...V8, name: "v8b" },
  FIX,
  { ...FIX, name: "arr", ack: arrayAck(POSTGRES.acknowledgeAllInOne) },
  { ...FIX, name: "nopk", patch: NOPK },
  {
    ...FIX,
    name: "arr+nopk",
    patch: NOPK,
    ack: arrayAck(POSTGRES.acknowledgeAllInOne),
  },
  { ...FIX, name: "nolock", ack: jsonAck(UNLOCKED_ACK) },
  {
    ...FIX,
    name: "nolock+arr+nopk",
    patch: NOPK,
    ack: arrayAck(UNLOCKED_ACK),
  },
  {
    ...FIX,
    name: "hot80",
    patch: hotPatch(80),
    claim: HOT_CLAIM,
    ack: jsonAck(HOT_ACK),
  },
  {
    ...FIX,
    name: "hot50",
    patch: hotPatch(50),
    claim: HOT_CLAIM,
    ack: jsonAck(HOT_ACK),
  },
  {
    ...FIX,
    name: "hot50+arr+nopk",
    patch: `${hotPatch(50)};\n${NOPK}`,
    claim: HOT_CLAIM,
    ack: arrayAck(HOT_ACK),
  },
  {
    ...FIX,
    name: "ident",
    patch:
      `CREATE UNIQUE INDEX outbox_events_identity ON outbox_events (identity);
CREATE UNIQUE INDEX outbox_done_identity ON outbox_done (identity)`,
    enqueue: IDENT_ENQUEUE,
  },
];

const hexTokens = (n: number) =>
  Array.from(
    crypto.getRandomValues(new Uint8Array(16 * n)),
    (x) => x.toString(16).padStart(2, "0"),
  ).join("");

async function enqueue(db: Driver, layout: Layout, queue: string, n: number) {
  const at = Date.now();
  const rows = Array.from(
    { length: n },
    (_, i) => [JSON.stringify({ i }), uuidv7(at)],
  );
  const inserted = await db.query(layout.enqueue, [
    null,
    JSON.stringify(rows),
    queue,
    0,
    5,
  ]);
  if (inserted.length !== n) throw new Error(`${layout.name}: enqueue short`);
}

async function claim(
  db: Driver,
  layout: Layout,
  queue: string,
  max: number,
  leaseMs: number,
): Promise<Lease[]> {
  const rows = await db.query(layout.claim, [
    null,
    queue,
    max,
    1 << 20,
    leaseMs,
    hexTokens(max),
  ]);
  if (rows[0]?.["refused"] === 1) throw new Error(`${layout.name}: refused`);
  return rows.filter((r) => r["id"] !== null).map((r) => ({
    id: Number(r["id"]),
    fence: Number(r["fence"]),
    token: String(r["token"]),
  }));
}

/** The 30-second leases of queue `q` (a claim under EXPLAIN took them). */
async function justClaimed(db: Driver): Promise<Lease[]> {
  const rows = await db.query(
    `SELECT id, fence, token FROM outbox_events
    WHERE queue = 'q' AND state = 'leased' AND lease_until < $1 ORDER BY id`,
    [Date.now() + 60_000],
  );
  return rows.map((r) => ({
    id: Number(r["id"]),
    fence: Number(r["fence"]),
    token: String(r["token"]),
  }));
}

async function cycle(db: Driver, layout: Layout, queue: string, max: number) {
  const leases = await claim(db, layout, queue, max, 30_000);
  const [sql, params] = layout.ack(leases);
  const [row] = await db.query(sql, params);
  if (Number(row?.["acknowledged"]) !== leases.length) {
    throw new Error(`${layout.name}: acknowledged ${row?.["acknowledged"]}`);
  }
  return leases.length;
}

if (import.meta.main) {
  const rounds = Number(Deno.args[0] ?? 4);
  const inflight = Number(Deno.args[1] ?? 0);
  const only = Deno.args[2]?.split(",");
  const layouts = LAYOUTS.filter((l) => !only || only.includes(l.name));
  const batches = 16, max = 256;
  const server = await startPostgres();
  try {
    const dbs: Driver[] = [];
    for (const layout of layouts) {
      const schema = `l_${layout.name.replaceAll("+", "_")}`;
      const admin = await connectPostgres(server.url, { listen: false });
      await admin.run(`CREATE SCHEMA ${schema}`);
      await admin.close();
      const db = await connectPostgres(server.url, { schema, listen: false });
      await db.exec(POSTGRES_SCHEMA);
      if (layout.patch) await db.exec(layout.patch);
      dbs.push(db);
    }
    const monitor = await connectPostgres(server.url, { listen: false });
    const wal = walPosition(monitor);
    const result: Record<string, Record<string, number[]>> = {};
    const record = (l: string, k: string, v: number) =>
      ((result[l] ??= {})[k] ??= []).push(v);
    const timed = async (work: () => Promise<number>) => {
      const w = await wal();
      const t = performance.now();
      const events = await work();
      const ms = performance.now() - t;
      return { events, ms, wal: (await wal()) - w };
    };
    // Round 0 warms up. Then each batch runs on every layout in turn (the
    // order rotating), so the machine's load falls on all of them alike.
    for (let b = 0; b <= rounds; b++) {
      const sums = layouts.map(() => ({ c: [0, 0, 0], e: [0, 0, 0] }));
      for (const [i, layout] of layouts.entries()) {
        const db = dbs[i]!;
        if (b === 0 && inflight > 0) {
          for (let n = 0; n < inflight; n += max) {
            await enqueue(db, layout, "q", Math.min(max, inflight - n));
            await claim(
              db,
              layout,
              "q",
              Math.min(max, inflight - n),
              3_600_000,
            );
          }
        }
        for (let f = 0; f < batches; f++) await enqueue(db, layout, "q", max);
        if (b === 0) await db.run("ANALYZE");
      }
      for (let f = 0; f < batches; f++) {
        // A fresh random order each batch: no layout always follows another.
        const order = layouts.map((_, i) => i);
        for (let k = order.length - 1; k > 0; k--) {
          const r = Math.floor(Math.random() * (k + 1));
          [order[k], order[r]] = [order[r]!, order[k]!];
        }
        for (const i of order) {
          const layout = layouts[i]!, db = dbs[i]!;
          const c = await timed(() => cycle(db, layout, "q", max));
          const e = await timed(async () => {
            await enqueue(db, layout, "e", max);
            return max;
          });
          for (const [sum, m] of [[sums[i]!.c, c], [sums[i]!.e, e]] as const) {
            sum[0]! += m.events;
            sum[1]! += m.ms;
            sum[2]! += m.wal;
          }
        }
      }
      if (b === 0) continue;
      for (const [i, layout] of layouts.entries()) {
        const { c, e } = sums[i]!;
        record(layout.name, "claim+ack/s", c[0]! / c[1]! * 1000);
        record(layout.name, "claim+ack WAL B/event", c[2]! / c[0]!);
        record(layout.name, "enqueue/s", e[0]! / e[1]! * 1000);
        record(layout.name, "enqueue WAL B/event", e[2]! / e[0]!);
      }
    }
    const median = (a: number[]) =>
      [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!;
    console.log(`inflight ${inflight}, ${rounds} rounds of ${batches}x${max}`);
    for (const [name, kinds] of Object.entries(result)) {
      for (const [kind, values] of Object.entries(kinds)) {
        console.log(
          `${name}\t${kind}\tmedian ${median(values).toFixed(0)}\t[${
            values.map((v) => v.toFixed(0)).join(", ")
          }]`,
        );
      }
    }
    for (const base of ["v8", "fix"].filter((b) => result[b])) {
      for (const kind of ["claim+ack/s", "enqueue/s"]) {
        for (const l of layouts.filter((l) => l.name !== base)) {
          const ratios = result[l.name]![kind]!.map((v, i) =>
            v / result[base]![kind]![i]!
          );
          console.log(
            `${l.name}/${base} ${kind}: ${
              ratios.map((r) => r.toFixed(2)).join(", ")
            } median ${median(ratios).toFixed(2)}`,
          );
        }
      }
    }
    // The server's own time for each statement: EXPLAIN ANALYZE (timing
    // off) of a claim of 256 and of its acknowledgement, alternating.
    if (Deno.env.get("EXPLAIN")) {
      const server: Record<string, { claim: number[]; ack: number[] }> = {};
      const ms = (plan: Record<string, unknown>[]) => {
        const value = Object.values(plan[0]!)[0];
        const parsed =
          (typeof value === "string" ? JSON.parse(value) : value) as {
            "Execution Time": number;
          }[];
        return parsed[0]!["Execution Time"];
      };
      for (let r = 0; r < Number(Deno.env.get("EXPLAIN")); r++) {
        for (const [i, layout] of layouts.entries()) {
          const db = dbs[i]!;
          await enqueue(db, layout, "q", max);
          const plan = await db.query(
            `EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) ${layout.claim}`,
            [null, "q", max, 1 << 20, 30_000, hexTokens(max)],
          );
          // The claim the EXPLAIN made, acknowledged under EXPLAIN too.
          const leases = await justClaimed(db);
          const [sql, params] = layout.ack(leases);
          const ackPlan = await db.query(
            `EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) ${sql}`,
            params,
          );
          const s = server[layout.name] ??= { claim: [], ack: [] };
          s.claim.push(ms(plan));
          s.ack.push(ms(ackPlan));
        }
      }
      for (const [name, s] of Object.entries(server)) {
        console.log(
          `${name}	server ms per 256: claim median ${
            median(s.claim).toFixed(1)
          } [${s.claim.map((v) => v.toFixed(1)).join(", ")}], ack min ${
            Math.min(...s.ack).toFixed(1)
          } median ${median(s.ack).toFixed(1)} [${
            s.ack.map((v) => v.toFixed(1)).join(", ")
          }]`,
        );
      }
    }
    if (Deno.env.get("PLAN")) {
      for (const [i, layout] of layouts.entries()) {
        await enqueue(dbs[i]!, layout, "q", max);
        const plan = await dbs[i]!.query(
          `EXPLAIN (ANALYZE, BUFFERS, WAL) ${layout.claim}`,
          [null, "q", max, 1 << 20, 30_000, hexTokens(max)],
        );
        console.log(
          layout.name,
          plan.map((r) => Object.values(r)[0]).join("\n"),
        );
        const leases = await justClaimed(dbs[i]!);
        const [sql, params] = layout.ack(leases);
        const ackPlan = await dbs[i]!.query(
          `EXPLAIN (ANALYZE, BUFFERS, WAL) ${sql}`,
          params,
        );
        console.log(
          layout.name,
          "ack",
          ackPlan.map((r) => Object.values(r)[0]).join("\n"),
        );
      }
    }
    await new Promise((r) => setTimeout(r, 1500));
    for (const layout of layouts) {
      const schema = `l_${layout.name.replaceAll("+", "_")}`;
      const [row] = await monitor.query(
        `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
        WHERE schemaname = $1 AND relname = 'outbox_events'`,
        [schema],
      );
      console.log(
        `${layout.name}\toutbox_events updates ${row?.["n_tup_upd"]}, HOT ${
          row?.["n_tup_hot_upd"]
        }`,
      );
    }
    for (const db of dbs) await db.close();
    await monitor.close();
  } finally {
    await server.stop();
  }
}
