/**
 * Deno KV rows of `deno task bench`: this outbox on the WASM file driver
 * (`synchronous=full`) next to Deno KV's queue on a file (`Deno.openKv(path)`:
 * SQLite in WAL mode with an fsync per commit, so both are durable when a
 * call resolves). Each row runs in its own process, the only one started
 * with `--unstable-kv`, and its blocks alternate which side goes first.
 *
 * The outbox runs in the driver's default for a new file, the rollback
 * journal in truncate mode (four fdatasyncs per commit), and batch enqueue
 * runs in WAL mode too: one fdatasync per commit, as Deno KV does.
 *
 * Runs on its own too: `deno run -A bench/deno_kv_bench.ts [--smoke]`.
 *
 * @module
 */
import { join } from "node:path";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { alternate, type Alternated, type Side } from "./blocks.ts";
import { runJsonProcess } from "./process.ts";
import { type BenchRow, judge, markdown } from "./table.ts";

/** Deno KV's limit on mutations (enqueues included) in one atomic operation. */
const KV_MAX_MUTATIONS = 1_000;

/** What one process measures; `units` is per block. */
export type KvScenario =
  & {
    /** The outbox's database file. */
    readonly path: string;
    /** Deno KV's database file. */
    readonly kvPath: string;
    /** The outbox's journal mode. */
    readonly journalMode: "truncate" | "wal";
    readonly warmup: number;
    readonly blocks: number;
  }
  & (
    | {
      /**
       * `callers` concurrent callers of `outbox.enqueue`, `units` calls each,
       * against as many concurrent callers of `kv.enqueue`.
       */
      readonly work: "concurrentEnqueue";
      readonly callers: number;
      readonly units: number;
    }
    | {
      /**
       * `units` calls of `max` events each, against `units` atomic
       * operations of `max` enqueues.
       */
      readonly work: "batchEnqueue";
      readonly max: number;
      readonly units: number;
    }
  );

/** Enqueues `payloads` on Deno KV in as few atomic operations as it allows. */
async function kvEnqueueMany(
  kv: Deno.Kv,
  payloads: readonly unknown[],
): Promise<void> {
  for (let from = 0; from < payloads.length; from += KV_MAX_MUTATIONS) {
    const operation = kv.atomic();
    for (const payload of payloads.slice(from, from + KV_MAX_MUTATIONS)) {
      operation.enqueue(payload);
    }
    const result = await operation.commit();
    if (!result.ok) throw new Error("Deno KV refused an enqueue");
  }
}

const range = (count: number, block: number) =>
  Array.from({ length: count }, (_, n) => ({ block, n }));

function outboxSide(outbox: Outbox, scenario: KvScenario): Side {
  let block = 0;
  switch (scenario.work) {
    case "concurrentEnqueue": {
      const { callers, units } = scenario;
      return {
        async block() {
          block++;
          await Promise.all(
            Array.from({ length: callers }, async (_, caller) => {
              for (let n = 0; n < units; n++) {
                await outbox.enqueue({ block, caller, n });
              }
            }),
          );
          return callers * units;
        },
      };
    }
    case "batchEnqueue": {
      const { max, units } = scenario;
      return {
        async block() {
          block++;
          for (let u = 0; u < units; u++) {
            await outbox.enqueueBatch(
              range(max, block).map((payload) => ({ payload })),
            );
          }
          return max * units;
        },
      };
    }
  }
}

function kvSide(kvPath: string, scenario: KvScenario): Side & Disposable {
  let kv: Deno.Kv | undefined;
  let block = 0;
  const open = async () => kv ??= await Deno.openKv(kvPath);
  const close = () => {
    kv?.close();
    kv = undefined;
  };
  const side = (s: Side): Side & Disposable => ({
    ...s,
    [Symbol.dispose]: close,
  });
  switch (scenario.work) {
    case "concurrentEnqueue": {
      // As many concurrent callers as the outbox gets: Deno KV commits each
      // enqueue on its own thread, so calls overlap there too.
      const { callers, units } = scenario;
      return side({
        async block() {
          const db = await open();
          block++;
          await Promise.all(
            Array.from({ length: callers }, async (_, caller) => {
              for (let n = 0; n < units; n++) {
                await db.enqueue({ block, caller, n });
              }
            }),
          );
          return callers * units;
        },
      });
    }
    case "batchEnqueue": {
      const { max, units } = scenario;
      return side({
        async block() {
          const db = await open();
          block++;
          for (let u = 0; u < units; u++) {
            await kvEnqueueMany(db, range(max, block));
          }
          return max * units;
        },
      });
    }
  }
}

/**
 * Runs one scenario in this process.
 *
 * @param scenario What to measure.
 * @returns Both rates, their ratio and how the outbox side worked.
 */
export async function runKvScenario(
  scenario: KvScenario,
): Promise<Alternated> {
  await using outbox = await Outbox.open(
    await openSqliteWasm(scenario.path, {
      journalMode: scenario.journalMode,
      synchronous: "full",
    }),
    { leaseMs: 3_600_000, busyTimeoutMs: 60_000 },
  );
  using kv = kvSide(scenario.kvPath, scenario);
  return await alternate(
    outboxSide(outbox, scenario),
    kv,
    scenario.warmup,
    scenario.blocks,
  );
}

/** Sizes of one run, per row. */
interface Sizes {
  readonly concurrentEnqueue: {
    callers: number;
    units: number;
    warmup: number;
    blocks: number;
  };
  readonly batchEnqueue: {
    max: number;
    units: number;
    warmup: number;
    blocks: number;
  };
}

const FULL: Sizes = {
  concurrentEnqueue: { callers: 64, units: 4, warmup: 1, blocks: 10 },
  // Warmup of 40 batches: V8 optimizes SQLite's WASM only after a while.
  // Blocks of 8 batches (about 50 ms): at 4, one slow fsync swung a
  // block's ratio by a tenth.
  batchEnqueue: { max: 256, units: 8, warmup: 5, blocks: 8 },
};

const SMOKE: Sizes = {
  concurrentEnqueue: { callers: 4, units: 2, warmup: 1, blocks: 2 },
  batchEnqueue: { max: 8, units: 1, warmup: 1, blocks: 2 },
};

const SCRIPT = new URL(import.meta.url).pathname;
const ANCHOR = "Deno KV file (WAL, fsync per commit)";

/**
 * Measures the three Deno KV rows, each in its own process.
 *
 * @param smoke Toy sizes, to keep the script working.
 * @param dir A directory for the database files.
 * @returns The rows.
 */
export async function denoKvRows(
  smoke: boolean,
  dir: string,
): Promise<BenchRow[]> {
  const sizes = smoke ? SMOKE : FULL;
  const run = (scenario: KvScenario) =>
    runJsonProcess<Alternated>(SCRIPT, scenario, ["--unstable-kv"]);
  const files = (name: string, journalMode: KvScenario["journalMode"]) => ({
    path: join(dir, `${name}-outbox.db`),
    kvPath: join(dir, `${name}-kv.db`),
    journalMode,
  });
  const row = (
    name: string,
    anchor: string,
    goal: number | undefined,
    m: Alternated,
  ): BenchRow => ({
    name,
    value: m.value,
    unit: "events/s",
    anchor,
    anchorValue: m.anchorValue,
    ratio: m.ratio,
    ...judge(
      goal === undefined ? undefined : { atLeast: goal },
      m.ratio,
      m.value,
    ),
  });

  const { callers } = sizes.concurrentEnqueue;
  const enqueue = await run({
    work: "concurrentEnqueue",
    ...files("enqueue", "truncate"),
    ...sizes.concurrentEnqueue,
  });
  const { max } = sizes.batchEnqueue;
  const batch = await run({
    work: "batchEnqueue",
    ...files("batch", "truncate"),
    ...sizes.batchEnqueue,
  });
  const walBatch = await run({
    work: "batchEnqueue",
    ...files("batch-wal", "wal"),
    ...sizes.batchEnqueue,
  });
  return [
    row(
      `concurrent enqueue events/s, ${callers} callers of enqueue(), WASM file (truncate, full)`,
      `${ANCHOR}, ${callers} callers of kv.enqueue()`,
      1.5,
      enqueue,
    ),
    // Like for like with Deno KV's WAL: this row holds the goal.
    row(
      `batch enqueue events/s, ${max} per call (enqueueBatch), WASM file (wal, full)`,
      `${ANCHOR}, atomic() of ${max} enqueues (at most ${KV_MAX_MUTATIONS} per atomic)`,
      0.5,
      walBatch,
    ),
    row(
      `batch enqueue events/s, ${max} per call (enqueueBatch), WASM file (truncate, full)`,
      `${ANCHOR}, atomic() of ${max} enqueues (at most ${KV_MAX_MUTATIONS} per atomic)`,
      undefined,
      batch,
    ),
  ];
}

if (import.meta.main) {
  const [arg] = Deno.args;
  if (arg !== undefined && arg.startsWith("{")) {
    console.log(JSON.stringify(await runKvScenario(JSON.parse(arg))));
  } else {
    const dir = await Deno.makeTempDir({ prefix: "outbox_kv_bench_" });
    try {
      const rows = await denoKvRows(arg === "--smoke", dir);
      console.log(markdown(rows));
      console.log();
      console.log(JSON.stringify({ smoke: arg === "--smoke", rows }));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
}
