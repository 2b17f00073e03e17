/**
 * `deno task bench`: measures the outbox on each driver and prints one
 * markdown table, then the same rows as one line of JSON. Every row is
 * measured in this run next to its anchor, and each scenario runs in its own
 * process (`bench/scenario.ts`). `--smoke` runs every scenario at toy sizes,
 * to keep the script working without spending minutes. `--only <regexp>`
 * runs just the WASM-against-anchor pair rows (the durable, in-memory,
 * batch and WAL rows) whose name the regexp matches, e.g. `--only
 * 'batch.*WASM file$'` for the batch claim+ack row in truncate mode.
 *
 * @module
 */
import { join } from "node:path";
import type {
  ClaimCostTable,
  Scenario,
  ScenarioResult,
  Target,
} from "./scenario.ts";
import { browserRows } from "./browser_bench.ts";
import { denoKvRows } from "./deno_kv_bench.ts";
import { loopRows } from "./loop_bench.ts";
import { postgresRows } from "./postgres_bench.ts";
import { type BenchRow, judge, markdown, median } from "./table.ts";
import { runJsonProcess } from "./process.ts";

const SCENARIO = new URL("./scenario.ts", import.meta.url).pathname;

/**
 * Runs one scenario in a fresh Deno process (`bench/scenario.ts`).
 *
 * @param scenario What to measure.
 * @returns What the process measured.
 * @throws {Error} When the process fails.
 */
export function runScenarioProcess(
  scenario: Scenario,
): Promise<ScenarioResult> {
  return runJsonProcess(SCENARIO, scenario);
}

async function runAll(
  scenarios: readonly Scenario[],
): Promise<ScenarioResult[]> {
  return await Promise.all(scenarios.map(runScenarioProcess));
}

function rate(result: ScenarioResult, i = 0): number {
  const m = result.measurements[i]!;
  return m.operations / (m.elapsedMs / 1000);
}

function progress(message: string): void {
  console.error(`bench: ${message}`);
}

/**
 * Runs a `pair` scenario and makes its row: the first target's rate against
 * the second's, the ratio the median of the blocks' ratios.
 *
 * @param step What the progress line says is running.
 * @param scenario The scenario, less its kind.
 * @param row The row's name, unit and anchor; `goal`, the least ratio
 * (none: a report row), and `minValue`, the least rate as well.
 * @returns The row.
 */
async function pairRow(
  step: string,
  scenario: Omit<Extract<Scenario, { kind: "pair" }>, "kind">,
  row: {
    name: string;
    unit: string;
    anchor: string;
    goal?: number;
    minValue?: number;
  },
): Promise<BenchRow> {
  progress(step);
  const result = await runScenarioProcess({ kind: "pair", ...scenario });
  const { name, unit, anchor, goal, minValue } = row;
  const value = rate(result, 0);
  const ratio = result.medianRatio!;
  return {
    name,
    value,
    unit,
    anchor,
    anchorValue: rate(result, 1),
    ratio,
    ...judge(
      goal === undefined
        ? undefined
        : { atLeast: goal, ...(minValue === undefined ? {} : { minValue }) },
      ratio,
      value,
    ),
  };
}

/** Sizes of one run. */
export interface Sizes {
  durable: { warmup: number; blocks: number; units: number };
  cold: { warmup: number; blocks: number; units: number };
  memory: { warmup: number; blocks: number; units: number };
  batch: { max: number; warmup: number; blocks: number; units: number };
  claimCost: {
    small: number;
    medium: number;
    large: number;
    blocks: number;
    claims: number;
  };
  contend: {
    processes: number;
    /** Phases of all processes, each between two of one process. */
    pairs: number;
    phaseMs: number;
    /** How long every process runs cycles before the first phase. */
    warmupMs: number;
    /** At most this many cycles per process before the first phase. */
    warmupCycles: number;
    /**
     * Events seeded: enough for every warm-up and, at any rate a durable
     * file reaches, for the phases (no process may find the queue empty).
     */
    pending: number;
  };
}

export const FULL: Sizes = {
  // Short blocks: the disk's fsync latency drifts within seconds, and the
  // shorter each block, the closer in time the two drivers' blocks run.
  // 600 cycles of warm-up: V8 runs SQLite's WASM in its baseline tier
  // first and tiers functions up as they run; the journal's code, run once
  // a commit, took about 1,000 commits (500 cycles) to get there, and a
  // warm-up of 20 timed the WASM driver half in the baseline tier (0.89 to
  // 0.93 of node:sqlite, against 0.98 to 1.11 after 600; native code needs
  // none).
  durable: { warmup: 600, blocks: 40, units: 10 },
  cold: { warmup: 0, blocks: 4, units: 5 },
  memory: { warmup: 500, blocks: 10, units: 500 },
  // 80 batches of warm-up, for the same reason: after 20 the ratio ranged
  // from 0.81 to 0.91 over four runs, after 80 from 0.88 to 0.89. 12
  // blocks: the median of 6 ratios swung from 0.80 to 0.90 between runs of
  // the same code.
  batch: { max: 256, warmup: 80, blocks: 12, units: 4 },
  claimCost: {
    small: 1_000,
    medium: 100_000,
    large: 1_000_000,
    blocks: 10,
    claims: 50,
  },
  contend: {
    processes: 4,
    pairs: 10,
    phaseMs: 400,
    warmupMs: 3_000,
    warmupCycles: 600,
    // 8.4 s of phases after 2,400 warm-up cycles: 11,000 cycles/s at most.
    pending: 100_000,
  },
};

const SMOKE: Sizes = {
  durable: { warmup: 1, blocks: 2, units: 2 },
  cold: { warmup: 0, blocks: 2, units: 1 },
  memory: { warmup: 1, blocks: 2, units: 5 },
  batch: { max: 8, warmup: 1, blocks: 2, units: 1 },
  claimCost: { small: 10, medium: 20, large: 40, blocks: 2, claims: 3 },
  contend: {
    processes: 4,
    pairs: 1,
    phaseMs: 200,
    warmupMs: 300,
    warmupCycles: 10,
    // 0.6 s of phases after 40 warm-up cycles: 8,000 cycles/s at most.
    pending: 5_000,
  },
};

/**
 * Runs every benchmark.
 *
 * @param sizes How much work each scenario does.
 * @param dir A directory for the database files.
 * @returns The rows of the table.
 */
async function bench(
  sizes: Sizes,
  dir: string,
  only?: RegExp,
): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  // With --only, the pair rows whose name it matches, and nothing else.
  const pair = async (...args: Parameters<typeof pairRow>) => {
    if (only === undefined || only.test(args[2].name)) {
      rows.push(await pairRow(...args));
    }
  };
  const file = (name: string, driver: Target["driver"]): Target => ({
    driver,
    path: join(dir, `${name}-${driver}.db`),
    journalMode: "truncate",
    synchronous: "full",
  });
  const wal = (name: string, driver: Target["driver"]): Target => ({
    ...file(name, driver),
    journalMode: "wal",
  });

  await pair(
    "durable claim+acknowledge cycles, WASM file vs node:sqlite file",
    {
      targets: [file("durable", "wasm"), file("durable", "node")],
      ...sizes.durable,
    },
    {
      name: "durable claim+ack cycles/s, WASM file (truncate, full)",
      unit: "cycles/s",
      anchor: "node:sqlite file (truncate, full)",
      goal: 0.9,
    },
  );

  // The first 20 cycles after opening, timed in 4 blocks of 5 with no
  // warm-up: what a process that has just opened the file (an edge
  // function, a CLI) pays while V8 still runs much of SQLite's WASM in its
  // baseline tier. (The fill's INSERT and the other target's cycles in the
  // same process have warmed some of it.)
  await pair(
    "the same, the first 20 cycles after opening",
    {
      targets: [file("cold", "wasm"), file("cold", "node")],
      ...sizes.cold,
    },
    {
      name:
        "durable claim+ack cycles/s, WASM file (truncate, full), the first 20 cycles after opening",
      unit: "cycles/s",
      anchor: "node:sqlite file (truncate, full)",
    },
  );

  await pair(
    "the same with the WASM file at the build's own page size",
    {
      targets: [
        { ...file("paged", "wasm"), pageSize: 8192 },
        file("paged", "node"),
      ],
      ...sizes.durable,
    },
    {
      name:
        "durable claim+ack cycles/s, WASM file with page_size 8192 (the build's default; the driver makes new files 4096, as native)",
      unit: "cycles/s",
      anchor: "node:sqlite file (truncate, full)",
    },
  );

  const memory = (driver: Target["driver"]): Target => ({
    driver,
    path: ":memory:",
    journalMode: "truncate",
    synchronous: "full",
  });
  await pair(
    "in-memory claim+acknowledge cycles, WASM vs node:sqlite",
    { targets: [memory("wasm"), memory("node")], ...sizes.memory },
    {
      name: "in-memory claim+ack cycles/s, WASM",
      unit: "cycles/s",
      anchor: "node:sqlite in memory",
      goal: 0.5,
    },
  );

  await pair(
    `batches of claim({ max: ${sizes.batch.max} }) + acknowledge`,
    {
      targets: [file("batch", "wasm"), file("batch", "node")],
      ...sizes.batch,
    },
    {
      name:
        `durable batch claim({ max: ${sizes.batch.max} }) + ack events/s, WASM file`,
      unit: "events/s",
      anchor: "node:sqlite file (truncate, full)",
      goal: 0.85,
    },
  );

  // WAL: one fsync per commit where the rollback journal makes four.
  await pair(
    "durable claim+acknowledge cycles in WAL mode",
    {
      targets: [wal("durable-wal", "wasm"), wal("durable-wal", "node")],
      ...sizes.durable,
    },
    {
      name: "durable claim+ack cycles/s, WASM file (wal, full)",
      unit: "cycles/s",
      anchor: "node:sqlite file (wal, full)",
    },
  );
  await pair(
    `batches of ${sizes.batch.max} in WAL mode`,
    {
      targets: [wal("batch-wal", "wasm"), wal("batch-wal", "node")],
      ...sizes.batch,
    },
    {
      name:
        `durable batch claim({ max: ${sizes.batch.max} }) + ack events/s, WASM file (wal, full)`,
      unit: "events/s",
      anchor: "node:sqlite file (wal, full)",
      goal: 0.85,
      minValue: 50_000,
    },
  );

  await pair(
    `acknowledgeAndClaim(previous, { max: ${sizes.batch.max} }) vs claim + acknowledge`,
    {
      targets: [wal("folded", "wasm"), wal("unfolded", "wasm")],
      fold: [true, false],
      ...sizes.batch,
    },
    {
      name:
        `durable batch acknowledgeAndClaim({ max: ${sizes.batch.max} }) events/s, WASM file (wal, full)`,
      unit: "events/s",
      anchor: "claim + acknowledge of the same batches, same process",
    },
  );

  if (only !== undefined) return rows;
  const { small, medium, large, blocks, claims } = sizes.claimCost;
  // synchronous=off so the fsync per commit does not hide what the query
  // itself costs as the table grows.
  const table = (name: string, pending: number, done = 0): ClaimCostTable => ({
    target: { ...file(name, "wasm"), synchronous: "off" },
    pending,
    done,
  });
  const costs: [string, ClaimCostTable][] = [
    [`${small} pending`, table("cost-small", small)],
    [`${medium} pending`, table("cost-medium", medium)],
    [`${large} pending`, table("cost-large", large)],
    [
      `${small} pending behind ${large} done`,
      table("cost-behind", small, large),
    ],
  ];
  // One process alternating between the tables: separate processes ran
  // minutes apart, and a drift in the machine's speed between them had
  // read as a cost of the table's size (1.36x in one run of 2026-12-01).
  progress("claim cost, four tables in one process");
  const cost = await runScenarioProcess({
    kind: "claimCost",
    tables: costs.map(([, t]) => t),
    blocks,
    claims,
  });
  const microseconds = (i: number) => cost.measurements[i]!.medianMs * 1000;
  for (const [i, [label]] of costs.entries()) {
    if (i === 0) continue;
    const ratio = cost.medianRatios![i]!;
    rows.push({
      name: `median claim time, ${label}, WASM file (synchronous off)`,
      value: microseconds(i),
      unit: "µs",
      anchor: `${small} pending`,
      anchorValue: microseconds(0),
      ratio,
      ...judge({ atMost: 1.3 }, ratio, microseconds(i)),
    });
  }
  // Peak memory is a process's own: one process per size.
  const peakRss = async (pending: number) => {
    progress(`peak memory, ${pending} pending`);
    const result = await runScenarioProcess({
      kind: "claimCost",
      tables: [table(`rss-${pending}`, pending)],
      blocks: 1,
      claims,
    });
    return result.peakRssBytes / 2 ** 20;
  };
  const rssSmall = await peakRss(small);
  const rssLarge = await peakRss(large);

  rows.push(await contentionRow(sizes.contend, file("contend", "wasm")));

  rows.push({
    name: `peak RSS of the ${large} pending run`,
    value: rssLarge,
    unit: "MiB",
    anchor: `${small} pending run`,
    anchorValue: rssSmall,
    ratio: rssLarge / rssSmall,
    goal: "report",
    met: null,
  });
  return rows;
}

/**
 * The contention row: `processes` processes sharing one WASM file against
 * one alone (see bench/README.md).
 *
 * @param sizes How long and how often to measure.
 * @param target The file, seeded here.
 * @returns The row.
 */
export async function contentionRow(
  sizes: Sizes["contend"],
  target: Target,
): Promise<BenchRow> {
  const { processes, pairs, phaseMs, warmupMs, warmupCycles, pending } = sizes;
  await runScenarioProcess({ kind: "seed", target, pending });
  progress(`1 process vs ${processes} contending on one WASM file`);
  // One set of warm processes; phases of one process and of all of them
  // alternate every `phaseMs` (solo, all, solo, ..., solo), so the disk's
  // drifting fsync latency falls on both alike, and each phase of all is
  // compared with the mean of the solo phases either side of it. Every
  // process signals once its database is open and runs cycles until `go`,
  // written `warmupMs` after the last one is ready: starting four Deno
  // processes on two busy cores takes seconds, so a start time fixed in
  // advance could pass before some had begun.
  let results: ScenarioResult[];
  const barrier = await Deno.makeTempDir({ prefix: "contend-" });
  try {
    const running = runAll(
      Array.from({ length: processes }, (_, worker) =>
        ({
          kind: "contend",
          target,
          worker,
          barrier,
          warmupCycles,
          phaseMs,
          phases: 2 * pairs + 1,
        }) as const),
    );
    while ([...Deno.readDirSync(barrier)].length < processes) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await new Promise((resolve) => setTimeout(resolve, warmupMs));
    // Renamed into place, so no process reads it half written.
    await Deno.writeTextFile(join(barrier, "go."), String(Date.now() + 200));
    await Deno.rename(join(barrier, "go."), join(barrier, "go"));
    results = await running;
  } finally {
    await Deno.remove(barrier, { recursive: true });
  }
  const perPhase = Array.from(
    { length: 2 * pairs + 1 },
    (_, phase) =>
      results.reduce(
        (sum, result) => sum + result.measurements[phase]!.operations,
        0,
      ) / (phaseMs / 1000),
  );
  const solo = perPhase.filter((_, phase) => phase % 2 === 0);
  const all = perPhase.filter((_, phase) => phase % 2 === 1);
  const one = solo.reduce((sum, value) => sum + value, 0) / solo.length;
  const many = all.reduce((sum, value) => sum + value, 0) / all.length;
  const ratio = median(
    all.map((value, pair) => value / ((solo[pair]! + solo[pair + 1]!) / 2)),
  );
  return {
    name:
      `${processes} processes contending, total claim+ack cycles/s, WASM file`,
    value: many,
    unit: "cycles/s",
    anchor: "1 process",
    anchorValue: one,
    ratio,
    ...judge({ atLeast: 0.7 }, ratio, many),
  };
}

if (import.meta.main) {
  const smoke = Deno.args.includes("--smoke");
  const at = Deno.args.indexOf("--only");
  const only = at === -1 ? undefined : new RegExp(Deno.args[at + 1] ?? "");
  const dir = await Deno.makeTempDir({ prefix: "outbox_bench_" });
  try {
    const rows = await bench(smoke ? SMOKE : FULL, dir, only);
    if (only === undefined) {
      progress("concurrent and batch enqueue vs Deno KV");
      rows.push(...await denoKvRows(smoke, dir));
      progress(
        "processEvents vs Deno KV, graphile-worker and pg-boss; single enqueues; wake latency",
      );
      rows.push(...await loopRows(smoke, dir));
      progress(
        "PostgreSQL claim+acknowledge, enqueue and WAL per event, vs graphile-worker and pg-boss",
      );
      rows.push(...await postgresRows(smoke));
    }
    // The browser rows need Chromium; the smoke run leaves them to
    // tests/browser_bench_test.ts.
    if (!smoke && only === undefined) {
      progress("claim+acknowledge in headless Chromium (opfs-sahpool)");
      rows.push(...await browserRows());
    }
    console.log(markdown(rows));
    console.log();
    console.log(JSON.stringify({
      deno: Deno.version.deno,
      smoke,
      cores: navigator.hardwareConcurrency,
      rows,
    }));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
