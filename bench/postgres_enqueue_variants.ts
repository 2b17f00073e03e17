/**
 * Issue 39's batch enqueue A/B: variants of PostgreSQL's batch enqueue of
 * 256 events differing only in payload (`insertMinted`, the statement
 * `enqueueBatch` sends outside a transaction), alternated on one server
 * with graphile-worker's `addJobs` of the same payloads, each judged by
 * the CPU time the server's processes spent on it (`/proc/<pid>/schedstat`
 * of every child of the postmaster: the backend, and the WAL writer a
 * commit wakes), beside its wall time, this process's CPU time and the WAL
 * bytes it wrote, as `bench/postgres_variants.ts` judges claims. Wall time
 * swings with other sessions' load; CPU time on a core far less.
 *
 * ```sh
 * deno run -A bench/postgres_enqueue_variants.ts [rounds] [variants] [drained] [batches]
 * ```
 *
 * `rounds` (default 48): blocks per variant, in rounds that run every
 * variant once, the order reversing each round. `variants`: a comma list
 * of the names below (default all). `drained` (default 28672): events
 * enqueued, claimed and acknowledged in the queue `default` before the
 * rounds, as `postgres_bench.ts --peers` does in its claim row before its
 * enqueue row (the measured queue sorts before `default`, so its entries
 * in the claim index go in before that queue's). `batches` (default 4):
 * batches of 256 per block, timed together.
 *
 * - `main`, `main again`: `enqueueBatch` with the dialect's statement (the
 *   second the A/A control).
 * - `v8 statement`, `main statement`: the statement as version 8 shipped
 *   it (c176365: each element a JSON array [payload text, identity] read
 *   with `->>`, the keys first with ids drawn from the sequence, a row per
 *   event back) and the dialect's, run on the outbox's connection outside
 *   the API, with the same validation of the payloads first
 *   (`prepareBatch`) and the same minting of identities.
 * - `keys first`: the dialect's statement with the keys inserted first, their
 *   ids drawn from the sequence (as version 8 did).
 * - `less keys`, `less claim index`: the dialect's statement without the
 *   keys' insert, and on a schema without `outbox_events_claim_priority`:
 *   what each costs (neither is correct).
 * - `queue id in the claim index`: the claim index keyed by an integer
 *   queue id (a column of its own, 1 here) in place of the queue's text,
 *   so its comparisons read fixed-width keys (a schema change, measured
 *   in a schema of its own; the claims there still use the text).
 * - `no trigger`: on a schema without the NOTIFY trigger (not correct).
 * - `graphile addJobs`: graphile-worker 0.18's `addJobs`, its pool of 10.
 *
 * `PERF_OUT=file [PERF_SECONDS=8] [PERF_GRAPH=dwarf]`: instead of the
 * rounds, `perf record` of the first variant's backend while it enqueues.
 *
 * @module
 */
import process from "node:process";
import { Logger, makeWorkerUtils } from "npm:graphile-worker@0.18.0";
import { POSTGRES } from "../dialects/postgres.ts";
import { prepareBatch } from "../core/arguments.ts";
import { uuidv7 } from "../identity.ts";
import { type Driver, integerOf } from "../driver.ts";
import type { Outbox } from "../mod.ts";
import { median } from "./table.ts";
import { alternateRounds, patched, quartiles } from "./variants.ts";

interface Variant {
  /** A batch of its own on the outbox's connection, with `sql`. */
  readonly run?: (
    driver: Driver,
    payloads: unknown[],
    sql: string,
  ) => Promise<number>;
  /** The statement `run` sends, prepared as the dialect's are. */
  readonly sql?: string;
  /** A schema of its own (its own outbox), and SQL run there first. */
  readonly schema?: { readonly name: string; readonly setup: string };
  /** graphile-worker's addJobs. */
  readonly graphile?: true;
}

const MAX = 256;
const QUEUE = "bench_peers_enqueue";
const NOW = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
const CLOCK = `n AS MATERIALIZED (SELECT coalesce($1::bigint, ${NOW}) AS now)`;

// insertMinted as version 8 shipped it (c176365).
const V8 = `WITH ${CLOCK},
  s AS MATERIALIZED (SELECT pg_get_serial_sequence('outbox_events', 'id')::regclass AS seq),
  d AS MATERIALIZED (SELECT e.value, e.n,
      nextval((SELECT seq FROM s)) AS id
    FROM json_array_elements($2::json) WITH ORDINALITY AS e (value, n)
    ORDER BY e.n),
  k AS (INSERT INTO outbox_keys (identity, event_id, queue, dedup_key)
    SELECT (d.value ->> 1)::uuid, d.id, $3::text, NULL
    FROM d ORDER BY d.n)
  INSERT INTO outbox_events
    (id, queue, state, payload, dedup_key, ordering_key, due_at,
      max_attempts, created_at, updated_at, identity)
    SELECT d.id, $3::text, 'pending', d.value ->> 0, NULL, NULL,
      (SELECT now FROM n) + $4::bigint, $5::integer, (SELECT now FROM n),
      (SELECT now FROM n), (d.value ->> 1)::uuid
    FROM d
    ORDER BY d.n
    RETURNING id, identity, queue, dedup_key`;

const KEYS_FIRST = `WITH ${CLOCK},
  s AS MATERIALIZED (SELECT pg_get_serial_sequence('outbox_events', 'id')::regclass AS seq),
  d AS MATERIALIZED (SELECT d.payload, d.identity, d.n,
      nextval((SELECT seq FROM s)) AS id
    FROM ROWS FROM (json_array_elements($2::json), unnest($6::uuid[]))
      WITH ORDINALITY AS d (payload, identity, n)
    ORDER BY d.n),
  k AS (INSERT INTO outbox_keys (identity, event_id, queue)
    SELECT d.identity, d.id, $3::text FROM d ORDER BY d.n),
  e AS (INSERT INTO outbox_events
    (id, queue, state, payload, due_at, max_attempts, created_at, updated_at,
      identity)
    SELECT d.id, $3::text, 'pending', d.payload::text,
      (SELECT now FROM n) + $4::bigint, $5::integer, (SELECT now FROM n),
      (SELECT now FROM n), d.identity
    FROM d ORDER BY d.n
    RETURNING id)
  SELECT string_agg(id::text, ',' ORDER BY id) AS ids FROM e`;

const LESS_KEYS = patched(POSTGRES.insertMinted!, [
  `,
  k AS (INSERT INTO outbox_keys (identity, event_id, queue)
    SELECT identity, id, queue FROM e)`,
  "",
]);

// The claim index on a fixed-width queue id in place of the queue's text
// (the drained events' ids are null, which sorts after 1, so the measured
// queue's entries still go in before theirs).
const QUEUE_ID = patched(POSTGRES.insertMinted!, [
  "(queue, state, payload,",
  "(queue_id, queue, state, payload,",
], ["SELECT $3::text, 'pending',", "SELECT 1, $3::text, 'pending',"]);
const QUEUE_ID_SETUP = `ALTER TABLE outbox_events ADD COLUMN queue_id integer;
DROP INDEX outbox_events_claim_priority;
CREATE INDEX bench_claim_queue_id
  ON outbox_events (queue_id, priority DESC, due_at, id)
  WHERE state IN ('pending', 'leased')`;

const DEFAULTS = {
  queue: "default",
  maxAttempts: 10,
  maxPayloadBytes: 1 << 20,
};

/** The batch's events validated and encoded, and identities minted. */
function prepared(payloads: unknown[]) {
  const events = prepareBatch(
    "enqueue batch",
    payloads.map((payload) => ({ payload, queue: QUEUE })),
    DEFAULTS,
  );
  const now = Date.now();
  return { events, identities: events.map(() => uuidv7(now)) };
}

/** Version 8's parameters and answer. */
async function v8Batch(driver: Driver, payloads: unknown[], sql: string) {
  const { events, identities } = prepared(payloads);
  const rows = await driver.query(sql, [
    null,
    JSON.stringify(events.map((event, i) => [event.payload, identities[i]])),
    QUEUE,
    0,
    10,
  ]);
  const inserted = new Map(rows.map((row) => [String(row["identity"]), row]));
  return identities.map((identity) => integerOf(inserted.get(identity)!, "id"))
    .length;
}

/** The dialect's parameters and answer (core/enqueue.ts). */
async function mainBatch(driver: Driver, payloads: unknown[], sql: string) {
  const { events, identities } = prepared(payloads);
  const [row] = await driver.query(sql, [
    null,
    `[${events.map((event) => event.payload).join(",")}]`,
    QUEUE,
    0,
    10,
    `{${identities.join(",")}}`,
  ]);
  return String(row?.["ids"]).split(",").map(Number).length;
}

const VARIANTS: Record<string, Variant> = {
  "main": {},
  "main again": {},
  "v8 statement": { run: v8Batch, sql: V8 },
  "main statement": { run: mainBatch, sql: POSTGRES.insertMinted! },
  "keys first": { run: mainBatch, sql: KEYS_FIRST },
  "less keys": { run: mainBatch, sql: LESS_KEYS },
  "less claim index": {
    schema: {
      name: "bench_no_claim_index",
      setup: "DROP INDEX outbox_events_claim_priority",
    },
  },
  "queue id in the claim index": {
    run: mainBatch,
    sql: QUEUE_ID,
    schema: { name: "bench_queue_id", setup: QUEUE_ID_SETUP },
  },
  "no trigger": {
    schema: {
      name: "bench_no_trigger",
      setup: "DROP TRIGGER outbox_events_notify ON outbox_events",
    },
  },
  "graphile addJobs": { graphile: true },
};

const rounds = Number(Deno.args[0] ?? 48);
const names = Deno.args[1]?.split(",") ?? Object.keys(VARIANTS);
const drained = Number(Deno.args[2] ?? 28_672);
const perBlock = Number(Deno.args[3] ?? 4);
for (const name of names) {
  if (VARIANTS[name] === undefined) throw new Error(`No variant ${name}`);
}

// The variants' statements join the dialect's before the driver loads, so
// it prepares them by name as it does the dialect's own.
const dialect = POSTGRES as unknown as Record<string, unknown>;
for (const [i, name] of names.entries()) {
  const sql = VARIANTS[name]!.sql;
  if (sql !== undefined && !Object.values(dialect).includes(sql)) {
    dialect[`benchEnqueue${i}`] = sql;
  }
}
const { connectPostgres } = await import("../drivers/postgres.ts");
const { Outbox: OutboxClass } = await import("../mod.ts");
const { startPostgres } = await import("../scripts/postgres_server.ts");

const server = await startPostgres();
try {
  await using monitor = await connectPostgres(server.url, { listen: false });
  const [me] = await monitor.query("SELECT pg_backend_pid() AS pid");
  const stat = Deno.readTextFileSync(`/proc/${me?.["pid"]}/stat`);
  const postmaster = Number(
    stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1],
  );
  const schemas = [
    ...new Set(
      names.filter((n) => !VARIANTS[n]!.graphile).map((n) =>
        VARIANTS[n]!.schema?.name ?? "public"
      ),
    ),
  ];
  const outboxes = new Map<string, { outbox: Outbox; driver: Driver }>();
  for (const schema of schemas) {
    await monitor.run(`CREATE SCHEMA IF NOT EXISTS ${schema}`);
    const driver = await connectPostgres(server.url, {
      listen: false,
      schema,
    });
    const outbox = await OutboxClass.open(driver, { now: "database" });
    await monitor.run(`SET search_path = ${schema}`);
    for (const n of names) {
      const setup = VARIANTS[n]!.schema;
      if (setup?.name === schema) await monitor.exec(setup.setup);
    }
    outboxes.set(schema, { outbox, driver });
    for (let left = drained; left > 0; left -= MAX) {
      await outbox.enqueueBatch(
        Array.from({ length: MAX }, (_, i) => ({ payload: { i } })),
      );
      await outbox.acknowledge(await outbox.claim({ max: MAX }));
    }
  }
  await monitor.run("SET search_path = public");
  const utils = names.some((n) => VARIANTS[n]!.graphile)
    ? await makeWorkerUtils({
      connectionString: server.url,
      logger: new Logger(() => () => {}),
    })
    : undefined;
  await utils?.migrate();

  /** The server's processes' time on a core so far, in milliseconds. */
  const serverCpu = () => {
    let total = 0;
    for (const entry of Deno.readDirSync("/proc")) {
      if (!/^\d+$/.test(entry.name)) continue;
      try {
        const stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
        const ppid = Number(
          stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1],
        );
        if (ppid !== postmaster) continue;
        total += Number(
          Deno.readTextFileSync(`/proc/${entry.name}/schedstat`).split(" ")[0],
        );
      } catch {
        // A process that ended meanwhile.
      }
    }
    return total / 1e6;
  };
  const wal = async () => {
    const [row] = await monitor.query(
      "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS at",
    );
    return Number(row?.["at"]);
  };

  let next = 0;
  const batch = async (name: string, i: number) => {
    const variant = VARIANTS[name]!;
    const payloads = Array.from({ length: MAX }, () => ({ i: next++ }));
    if (variant.graphile) {
      await utils!.addJobs(
        payloads.map((payload) => ({ identifier: "bench_enqueue", payload })),
      );
      return;
    }
    const { outbox, driver } = outboxes.get(variant.schema?.name ?? "public")!;
    if (variant.run) {
      const sql = (dialect[`benchEnqueue${i}`] ?? variant.sql) as string;
      if (await variant.run(driver, payloads, sql) !== MAX) {
        throw new Error(`${name}: short`);
      }
      return;
    }
    await outbox.enqueueBatch(
      payloads.map((payload) => ({ payload, queue: QUEUE })),
    );
  };
  const measured = async (name: string, i: number) => {
    const at = await wal();
    const server = serverCpu();
    const client = process.cpuUsage();
    const started = performance.now();
    for (let b = 0; b < perBlock; b++) await batch(name, i);
    const wall = performance.now() - started;
    const { user, system } = process.cpuUsage(client);
    return {
      wall: wall / perBlock,
      server: (serverCpu() - server) / perBlock,
      client: (user + system) / 1e3 / perBlock,
      wal: ((await wal()) - at) / MAX / perBlock,
    };
  };
  // Each variant's statements prepared and past their custom plans.
  for (const [i, name] of names.entries()) {
    for (let c = 0; c < 8; c++) await batch(name, i);
  }
  const perfOut = Deno.env.get("PERF_OUT");
  if (perfOut !== undefined) {
    const first = VARIANTS[names[0]!]!;
    const { driver } = outboxes.get(first.schema?.name ?? "public")!;
    const [row] = await driver.query("SELECT pg_backend_pid() AS pid");
    const perf = new Deno.Command("perf", {
      args: [
        "record",
        "-F",
        "1000",
        "--call-graph",
        Deno.env.get("PERF_GRAPH") ?? "fp",
        "-p",
        String(row?.["pid"]),
        "-o",
        perfOut,
        "--",
        "sleep",
        Deno.env.get("PERF_SECONDS") ?? "8",
      ],
      stdout: "null",
      stderr: "null",
    }).spawn();
    let done = false;
    const status = perf.status.then(() => done = true);
    let count = 0;
    while (!done) {
      await batch(names[0]!, 0);
      count++;
    }
    await status;
    console.log(`${count} batches of ${names[0]} profiled into ${perfOut}`);
  } else {
    const load = [Deno.loadavg()[0]!];
    const runs = await alternateRounds(
      names.length,
      rounds,
      (i) => measured(names[i]!, i),
    );
    load.push(Deno.loadavg()[0]!);
    const lines = [
      `${rounds} blocks of ${perBlock} batches of ${MAX} per variant, alternated, after ${drained} events claimed and acknowledged; load average ${
        load.map((l) => l.toFixed(1)).join(" to ")
      }`,
      "",
      "| variant | server CPU ms per batch | to main (quartiles of per-block ratios) | client CPU ms | server + client to main | wall ms | wall to main | WAL B/event |",
      "|---|---:|---:|---:|---:|---:|---:|---:|",
    ];
    const base = runs[0]!;
    for (const [i, name] of names.entries()) {
      const run = runs[i]!;
      const [q1, q2, q3] = quartiles(
        run.server.map((s, c) => s / base.server[c]!),
      );
      const [, both] = quartiles(
        run.server.map((s, c) =>
          (s + run.client[c]!) / (base.server[c]! + base.client[c]!)
        ),
      );
      const [, wall] = quartiles(run.wall.map((w, c) => w / base.wall[c]!));
      lines.push(
        `| ${name} | ${median(run.server).toFixed(2)} | ${q2!.toFixed(3)} (${
          q1!.toFixed(2)
        }–${q3!.toFixed(2)}) | ${median(run.client).toFixed(2)} | ${
          both!.toFixed(3)
        } | ${median(run.wall).toFixed(2)} | ${wall!.toFixed(3)} | ${
          median(run.wal).toFixed(0)
        } |`,
      );
    }
    console.log(lines.join("\n"));
  }
  await utils?.release();
  for (const { outbox, driver } of outboxes.values()) {
    await outbox.close();
    await driver.close();
  }
} finally {
  await server.stop();
}
