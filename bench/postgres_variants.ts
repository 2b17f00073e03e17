/**
 * Issue 39's statement A/B on a loaded machine: variants of PostgreSQL's
 * one-statement batch claim and acknowledgement, alternated cycle by cycle
 * (claim 256, acknowledge them) through the outbox's own API on one
 * server, each cycle judged by the CPU time the server's backend spent on
 * it (`/proc/<pid>/schedstat`, nanoseconds on a core), beside its wall
 * time and this process's CPU time. The machine has no hardware counters
 * to count instructions, and wall time swings with other sessions' load;
 * a backend's time on a core swings far less, so per-cycle ratios to the
 * dialect's own statements (and an A/A control of them) read a change of a
 * few percent.
 *
 * ```sh
 * deno run -A bench/postgres_variants.ts [rounds] [variants] [inflight]
 * ```
 *
 * `rounds` (default 96): cycles per variant, in rounds that run every
 * variant once, the order reversing each round. `variants`: a comma list
 * of the names below (default all). `inflight` (default 0): leases of an
 * hour each variant's schema holds through the rounds, claimed (by the
 * schema's first variant's claim) before them and never acknowledged, as
 * a processing loop's handlers hold theirs.
 *
 * - `main`, `main again`: the dialect's `claimInOne` and
 *   `acknowledgeAllInOne` (the second the A/A control).
 * - `bare claim`: a claim with none of the statement's guards (flow
 *   control, per-key limits, ordering keys, refusals, the JSON check, the
 *   final sort): not a correct claim, the floor of what the statement's
 *   shape costs beyond locking and updating the rows.
 * - `claim less gate`, `claim less per-key window`, `claim less tail`: the
 *   dialect's claim less one of its parts, to price each (none is a correct
 *   claim): the flow-control gate (the queue's row locked and written, the
 *   `moved` refusal); the per-key limit's window over the candidates and
 *   its filter (the claim order's numbering stays); the JSON check of the
 *   claimed payloads and the final sort.
 * - `bare ack`: an acknowledgement that deletes each lease's row by its
 *   fence without locking the leases first (each lease on its own, not all
 *   or none), moving it to `outbox_done` as the dialect does.
 * - `fillfactor 70`: the dialect's statements on an `outbox_events` of
 *   fillfactor 70 (in a schema of its own, with an outbox of its own).
 * - `v8`: schema version 8's layout and statements, against which
 *   version 9 (its claims and renewals HOT updates) is measured: a schema
 *   of its own turned back into version 8 (`POSTGRES_AS_VERSION_8` of
 *   tests/helpers.ts), and the dialect's claim and acknowledgement with
 *   version 9's changes taken back (`V8_EDITS`). (The study before version
 *   9, a `hot claim` variant of version 8, is in bench/README.md.)
 *
 * The variants are set on the dialect object before the driver module
 * loads, as extra entries, so the driver prepares them as it prepares the
 * dialect's own (a statement it does not know goes unnamed and is planned
 * at every call, a few milliseconds for the claim); each cycle points the
 * dialect's two statements at its variant's.
 *
 * Prints Markdown tables: per variant, the medians and the quartiles of
 * its per-cycle ratios to the first variant named, with the load average; per schema, the
 * updates of `outbox_events` and how many were HOT; per prepared claim and
 * acknowledgement, how often the server used its generic plan and how
 * often it planned a custom one (planned again at that call: the backlog
 * here, about 100,000 events, can tip the claim to custom plans). Not part
 * of `deno task bench`: a profile, not a row.
 *
 * @module
 */
import process from "node:process";
import { POSTGRES } from "../dialects/postgres.ts";
import { POSTGRES_AS_VERSION_8 } from "../tests/helpers.ts";
import { median } from "./table.ts";
import { alternateRounds, onCoreMs, patched, quartiles } from "./variants.ts";

interface Variant {
  readonly claim?: string;
  readonly acknowledge?: string;
  /** A schema of its own (its own outbox), and SQL run there first. */
  readonly schema?: { readonly name: string; readonly setup: string };
}

const NOW = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
const BARE_CLAIM =
  `WITH n AS MATERIALIZED (SELECT coalesce($1::bigint, ${NOW}) AS now),
  c AS MATERIALIZED (SELECT e.id, e.priority, e.due_at FROM outbox_events AS e
    WHERE e.queue = $2 AND e.state IN ('pending', 'leased')
      AND e.due_at <= (SELECT now FROM n)
    ORDER BY e.priority DESC, e.due_at, e.id LIMIT $3
    FOR UPDATE OF e SKIP LOCKED),
  k AS MATERIALIZED (SELECT id,
      row_number() OVER (ORDER BY priority DESC, due_at, id) AS k
    FROM c),
  t AS MATERIALIZED (SELECT decode($6, 'hex') AS bytes)
  UPDATE outbox_events AS e SET state = 'leased', fence = e.fence + 1,
    attempt = e.attempt + 1, lease_until = n.now + $5, due_at = n.now + $5,
    updated_at = n.now, claimed_at = n.now,
    token = encode(substring(t.bytes FROM k.k::integer * 16 - 15 FOR 16), 'hex')
  FROM k, n, t WHERE e.id = k.id AND $4::integer > 0
  RETURNING n.now, 0 AS refused, k.k, e.id, e.identity, e.fence, e.attempt,
    e.max_attempts, e.lease_until, e.token, e.payload, e.payload_bytes,
    e.ordering_key, e.last_error`;
const DONE_COLUMNS =
  "id, queue, state, payload, payload_bytes, dedup_key, ordering_key, due_at, lease_until, token, fence, attempt, max_attempts, last_error, created_at, updated_at, done_at, claimed_at, identity, priority, concurrency_key";
const BARE_ACKNOWLEDGE =
  `WITH n AS MATERIALIZED (SELECT coalesce($1::bigint, ${NOW}) AS now),
  l AS MATERIALIZED (SELECT (a.v ->> 0)::bigint AS id,
      (a.v ->> 1)::bigint AS fence, a.v ->> 2 AS token
    FROM jsonb_array_elements($2::jsonb) AS a (v)),
  acked AS (DELETE FROM outbox_events AS e USING l
    WHERE e.id = l.id AND e.token = l.token AND e.fence = l.fence
      AND e.state = 'leased'
    RETURNING e.*),
  moved AS (INSERT INTO outbox_done (${DONE_COLUMNS})
    SELECT d.id, d.queue, 'done', d.payload, d.payload_bytes, d.dedup_key,
      d.ordering_key, d.due_at, d.lease_until, d.token, d.fence, d.attempt,
      d.max_attempts, d.last_error, d.created_at, (SELECT now FROM n),
      (SELECT now FROM n), d.claimed_at, d.identity, d.priority,
      d.concurrency_key
    FROM acked AS d RETURNING id)
  SELECT n.now, (SELECT count(*) FROM moved)::integer AS acknowledged FROM n`;

/** The text of `sql` from `from` up to `to`. */
function between(sql: string, from: string, to: string): string {
  return sql.slice(sql.indexOf(from), sql.indexOf(to));
}

// Version 9's changes to the claim and the acknowledgement, each [version
// 9's text, version 8's].
const NOW_N = "(SELECT now FROM n)";
const V8_EDITS: [string, string][] = [
  [
    `lease_until = n.now + $5,
      updated_at = n.now, claimed_at = n.now,
      keyed_lease = CASE WHEN e.ordering_key IS NOT NULL
        OR e.concurrency_key IS NOT NULL THEN true END,
      last_lease = CASE WHEN e.attempt + 1 >= e.max_attempts THEN true END,`,
    `lease_until = n.now + $5, due_at = n.now + $5,
      updated_at = n.now, claimed_at = n.now,`,
  ],
  [
    `e.done_at IS NULL AND e.due_at <= ${NOW_N}
      AND e.state = 'pending' AND `,
    `e.state IN ('pending', 'leased')
      AND e.due_at <= ${NOW_N}
      AND `,
  ],
  [between(POSTGRES.claimInOne, "\n  last AS MATERIALIZED", "\n  t AS"), ""],
  [
    between(
      POSTGRES.claimInOne,
      "\n    UNION ALL (SELECT 1 FROM outbox_events AS e",
      "\n    UNION ALL SELECT 1 FROM g WHERE moved",
    ),
    "",
  ],
  [
    `AND p.id < e.id AND p.done_at IS NULL
          AND p.state IN ('pending', 'leased')`,
    "AND p.id < e.id AND p.state IN ('pending', 'leased')",
  ],
  [
    `AND p.keyed_lease AND p.done_at IS NULL
          AND p.state = 'leased' AND p.lease_until > ${NOW_N}`,
    `AND p.state = 'leased' AND p.due_at > ${NOW_N}`,
  ],
  [
    `AND k.keyed_lease AND k.concurrency_key IS NOT NULL
            AND k.done_at IS NULL AND k.state = 'leased'
            AND k.lease_until > ${NOW_N}`,
    `AND k.state = 'leased' AND k.concurrency_key IS NOT NULL
            AND k.due_at > ${NOW_N}`,
  ],
  [
    `WHERE last_lease AND done_at IS NULL
      AND state = 'leased' AND attempt >= max_attempts
      AND lease_until <= ${NOW_N}
    ORDER BY id LIMIT 1)`,
    `WHERE state = 'leased' AND attempt >= max_attempts
      AND due_at <= ${NOW_N}
    ORDER BY due_at LIMIT 1)`,
  ],
];
const V8_CLAIM = patched(POSTGRES.claimInOne, ...V8_EDITS);
// Run at the start of the transaction that reads the plans.
const V8_NOW_EXHAUSTED = patched(POSTGRES.nowExhausted, [
  `WHERE last_lease AND done_at IS NULL AND state = 'leased'
        AND attempt >= max_attempts AND lease_until <= n.now`,
  "WHERE state = 'leased' AND attempt >= max_attempts AND due_at <= n.now",
]);
const V8_ACKNOWLEDGE = patched(
  POSTGRES.acknowledgeAllInOne,
  V8_EDITS.at(-1)!,
);
for (const sql of [V8_CLAIM, V8_ACKNOWLEDGE]) {
  if (/keyed_lease|last_lease|done_at IS NULL/.test(sql)) {
    throw new Error("A version 9 edit is left in the version 8 statement");
  }
}

const GATE = POSTGRES.claimInOne.slice(
  POSTGRES.claimInOne.indexOf("\n  q AS MATERIALIZED"),
  POSTGRES.claimInOne.indexOf("\n  candidates AS MATERIALIZED"),
);
const NO_GATE = patched(
  POSTGRES.claimInOne,
  [GATE, ""],
  ["(SELECT allowed FROM g)", "$3::bigint"],
  ["(SELECT per_key FROM g)", "NULL::integer"],
  ["\n    UNION ALL SELECT 1 FROM g WHERE moved", ""],
  [
    POSTGRES.claimInOne.slice(
      POSTGRES.claimInOne.indexOf("\n  spent AS (UPDATE"),
      POSTGRES.claimInOne.indexOf("\n  claimed AS (UPDATE"),
    ),
    "",
  ],
);
const NO_WINDOW = patched(
  POSTGRES.claimInOne,
  [
    `SELECT c.*, row_number() OVER (
        PARTITION BY c.concurrency_key
        ORDER BY c.priority DESC, c.due_at, c.id) AS r`,
    "SELECT c.*",
  ],
  [" WHERE f.held IS NULL OR f.held + f.r <= (SELECT per_key FROM g)", ""],
);
const NO_TAIL = patched(POSTGRES.claimInOne, [
  `
  WHERE c.payload IS NULL OR c.payload::json IS NOT NULL
  ORDER BY c.k`,
  "",
]);

const VARIANTS: Record<string, Variant> = {
  "main": {},
  "main again": {},
  "bare claim": { claim: BARE_CLAIM },
  "claim less gate": { claim: NO_GATE },
  "claim less per-key window": { claim: NO_WINDOW },
  "claim less tail": { claim: NO_TAIL },
  "bare ack": { acknowledge: BARE_ACKNOWLEDGE },
  "fillfactor 70": {
    schema: {
      name: "bench_fillfactor",
      setup: "ALTER TABLE outbox_events SET (fillfactor = 70)",
    },
  },
  "v8": {
    claim: V8_CLAIM,
    acknowledge: V8_ACKNOWLEDGE,
    schema: { name: "bench_v8", setup: POSTGRES_AS_VERSION_8 },
  },
};

const rounds = Number(Deno.args[0] ?? 96);
const names = Deno.args[1]?.split(",") ?? Object.keys(VARIANTS);
const inflight = Number(Deno.args[2] ?? 0);
for (const name of names) {
  if (VARIANTS[name] === undefined) throw new Error(`No variant ${name}`);
}

const dialect = POSTGRES as unknown as Record<string, unknown>;
const own = {
  claimInOne: POSTGRES.claimInOne,
  acknowledgeAllInOne: POSTGRES.acknowledgeAllInOne,
  nowExhausted: POSTGRES.nowExhausted,
};
for (const [i, name] of names.entries()) {
  const variant = VARIANTS[name]!;
  if (variant.claim) dialect[`benchClaim${i}`] = variant.claim;
  if (variant.acknowledge) {
    dialect[`benchAcknowledge${i}`] = variant.acknowledge;
  }
}
const { connectPostgres, openPostgres } = await import(
  "../drivers/postgres.ts"
);
const { startPostgres } = await import("../scripts/postgres_server.ts");
const { outboxSide } = await import("./postgres_bench.ts");

const MAX = 256;
const server = await startPostgres();
try {
  await using monitor = await connectPostgres(server.url, { listen: false });
  const schemas = [
    ...new Set(names.map((n) => VARIANTS[n]!.schema?.name ?? "public")),
  ];
  const backends = new Map<
    string,
    {
      side: ReturnType<typeof outboxSide>;
      pid: number;
      outbox: Awaited<ReturnType<typeof openPostgres>>;
    }
  >();
  for (const schema of schemas) {
    const application = `bench_${schema}`;
    const outbox = await openPostgres(server.url, {
      listen: false,
      schema,
      applicationName: application,
    });
    const users = names.filter((n) =>
      (VARIANTS[n]!.schema?.name ?? "public") === schema
    );
    await monitor.run(`SET search_path = ${schema}`);
    for (const n of users) {
      const setup = VARIANTS[n]!.schema?.setup;
      if (setup) await monitor.exec(setup);
    }
    // The backlog every cycle of the schema's variants drains (and the
    // warm-up's), written in one statement rather than through the API.
    const events = (rounds + 8) * users.length * MAX + inflight;
    await monitor.run(
      `WITH k AS (INSERT INTO outbox_keys (identity, event_id, queue)
        SELECT gen_random_uuid(), nextval(pg_get_serial_sequence('outbox_events', 'id')), 'default'
        FROM generate_series(1, ${events})
        RETURNING identity, event_id)
      INSERT INTO outbox_events (id, queue, state, payload, due_at,
        max_attempts, created_at, updated_at, identity)
      SELECT event_id, 'default', 'pending', '{"i":' || event_id || '}', 0,
        10, 0, 0, identity
      FROM k ORDER BY event_id`,
    );
    const first = names.indexOf(users[0]!);
    dialect["claimInOne"] = VARIANTS[users[0]!]!.claim === undefined
      ? own.claimInOne
      : dialect[`benchClaim${first}`];
    dialect["acknowledgeAllInOne"] =
      VARIANTS[users[0]!]!.acknowledge === undefined
        ? own.acknowledgeAllInOne
        : dialect[`benchAcknowledge${first}`];
    for (let left = inflight; left > 0; left -= MAX) {
      await outbox.claim({ max: Math.min(MAX, left), leaseMs: 3_600_000 });
    }
    await monitor.run("VACUUM ANALYZE outbox_events");
    const side = outboxSide(outbox);
    await side.cycle(MAX);
    const [row] = await monitor.query(
      "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
      [application],
    );
    backends.set(schema, {
      side,
      pid: Number(row?.["pid"]),
      outbox,
    });
  }
  const use = (name: string, i: number) => {
    const variant = VARIANTS[name]!;
    dialect["claimInOne"] = variant.claim === undefined
      ? own.claimInOne
      : dialect[`benchClaim${i}`];
    dialect["acknowledgeAllInOne"] = variant.acknowledge === undefined
      ? own.acknowledgeAllInOne
      : dialect[`benchAcknowledge${i}`];
    return backends.get(variant.schema?.name ?? "public")!;
  };
  const cycle = async (name: string, i: number) => {
    const { side, pid } = use(name, i);
    const server = onCoreMs(pid);
    const client = process.cpuUsage();
    const started = performance.now();
    const events = await side.cycle(MAX);
    const wall = performance.now() - started;
    const { user, system } = process.cpuUsage(client);
    if (events !== MAX) throw new Error(`${name}: ${events} of ${MAX}`);
    return {
      wall,
      server: onCoreMs(pid) - server,
      client: (user + system) / 1e3,
    };
  };
  // Each variant's statements prepared and past their custom plans.
  for (const [i, name] of names.entries()) {
    for (let c = 0; c < 6; c++) await cycle(name, i);
  }
  const load = [Deno.loadavg()[0]!];
  const runs = await alternateRounds(
    names.length,
    rounds,
    (i) => cycle(names[i]!, i),
  );
  load.push(Deno.loadavg()[0]!);
  const lines = [
    `${rounds} cycles of claim({ max: ${MAX} }) + acknowledge per variant, alternated, ${inflight} leases in flight; load average ${
      load.map((l) => l.toFixed(1)).join(" to ")
    }`,
    "",
    `| variant | server CPU ms per cycle | to ${
      names[0]
    } (quartiles of per-cycle ratios) | wall ms | client CPU ms |`,
    "|---|---:|---:|---:|---:|",
  ];
  for (const [i, name] of names.entries()) {
    const run = runs[i]!;
    const [q1, q2, q3] = quartiles(
      run.server.map((s, c) => s / runs[0]!.server[c]!),
    );
    lines.push(
      `| ${name} | ${median(run.server).toFixed(2)} | ${q2!.toFixed(3)} (${
        q1!.toFixed(2)
      }–${q3!.toFixed(2)}) | ${median(run.wall).toFixed(2)} | ${
        median(run.client).toFixed(2)
      } |`,
    );
  }
  lines.push(
    "",
    "| schema | updates of outbox_events | HOT |",
    "|---|---:|---:|",
  );
  for (const schema of schemas) {
    const [row] = await monitor.query(
      `SELECT n_tup_upd AS updates, n_tup_hot_upd AS hot
      FROM pg_stat_user_tables
      WHERE schemaname = $1 AND relname = 'outbox_events'`,
      [schema],
    );
    lines.push(`| ${schema} | ${row?.["updates"]} | ${row?.["hot"]} |`);
  }
  // How the server planned each prepared claim and acknowledgement: a
  // custom plan is planned again at every call (PostgreSQL keeps one when
  // the generic plan's estimate is dearer).
  lines.push(
    "",
    "| schema | statement | generic plans | custom plans |",
    "|---|---|---:|---:|",
  );
  for (const [schema, { outbox }] of backends) {
    dialect["nowExhausted"] = schema === "bench_v8"
      ? V8_NOW_EXHAUSTED
      : own.nowExhausted;
    const plans = await outbox.transaction((tx) =>
      tx.query(
        `SELECT statement, generic_plans, custom_plans
        FROM pg_prepared_statements
        WHERE statement LIKE '%claimed AS (UPDATE%'
          OR statement LIKE '%acked AS (DELETE%'
        ORDER BY statement`,
      )
    );
    for (const row of plans) {
      const sql = String(row["statement"]);
      const kind = sql.includes("claimed AS (UPDATE") ? "claim" : "acknowledge";
      const name = names.find((_, i) =>
        sql === (kind === "claim"
          ? dialect[`benchClaim${i}`]
          : dialect[`benchAcknowledge${i}`])
      ) ?? "main";
      lines.push(
        `| ${schema} | ${kind} (${name}) | ${row["generic_plans"]} | ${
          row["custom_plans"]
        } |`,
      );
    }
  }
  console.log(lines.join("\n"));
  for (const backend of backends.values()) await backend.outbox.close();
} finally {
  await server.stop();
}
