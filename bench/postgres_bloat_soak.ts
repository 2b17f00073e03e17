/**
 * `deno task bench:bloat`: issue 39's bloat soak on PostgreSQL. Claims and
 * acknowledgements run for a while under autovacuum's default settings,
 * and every outbox table's size, live and dead tuples, HOT updates and
 * autovacuum runs are sampled; the verdict says whether the hot table
 * (`outbox_events`) stayed bounded.
 *
 * The work: one producer keeps a steady backlog of pending events
 * (`enqueueBatch` of up to 256, one event in four with a dedup key), and
 * `--workers` workers, each on its own connection, take turns of three
 * kinds: a batch `claim({ max })` then `acknowledge(leases)`; one `claim()`
 * then `acknowledge(lease)`, with a `renew` on every tenth lease and a
 * `release` (an error, retried at once) on every hundredth; and
 * `acknowledgeAndClaim(leases, { max })`. Nothing is purged, unless
 * `--purge-seconds` asks for retention (done events older than that,
 * purged that often). `--workers` (4), `--backlog` (5,000) and `--batch`
 * (64) size the work.
 *
 * Every `--interval-seconds` (and at the start and the end), for each table
 * of the outbox's schema whose name starts with `outbox_` (found by that
 * prefix, whatever the layout calls them): `pg_relation_size`,
 * `pg_total_relation_size`, `n_live_tup`, `n_dead_tup`, `n_tup_upd`,
 * `n_tup_hot_upd` and `autovacuum_count` from `pg_stat_user_tables`.
 *
 * The verdict ({@linkcode verdict}): the hot table is bounded when, over
 * the second half of the soak, its heap size, its total size (indexes and
 * TOAST included) and its dead tuples each stay within `--factor` (1.5) of
 * their largest value over the first half (dead tuples: or within
 * `--dead-floor`, 1,000, which autovacuum's own trigger of 50 + 20% of the
 * live rows leaves to gather on any table). `--table` judges another table
 * instead.
 *
 * The server: its own embedded PostgreSQL (`scripts/postgres_server.ts`,
 * whose only settings are the port, `max_connections`, `fsync` and
 * `synchronous_commit`: autovacuum's are the defaults, printed), or the one
 * `--url` names, in a new schema of its own (left there, its name printed).
 *
 * Prints the samples as a markdown table, a blank line, then one line of
 * JSON (the verdict and the samples); progress goes to stderr.
 *
 * ```sh
 * deno task bench:bloat                      # 10 minutes, a sample every 30 s
 * deno task bench:bloat --minutes 1 --interval-seconds 5
 * ```
 *
 * @module
 */
import { parseArgs } from "node:util";
import { connectPostgres, openPostgres } from "../drivers/postgres.ts";
import type { Lease, Outbox } from "../mod.ts";
import { startPostgres } from "../scripts/postgres_server.ts";

/** One table's figures at one moment of the soak. */
export interface Sample {
  /** Milliseconds since the soak started. */
  readonly atMs: number;
  readonly table: string;
  /** `pg_relation_size`: the heap's main fork, bytes. */
  readonly heapBytes: number;
  /** `pg_total_relation_size`: heap, indexes and TOAST, bytes. */
  readonly totalBytes: number;
  /** `n_live_tup`. */
  readonly live: number;
  /** `n_dead_tup`. */
  readonly dead: number;
  /** `n_tup_upd`, since the soak's schema was made. */
  readonly updates: number;
  /** `n_tup_hot_upd`: the updates that were HOT. */
  readonly hotUpdates: number;
  /** `autovacuum_count`. */
  readonly autovacuums: number;
}

/** How {@linkcode verdict} judges. */
export interface VerdictOptions {
  /** The hot table's name. @default {"outbox_events"} */
  readonly table?: string;
  /** The soak's length, milliseconds: samples after half of it are the second half. */
  readonly durationMs: number;
  /** How far past the first half's largest value the second half may go. @default {1.5} */
  readonly factor?: number;
  /** Dead tuples up to this many are bounded whatever the first half held. @default {1000} */
  readonly deadFloor?: number;
}

/** One measure's verdict: the first half's largest, the second half's, the bound. */
export interface Bound {
  readonly firstMax: number;
  readonly secondMax: number;
  readonly bound: number;
  readonly bounded: boolean;
}

/** What {@linkcode verdict} found. */
export interface Verdict {
  readonly table: string;
  readonly bounded: boolean;
  readonly heapBytes: Bound;
  readonly totalBytes: Bound;
  readonly dead: Bound;
  /**
   * Live tuples, reported, not judged: a table that keeps its finished
   * events grows by them however well vacuumed (its bound as the others').
   */
  readonly live: Bound;
  /** One line for people. */
  readonly text: string;
}

/**
 * Judges whether the hot table stayed bounded over a soak.
 *
 * @param samples Samples of every table; only `options.table`'s count.
 * @param options See {@linkcode VerdictOptions}.
 * @returns The verdict of each measure and of all three.
 * @throws {RangeError} When either half has no sample of the table.
 */
export function verdict(
  samples: readonly Sample[],
  options: VerdictOptions,
): Verdict {
  const table = options.table ?? "outbox_events";
  const factor = options.factor ?? 1.5;
  const deadFloor = options.deadFloor ?? 1_000;
  const mine = samples.filter((s) => s.table === table);
  const half = options.durationMs / 2;
  const first = mine.filter((s) => s.atMs <= half);
  const second = mine.filter((s) => s.atMs > half);
  if (first.length === 0 || second.length === 0) {
    throw new RangeError(
      `Cannot judge ${table} as each half of the soak needs a sample of it: ${first.length} in the first, ${second.length} in the second`,
    );
  }
  const bound = (of: (s: Sample) => number, floor = 0): Bound => {
    const firstMax = Math.max(...first.map(of));
    const secondMax = Math.max(...second.map(of));
    const limit = Math.max(firstMax * factor, floor);
    return { firstMax, secondMax, bound: limit, bounded: secondMax <= limit };
  };
  const heapBytes = bound((s) => s.heapBytes);
  const totalBytes = bound((s) => s.totalBytes);
  const dead = bound((s) => s.dead, deadFloor);
  const live = bound((s) => s.live);
  const bounded = heapBytes.bounded && totalBytes.bounded && dead.bounded;
  const part = (name: string, b: Bound, unit: (n: number) => string) =>
    `${name} ${unit(b.secondMax)} (bound ${unit(b.bound)}: ${
      b.bounded ? "within" : "past"
    })`;
  const text = `${table}: ${
    bounded ? "bounded" : "NOT bounded"
  } over the second half, at most ${factor}x the first half's largest: ${
    [
      part("heap", heapBytes, mebibytes),
      part("total", totalBytes, mebibytes),
      part("dead tuples", dead, (n) => String(Math.round(n))),
    ].join(", ")
  }; live tuples ${live.firstMax} in the first half, ${live.secondMax} in the second`;
  return { table, bounded, heapBytes, totalBytes, dead, live, text };
}

function mebibytes(bytes: number): string {
  return `${(bytes / 1_048_576).toFixed(2)} MiB`;
}

/** Samples every `outbox_` table of the connection's schema. */
async function sampleTables(
  db: Awaited<ReturnType<typeof connectPostgres>>,
  atMs: number,
): Promise<Sample[]> {
  const rows = await db.query(
    `SELECT s.relname AS table, pg_relation_size(s.relid) AS heap,
      pg_total_relation_size(s.relid) AS total, s.n_live_tup AS live,
      s.n_dead_tup AS dead, s.n_tup_upd AS updates,
      s.n_tup_hot_upd AS hot, s.autovacuum_count AS autovacuums
    FROM pg_stat_user_tables AS s
    WHERE s.schemaname = current_schema() AND starts_with(s.relname, 'outbox_')
    ORDER BY s.relname`,
  );
  return rows.map((row) => ({
    atMs,
    table: String(row["table"]),
    heapBytes: Number(row["heap"]),
    totalBytes: Number(row["total"]),
    live: Number(row["live"]),
    dead: Number(row["dead"]),
    updates: Number(row["updates"]),
    hotUpdates: Number(row["hot"]),
    autovacuums: Number(row["autovacuums"]),
  }));
}

/**
 * The samples as a markdown table, one row per table and moment.
 *
 * @param samples The samples.
 * @returns The table's lines.
 */
export function sampleTable(samples: readonly Sample[]): string {
  const header = [
    "t (s)",
    "table",
    "heap",
    "total",
    "live tuples",
    "dead tuples",
    "updates",
    "HOT",
    "autovacuums",
  ];
  const rows = samples.map((s) => [
    (s.atMs / 1000).toFixed(0),
    s.table,
    mebibytes(s.heapBytes),
    mebibytes(s.totalBytes),
    s.live.toLocaleString("en-US"),
    s.dead.toLocaleString("en-US"),
    s.updates.toLocaleString("en-US"),
    s.updates === 0 ? "–" : `${(100 * s.hotUpdates / s.updates).toFixed(1)}%`,
    String(s.autovacuums),
  ]);
  const widths = header.map((h, i) =>
    Math.max(h.length, ...rows.map((r) => r[i]!.length))
  );
  const right = (i: number) => i !== 1;
  const cells = (r: readonly string[]) =>
    `| ${
      r.map((c, i) => right(i) ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))
        .join(" | ")
    } |`;
  return [
    cells(header),
    `|${
      widths.map((w, i) =>
        right(i) ? `${"-".repeat(w + 1)}:` : "-".repeat(w + 2)
      )
        .join("|")
    }|`,
    ...rows.map(cells),
  ].join("\n");
}

/** The soak's parameters. */
export interface SoakOptions {
  readonly url: string;
  readonly schema: string;
  readonly durationMs: number;
  readonly intervalMs: number;
  readonly workers: number;
  /** Pending events the producer keeps. */
  readonly backlog: number;
  /** A batch claim's `max`. */
  readonly batch: number;
  /** Retention: done events older than this are purged this often; `null`, never. */
  readonly purgeMs: number | null;
}

/** What a soak did: its samples and how many events it acknowledged. */
export interface SoakResult {
  readonly samples: Sample[];
  readonly enqueued: number;
  readonly acknowledged: number;
}

const QUEUE = "soak";
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Runs the soak: a producer, the workers and the sampler, until
 * `durationMs` has passed.
 *
 * @param options See {@linkcode SoakOptions}.
 * @param progress Called with each moment's samples as they are taken.
 * @returns The samples and counts.
 */
export async function soak(
  options: SoakOptions,
  progress: (samples: readonly Sample[], acknowledged: number) => void =
    () => {},
): Promise<SoakResult> {
  const { url, schema, durationMs, intervalMs, batch, backlog } = options;
  const open = () => openPostgres(url, { schema, listen: false, queue: QUEUE });
  const outboxes: Outbox[] = [];
  for (let i = 0; i < options.workers + 1; i++) outboxes.push(await open());
  await using db = await connectPostgres(url, { schema, listen: false });
  const started = performance.now();
  const end = started + durationMs;
  const running = () => performance.now() < end;
  let enqueued = 0;
  let acknowledged = 0;
  const ack = (results: readonly boolean[]) => {
    for (const ok of results) if (ok) acknowledged++;
  };
  try {
    const producer = async (outbox: Outbox) => {
      while (running()) {
        const room = Math.min(256, backlog - (enqueued - acknowledged));
        if (room <= 0) {
          await sleep(10);
          continue;
        }
        const events = Array.from({ length: room }, (_, i) => {
          const n = enqueued + i;
          return n % 4 === 0
            ? { payload: { n }, dedupKey: `soak-${n}` }
            : { payload: { n } };
        });
        await outbox.enqueueBatch(events);
        enqueued += room;
      }
    };
    const worker = async (outbox: Outbox, kind: number) => {
      let held: Lease[] = [];
      let turn = 0;
      while (running()) {
        turn++;
        if (kind === 0) {
          const leases = await outbox.claim({ max: batch });
          if (leases.length === 0) await sleep(10);
          else ack(await outbox.acknowledge(leases));
        } else if (kind === 1) {
          const lease = await outbox.claim();
          if (lease === null) {
            await sleep(10);
          } else if (turn % 100 === 0) {
            await outbox.release(lease, { error: "soak: a failed attempt" });
          } else {
            if (turn % 10 === 0) await outbox.renew(lease, 30_000);
            ack([await outbox.acknowledge(lease)]);
          }
        } else {
          const next = await outbox.acknowledgeAndClaim(held, { max: batch });
          ack(next.acknowledged);
          held = next.leases;
          if (held.length === 0) await sleep(10);
        }
      }
      if (held.length > 0) ack(await outbox.acknowledge(held));
    };
    const purger = async (outbox: Outbox, purgeMs: number) => {
      while (running()) {
        await sleep(Math.min(purgeMs, Math.max(0, end - performance.now())));
        if (running()) {
          await outbox.purge({ olderThanMs: purgeMs, states: ["done"] });
        }
      }
    };
    const sampler = async () => {
      const samples: Sample[] = [];
      for (let next = 0;; next += intervalMs) {
        await sleep(Math.max(0, started + next - performance.now()));
        const taken = await sampleTables(db, Math.min(next, durationMs));
        samples.push(...taken);
        progress(taken, acknowledged);
        if (next >= durationMs) return samples;
      }
    };
    const [samples] = await Promise.all([
      sampler(),
      producer(outboxes[0]!),
      ...outboxes.slice(1).map((outbox, i) => worker(outbox, i % 3)),
      ...(options.purgeMs === null
        ? []
        : [purger(outboxes[0]!, options.purgeMs)]),
    ]);
    return { samples, enqueued, acknowledged };
  } finally {
    await Promise.all(outboxes.map((outbox) => outbox.close()));
  }
}

/** Autovacuum's settings on the server, to print beside the figures. */
async function autovacuumSettings(url: string): Promise<string> {
  await using db = await connectPostgres(url, { listen: false });
  const rows = await db.query(
    `SELECT name, setting, source FROM pg_settings
    WHERE name LIKE 'autovacuum%' ORDER BY name`,
  );
  return rows.map((row) =>
    `${row["name"]}=${row["setting"]}${
      row["source"] === "default" ? "" : ` (${row["source"]})`
    }`
  ).join(", ");
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      minutes: { type: "string", default: "10" },
      "interval-seconds": { type: "string", default: "30" },
      workers: { type: "string", default: "4" },
      backlog: { type: "string", default: "5000" },
      batch: { type: "string", default: "64" },
      "purge-seconds": { type: "string" },
      factor: { type: "string", default: "1.5" },
      "dead-floor": { type: "string", default: "1000" },
      table: { type: "string", default: "outbox_events" },
      url: { type: "string" },
    },
  });
  const positive = (name: string, text: string | undefined) => {
    const value = Number(text);
    if (!(value > 0) || !Number.isFinite(value)) {
      throw new RangeError(
        `Cannot soak as '--${name}' must be a positive number: current value is ${text}`,
      );
    }
    return value;
  };
  const durationMs = Math.round(positive("minutes", values.minutes) * 60_000);
  const intervalMs = Math.round(
    positive("interval-seconds", values["interval-seconds"]) * 1000,
  );
  const workers = Math.round(positive("workers", values.workers));
  const backlog = Math.round(positive("backlog", values.backlog));
  const batch = Math.round(positive("batch", values.batch));
  const purgeMs = values["purge-seconds"] === undefined
    ? null
    : Math.round(positive("purge-seconds", values["purge-seconds"]) * 1000);
  const factor = positive("factor", values.factor);
  const deadFloor = Number(values["dead-floor"]);
  const server = values.url === undefined ? await startPostgres() : undefined;
  const url = values.url ?? server!.url;
  const schema = `outbox_soak_${Date.now().toString(36)}`;
  try {
    const settings = await autovacuumSettings(url);
    console.error(
      `soak: ${
        durationMs / 60_000
      } min, ${workers} workers, backlog ${backlog}, batch ${batch}, ${
        purgeMs === null ? "no purge" : `purge done older than ${purgeMs} ms`
      }, schema ${schema}; ${settings}`,
    );
    const result = await soak(
      { url, schema, durationMs, intervalMs, workers, backlog, batch, purgeMs },
      (taken, acknowledged) => {
        const hot = taken.find((s) => s.table === values.table);
        console.error(
          `soak: ${
            ((hot?.atMs ?? 0) / 1000).toFixed(0)
          } s, ${acknowledged} acknowledged, ${values.table} ${
            mebibytes(hot?.totalBytes ?? 0)
          }, ${hot?.dead ?? 0} dead tuples`,
        );
      },
    );
    const judged = verdict(result.samples, {
      table: values.table,
      durationMs,
      factor,
      deadFloor,
    });
    console.log(sampleTable(result.samples));
    console.log(`\n${judged.text}`);
    console.log(
      `${result.acknowledged} events acknowledged (${
        Math.round(result.acknowledged / (durationMs / 1000))
      }/s), ${result.enqueued} enqueued; ${settings}`,
    );
    console.log(
      `\n${
        JSON.stringify({
          durationMs,
          workers,
          backlog,
          batch,
          purgeMs,
          enqueued: result.enqueued,
          acknowledged: result.acknowledged,
          verdict: judged,
          samples: result.samples,
        })
      }`,
    );
  } finally {
    await server?.stop();
  }
}
