/**
 * Processing-loop rows of `deno task bench`: what users run, with the
 * library's defaults, against what they would pick instead, in the same
 * process and the same run.
 *
 * - `processEvents` at concurrency 1, 4 and 16, with a handler that does
 *   nothing and one that awaits a 1 ms timer (about 2 ms on Deno, whose
 *   timers fire on the next millisecond tick or later), draining the events
 *   queued before each block: on the WASM file (its default, WAL for a new
 *   file since issue 36, and WAL set explicitly), on `node:sqlite` (its
 *   default, WAL) against Deno KV's `listenQueue` (WAL, fsync per commit)
 *   with the same handler, gated to `concurrency` at once (the goal's
 *   anchor) and as Deno KV runs it, up to 100 at once (reported); with the
 *   1 ms handler, the handler alone as well, `concurrency` loops awaiting it
 *   with no queue (reported: the most a loop could run, as Deno's timers
 *   fire); and at concurrency 1 and 4 on both defaults, with a handler
 *   awaiting 1 ms on another thread, as I/O completes (the goal rows of
 *   the 1 ms handler there: the timer's rows are reported); on
 *   PostgreSQL against graphile-worker's `run()` and pg-boss's
 *   `fetch` + `complete` (as many loops as the concurrency) on the same
 *   server, each with its defaults.
 * - Single enqueues, one per transaction, against `kv.enqueue`.
 * - The idle-wake latency: from an enqueue's commit to its handler's start,
 *   p50 and p99, from the same process and from another one.
 *
 * Every scenario runs in its own process. Runs on its own too:
 * `deno run -A bench/loop_bench.ts [--smoke] [--only <regexp>]`, where
 * `--only` runs just the scenarios whose label (as printed in progress,
 * e.g. `processEvents, node:sqlite file (defaults: wal, full), io, c=1`)
 * matches.
 *
 * Deno KV's `listenQueue` has no concurrency option: Deno's
 * `ext/kv/01_db.ts` starts each message's handler without awaiting the
 * last, and denokv's SQLite backend (`sqlite/backend.rs`,
 * `DISPATCH_CONCURRENCY_LIMIT = 100`) dequeues while fewer than 100 are
 * running. So its rate with a 1 ms handler is that of up to 100 handlers at
 * once, whatever the loop's concurrency. The like-for-like anchor of a loop
 * row at concurrency N gates Deno KV's handler to N at once (a semaphore in
 * the handler: messages past N wait, dequeued, for a turn).
 *
 * @module
 */
import { join } from "node:path";
import { Logger, makeWorkerUtils, run } from "npm:graphile-worker@0.18.0";
import { type Outbox, processEvents } from "../mod.ts";
import { Outbox as OutboxClass } from "../lease.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openPostgres } from "../drivers/postgres.ts";
import { startPostgres } from "../scripts/postgres_server.ts";
import { platformFor } from "../deno/platform.ts";
import {
  alternate,
  alternateAll,
  type Alternated,
  type AlternatedAll,
  type Side,
} from "./blocks.ts";
import { startBoss } from "./pg_boss.ts";
import { runJsonProcess } from "./process.ts";
import { type BenchRow, type Goal, judge, markdown, median } from "./table.ts";

/** The SQLite stores, each as the library opens it by default, or in WAL. */
export type Store = "wasm" | "wasm-wal" | "node";
/**
 * The handler: does nothing, awaits a 1 ms timer, or awaits 1 ms on another
 * thread (`thread`: `usleep(1000)` through a nonblocking FFI call, which
 * completes as I/O does, waking the event loop when it ends rather than at
 * the timers' next millisecond).
 */
export type Work = "noop" | "io" | "thread";

const STORES: Record<Store, string> = {
  wasm: "WASM file (defaults: wal, full)",
  "wasm-wal": "WASM file (wal, full)",
  node: "node:sqlite file (defaults: wal, full)",
};
const WORK: Record<Work, string> = {
  noop: "handler does nothing",
  io: "handler awaits a 1 ms timer",
  thread: "handler awaits 1 ms on another thread (FFI usleep)",
};
const KV = "Deno KV file (WAL, fsync per commit)";

/** What a loop row is compared with. */
export type LoopAnchor = "kvGated" | "kvUngated" | "graphile" | "boss";

/** Events per block, untimed blocks per side, timed blocks per side. */
interface Blocks {
  readonly units: number;
  readonly warmup: number;
  readonly blocks: number;
}

/** A SQLite store's file and Deno KV's, side by side. */
interface Files {
  readonly path: string;
  readonly kvPath: string;
}

/** What one process measures. */
export type LoopScenario =
  | Blocks & Files & {
    readonly kind: "sqliteLoop";
    readonly store: Store;
    readonly work: Work;
    readonly concurrency: number;
  }
  | Blocks & {
    readonly kind: "postgresLoop";
    readonly url: string;
    readonly work: Work;
    readonly concurrency: number;
  }
  | Blocks & Files & {
    readonly kind: "singleEnqueue";
    readonly store: Store;
  }
  | {
    /** Wake latency of an idle loop; `other`: enqueued by another process. */
    readonly kind: "latency";
    readonly target: { readonly path: string } | { readonly url: string };
    readonly from: "same" | "other";
    readonly samples: number;
  }
  | {
    /** Deno KV's wake latency: `kv.enqueue` to its `listenQueue` handler. */
    readonly kind: "kvLatency";
    readonly kvPath: string;
    readonly samples: number;
  }
  | {
    /** The other process of a latency scenario: enqueues `samples` events. */
    readonly kind: "enqueuer";
    readonly target: { readonly path: string } | { readonly url: string };
    readonly samples: number;
  };

let usleep: ((microseconds: number) => Promise<number>) | undefined;

function handlerOf(work: Work): () => unknown {
  if (work === "noop") return () => {};
  if (work === "io") {
    return () => new Promise<void>((resolve) => setTimeout(resolve, 1));
  }
  usleep ??= Deno.dlopen(platformFor(Deno.build.os, Deno.build.arch).library, {
    usleep: { parameters: ["u32"], result: "i32", nonblocking: true },
  }).symbols.usleep;
  const sleep = usleep;
  return () => sleep(1_000);
}

function openStore(store: Store, path: string): Promise<Outbox> {
  const driver = store === "node"
    ? openNodeSqlite(path)
    : openSqliteWasm(path, store === "wasm-wal" ? { journalMode: "wal" } : {});
  return driver.then((d) => OutboxClass.open(d));
}

async function openTarget(
  target: { readonly path: string } | { readonly url: string },
): Promise<Outbox> {
  return "url" in target
    ? await openPostgres(target.url)
    : await OutboxClass.open(await openSqliteWasm(target.path));
}

/** Queues `count` events in batches of 1,000. */
async function fill(outbox: Outbox, count: number, block: number) {
  for (let from = 0; from < count; from += 1_000) {
    await outbox.enqueueBatch(
      Array.from(
        { length: Math.min(1_000, count - from) },
        (_, n) => ({ payload: { block, n: from + n } }),
      ),
    );
  }
}

/** `processEvents` with its defaults but `concurrency`, draining each block. */
function loopSide(
  outbox: Outbox,
  work: Work,
  concurrency: number,
  units: number,
): Side {
  const handler = handlerOf(work);
  let block = 0;
  return {
    prepare: () => fill(outbox, units, ++block),
    async block() {
      let handled = 0;
      const drained = Promise.withResolvers<void>();
      const processor = processEvents(outbox, async () => {
        await handler();
        if (++handled === units) drained.resolve();
      }, { concurrency });
      await drained.promise;
      // Stopping waits for the last acknowledgements' commit.
      await processor.stop();
      return units;
    },
  };
}

/**
 * The handler alone, no queue: `concurrency` loops awaiting it one call
 * after another until `units` calls returned. What any processing loop in
 * this process could run at most with this handler, as the runtime's timers
 * fire: the ceiling of a loop row.
 */
function aloneSide(work: Work, concurrency: number, units: number): Side {
  const handler = handlerOf(work);
  return {
    async block() {
      let taken = 0;
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          while (taken < units) {
            taken++;
            await handler();
          }
        }),
      );
      return units;
    },
  };
}

/** Enqueues on Deno KV in atomic operations of at most 1,000. */
async function kvFill(kv: Deno.Kv, count: number, block: number) {
  for (let from = 0; from < count; from += 1_000) {
    const operation = kv.atomic();
    for (let n = from; n < Math.min(count, from + 1_000); n++) {
      operation.enqueue({ block, n });
    }
    if (!(await operation.commit()).ok) throw new Error("KV refused");
  }
}

/**
 * `handler`, run at most `limit` at once: the calls past it wait their turn
 * in order.
 */
function gated<T>(limit: number, handler: (message: T) => Promise<void>) {
  let running = 0;
  const waiting: (() => void)[] = [];
  return async (message: T) => {
    if (running < limit) running++;
    else await new Promise<void>((resolve) => waiting.push(resolve));
    try {
      await handler(message);
    } finally {
      const next = waiting.shift();
      if (next === undefined) running--;
      else next();
    }
  };
}

/**
 * Deno KV's `listenQueue` draining the messages queued before each block,
 * its handler gated to `gate` at once (as it dispatches: up to 100, when
 * `undefined`): a `Deno.Kv` listens once, so each block opens the file anew.
 */
function kvLoopSide(
  kvPath: string,
  work: Work,
  units: number,
  gate: number | undefined,
): Side & Disposable {
  const handler = handlerOf(work);
  let kv: Deno.Kv | undefined;
  let listening: Promise<void> | undefined;
  let block = 0;
  return {
    async prepare() {
      kv?.close();
      await listening;
      kv = await Deno.openKv(kvPath);
      await kvFill(kv, units, ++block);
    },
    async block() {
      const current = block;
      let handled = 0;
      const drained = Promise.withResolvers<void>();
      const handle = async (message: { block: number }) => {
        await handler();
        if (message.block === current && ++handled === units) {
          drained.resolve();
        }
      };
      listening = kv!.listenQueue(
        gate === undefined ? handle : gated(gate, handle),
      );
      // Ends when the last handler returns, before Deno KV commits its
      // last messages as finished: in Deno KV's favour.
      await drained.promise;
      return units;
    },
    [Symbol.dispose]: () => kv?.close(),
  };
}

/**
 * graphile-worker's `run()` at `concurrency`, its other options its
 * defaults unless `worker` sets them (its preset's `worker` options: the
 * PostgreSQL batch rows set `localQueue` and `completeJobBatchDelay`),
 * draining the jobs queued before each block (`add_jobs`, one statement).
 */
export async function graphileSide(
  url: string,
  work: Work,
  concurrency: number,
  units: number,
  worker: {
    readonly localQueue?: { readonly size: number };
    readonly completeJobBatchDelay?: number;
  } = {},
): Promise<Side & AsyncDisposable> {
  const handler = handlerOf(work);
  const logger = new Logger(() => () => {});
  const utils = await makeWorkerUtils({ connectionString: url, logger });
  await utils.migrate();
  return {
    prepare: () =>
      utils.withPgClient(async (client) => {
        await client.query(
          `SELECT graphile_worker.add_jobs(array(
             SELECT json_populate_record(null::graphile_worker.job_spec,
               json_build_object('identifier', 'bench', 'payload',
                 json_build_object('n', g)))
             FROM generate_series(1, $1) g))`,
          [units],
        );
      }),
    async block() {
      let handled = 0;
      const drained = Promise.withResolvers<void>();
      const runner = await run({
        connectionString: url,
        concurrency,
        noHandleSignals: true,
        logger,
        preset: { worker },
        taskList: {
          bench: async () => {
            await handler();
            if (++handled === units) drained.resolve();
          },
        },
      });
      await drained.promise;
      // Stopping waits for the last completions.
      await runner.stop();
      return units;
    },
    [Symbol.asyncDispose]: async () => await utils.release(),
  };
}

/**
 * pg-boss: `concurrency` loops of `fetch` + handler + `complete`, its
 * defaults (a pool of 10), draining the jobs queued before each block.
 */
async function bossSide(
  url: string,
  work: Work,
  concurrency: number,
  units: number,
): Promise<Side & AsyncDisposable> {
  const handler = handlerOf(work);
  const boss = await startBoss(url);
  const queue = "bench_loop";
  await boss.createQueue(queue);
  return {
    async prepare() {
      for (let from = 0; from < units; from += 1_000) {
        await boss.insert(
          queue,
          Array.from(
            { length: Math.min(1_000, units - from) },
            (_, n) => ({ data: { n: from + n } }),
          ),
        );
      }
    },
    async block() {
      let handled = 0;
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          for (;;) {
            const [job] = await boss.fetch(queue);
            if (job === undefined) return;
            await handler();
            await boss.complete(queue, job.id);
            handled++;
          }
        }),
      );
      return handled;
    },
    [Symbol.asyncDispose]: () => boss.stop({ graceful: false, close: true }),
  };
}

/** Single enqueues, one per transaction. */
function enqueueSide(outbox: Outbox, units: number): Side {
  let block = 0;
  return {
    async block() {
      block++;
      for (let n = 0; n < units; n++) await outbox.enqueue({ block, n });
      return units;
    },
  };
}

function kvEnqueueSide(kvPath: string, units: number): Side & Disposable {
  let kv: Deno.Kv | undefined;
  let block = 0;
  return {
    async block() {
      kv ??= await Deno.openKv(kvPath);
      block++;
      for (let n = 0; n < units; n++) await kv.enqueue({ block, n });
      return units;
    },
    [Symbol.dispose]: () => kv?.close(),
  };
}

/** Epoch milliseconds with sub-millisecond precision, comparable across processes. */
const epochNow = () => performance.timeOrigin + performance.now();

/** A pause of 50 to 250 ms between samples: the loop goes idle in between. */
const pause = () =>
  new Promise((resolve) => setTimeout(resolve, 50 + Math.random() * 200));

/** p50 and p99 of `samples`, in milliseconds. */
function percentiles(samples: readonly number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) =>
    sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!;
  return { p50: median(samples), p99: at(0.99) };
}

/**
 * The wake latency of an idle `processEvents` (its defaults): from the
 * commit of each enqueue to its handler's start.
 */
async function latency(
  scenario: Extract<LoopScenario, { kind: "latency" }>,
): Promise<{ p50: number; p99: number }> {
  await using outbox = await openTarget(scenario.target);
  const startedAt = new Map<number, number>();
  const started = new Map<number, () => void>();
  await using _processor = processEvents(outbox, (lease) => {
    const { i } = lease.payload as { i: number };
    startedAt.set(i, epochNow());
    started.get(i)?.();
  });
  const committedAt: number[] = [];
  if (scenario.from === "same") {
    for (let i = 0; i < scenario.samples; i++) {
      await pause();
      const handled = new Promise<void>((resolve) => started.set(i, resolve));
      await outbox.enqueue({ i });
      committedAt[i] = epochNow();
      await handled;
    }
  } else {
    const last = new Promise<void>((resolve) =>
      started.set(scenario.samples - 1, resolve)
    );
    const times = await runJsonProcess<number[]>(
      SCRIPT,
      {
        kind: "enqueuer",
        target: scenario.target,
        samples: scenario.samples,
      } satisfies LoopScenario,
    );
    committedAt.push(...times);
    await last;
  }
  return percentiles(committedAt.map((at, i) => startedAt.get(i)! - at));
}

/** Deno KV's wake latency, in the same process. */
async function kvLatency(
  scenario: Extract<LoopScenario, { kind: "kvLatency" }>,
): Promise<{ p50: number; p99: number }> {
  const kv = await Deno.openKv(scenario.kvPath);
  const startedAt: number[] = [];
  const started = new Map<number, () => void>();
  const listening = kv.listenQueue((message: { i: number }) => {
    startedAt[message.i] = epochNow();
    started.get(message.i)?.();
  });
  const committedAt: number[] = [];
  for (let i = 0; i < scenario.samples; i++) {
    await pause();
    const handled = new Promise<void>((resolve) => started.set(i, resolve));
    await kv.enqueue({ i });
    committedAt[i] = epochNow();
    await handled;
  }
  kv.close();
  await listening;
  return percentiles(committedAt.map((at, i) => startedAt[i]! - at));
}

async function enqueuer(
  scenario: Extract<LoopScenario, { kind: "enqueuer" }>,
): Promise<number[]> {
  await using outbox = await openTarget(scenario.target);
  const committedAt: number[] = [];
  for (let i = 0; i < scenario.samples; i++) {
    await pause();
    await outbox.enqueue({ i });
    committedAt.push(epochNow());
  }
  return committedAt;
}

/**
 * Runs one scenario in this process.
 *
 * @param scenario What to measure.
 * @returns What it measured.
 */
export async function runLoopScenario(
  scenario: LoopScenario,
): Promise<unknown> {
  switch (scenario.kind) {
    case "sqliteLoop": {
      await using outbox = await openStore(scenario.store, scenario.path);
      const { work, concurrency, units } = scenario;
      using kvGated = kvLoopSide(
        `${scenario.kvPath}-gated`,
        work,
        units,
        concurrency,
      );
      using kv = kvLoopSide(scenario.kvPath, work, units, undefined);
      // The handler alone only where it takes time: a no-op's is no ceiling.
      const alone = work === "noop"
        ? []
        : [aloneSide(work, concurrency, units)];
      return await alternateAll(
        [loopSide(outbox, work, concurrency, units), kvGated, kv, ...alone],
        scenario.warmup,
        scenario.blocks,
      );
    }
    case "postgresLoop": {
      const { url, work, concurrency, units } = scenario;
      await using outbox = await openPostgres(url);
      await using graphile = await graphileSide(url, work, concurrency, units);
      await using boss = await bossSide(url, work, concurrency, units);
      return await alternateAll(
        [loopSide(outbox, work, concurrency, units), graphile, boss],
        scenario.warmup,
        scenario.blocks,
      );
    }
    case "singleEnqueue": {
      await using outbox = await openStore(scenario.store, scenario.path);
      using kv = kvEnqueueSide(scenario.kvPath, scenario.units);
      return await alternate(
        enqueueSide(outbox, scenario.units),
        kv,
        scenario.warmup,
        scenario.blocks,
      );
    }
    case "latency":
      return await latency(scenario);
    case "kvLatency":
      return await kvLatency(scenario);
    case "enqueuer":
      return await enqueuer(scenario);
  }
}

/** Sizes of one run. */
interface Sizes {
  /** Events per block at each concurrency, by handler. */
  readonly loop: Record<Work, number>;
  readonly loopBlocks: number;
  readonly postgres: Record<Exclude<Work, "thread">, number>;
  readonly postgresBlocks: number;
  readonly enqueue: { units: number; warmup: number; blocks: number };
  readonly samples: number;
}

const FULL: Sizes = {
  loop: { noop: 600, io: 300, thread: 300 },
  loopBlocks: 4,
  postgres: { noop: 300, io: 200 },
  postgresBlocks: 4,
  enqueue: { units: 100, warmup: 3, blocks: 8 },
  samples: 100,
};

const SMOKE: Sizes = {
  loop: { noop: 8, io: 4, thread: 4 },
  loopBlocks: 1,
  postgres: { noop: 8, io: 4 },
  postgresBlocks: 1,
  enqueue: { units: 3, warmup: 1, blocks: 1 },
  samples: 3,
};

const SCRIPT = new URL(import.meta.url).pathname;
const CONCURRENCIES = [1, 4, 16] as const;

/**
 * The goal of a loop row (issue 37): the library's defaults lead Deno KV
 * gated to the same concurrency at 1 and 4 (by 1.5 at 16), graphile-worker
 * and pg-boss on PostgreSQL. Other settings, and Deno KV as it dispatches
 * (up to 100 handlers at once, whatever the loop's concurrency), are
 * reported.
 */
export function loopGoal(
  store: Store | "postgres",
  concurrency: number,
  anchor: LoopAnchor,
): Goal | undefined {
  if (store === "wasm-wal" || anchor === "kvUngated") return undefined;
  if (store === "postgres") return { atLeast: 1 };
  return { atLeast: concurrency >= 16 ? 1.5 : 1 };
}

/**
 * The rows of a SQLite loop scenario: against Deno KV gated to the loop's
 * concurrency (the goal; with the 1 ms handler, at 1 and 4 the goal reads
 * the handler awaiting 1 ms on another thread, as I/O completes, which is
 * what issue 37 asks for: a 1 ms timer's row is reported, since what wakes
 * the event loop, not the loop's work, sets it, see bench/README.md),
 * and against Deno KV as it dispatches; when the
 * handler alone was measured too (a fourth side), reported against it, and
 * it against Deno KV gated: how near Deno KV any loop running this handler
 * in this process could come.
 *
 * @param m The loop, Deno KV gated, Deno KV ungated (and the handler
 * alone), as measured.
 */
export function kvLoopRowsOf(
  store: Store,
  work: Work,
  concurrency: number,
  m: AlternatedAll,
): BenchRow[] {
  const name = `processEvents events/s, concurrency ${concurrency}, ${
    WORK[work]
  }, ${STORES[store]}`;
  const gated = `${KV}, kv.listenQueue(), same handler, ${concurrency} at once`;
  const rows: BenchRow[] = (["kvGated", "kvUngated"] as const).map((
    anchor,
    i,
  ) => ({
    name,
    value: m.values[0]!,
    unit: "events/s",
    anchor: anchor === "kvGated"
      ? gated
      : `${KV}, kv.listenQueue(), same handler, up to 100 at once`,
    anchorValue: m.values[i + 1]!,
    ratio: m.ratios[i]!,
    ...judge(
      work === "io" && concurrency < 16
        ? undefined
        : loopGoal(store, concurrency, anchor),
      m.ratios[i]!,
      m.values[0]!,
    ),
  }));
  const alone = m.values[3];
  if (alone === undefined) return rows;
  const aloneName =
    `the handler alone, no queue, events/s, concurrency ${concurrency}, ${
      WORK[work]
    }`;
  const overGated = median(
    m.blockRates[3]!.map((rate, b) => rate / m.blockRates[1]![b]!),
  );
  rows.push(
    {
      name,
      value: m.values[0]!,
      unit: "events/s",
      anchor: aloneName,
      anchorValue: alone,
      ratio: m.ratios[2]!,
      ...judge(undefined, m.ratios[2]!, m.values[0]!),
    },
    {
      name: aloneName,
      value: alone,
      unit: "events/s",
      anchor: gated,
      anchorValue: m.values[1]!,
      ratio: overGated,
      ...judge(undefined, overGated, alone),
    },
  );
  return rows;
}

function progress(message: string): void {
  console.error(`bench: ${message}`);
}

/**
 * Measures every row of this module, each scenario in its own process.
 *
 * @param smoke Toy sizes, to keep the script working.
 * @param dir A directory for the database files.
 * @returns The rows.
 */
export async function loopRows(
  smoke: boolean,
  dir: string,
  only?: RegExp,
): Promise<BenchRow[]> {
  const sizes = smoke ? SMOKE : FULL;
  const wanted = (label: string) => {
    if (only !== undefined && !only.test(label)) return false;
    progress(label);
    return true;
  };
  const runKv = <T>(scenario: LoopScenario) =>
    runJsonProcess<T>(SCRIPT, scenario, ["--unstable-kv"]);
  const rows: BenchRow[] = [];
  const row = (
    name: string,
    unit: string,
    anchor: string,
    value: number,
    anchorValue: number,
    ratio: number,
    goal: Goal | undefined,
  ) =>
    rows.push({
      name,
      value,
      unit,
      anchor,
      anchorValue,
      ratio,
      ...judge(goal, ratio, value),
    });
  let file = 0;
  const files = () => ({
    path: join(dir, `loop-${++file}.db`),
    kvPath: join(dir, `loop-${file}-kv.db`),
  });

  for (const store of ["wasm", "wasm-wal", "node"] as const) {
    for (const work of ["noop", "io", "thread"] as const) {
      for (const concurrency of CONCURRENCIES) {
        // The handler on another thread: the defaults at 1 and 4, the goal.
        if (work === "thread" && (store === "wasm-wal" || concurrency > 4)) {
          continue;
        }
        if (
          !wanted(`processEvents, ${STORES[store]}, ${work}, c=${concurrency}`)
        ) continue;
        const m = await runKv<AlternatedAll>({
          kind: "sqliteLoop",
          store,
          work,
          concurrency,
          units: sizes.loop[work],
          warmup: 1,
          blocks: sizes.loopBlocks,
          ...files(),
        });
        rows.push(...kvLoopRowsOf(store, work, concurrency, m));
      }
    }
  }

  const server = await startPostgres();
  try {
    for (const work of ["noop", "io"] as const) {
      for (const concurrency of CONCURRENCIES) {
        if (!wanted(`processEvents on PostgreSQL, ${work}, c=${concurrency}`)) {
          continue;
        }
        const m = await runJsonProcess<
          { values: number[]; ratios: number[] }
        >(
          SCRIPT,
          {
            kind: "postgresLoop",
            url: await server.createDatabase(),
            work,
            concurrency,
            units: sizes.postgres[work],
            warmup: 1,
            blocks: sizes.postgresBlocks,
          } satisfies LoopScenario,
        );
        const name = `processEvents events/s, concurrency ${concurrency}, ${
          WORK[work]
        }, PostgreSQL ${server.version}`;
        row(
          name,
          "events/s",
          "graphile-worker 0.18 run(), same server, same handler",
          m.values[0]!,
          m.values[1]!,
          m.ratios[0]!,
          loopGoal("postgres", concurrency, "graphile"),
        );
        row(
          name,
          "events/s",
          `pg-boss 12, ${concurrency} fetch+complete loops, same server`,
          m.values[0]!,
          m.values[2]!,
          m.ratios[1]!,
          loopGoal("postgres", concurrency, "boss"),
        );
      }
    }

    for (const store of ["wasm", "wasm-wal", "node"] as const) {
      if (!wanted(`single enqueues, ${STORES[store]}`)) continue;
      const m = await runKv<Alternated>({
        kind: "singleEnqueue",
        store,
        ...sizes.enqueue,
        ...files(),
      });
      row(
        `single enqueue events/s, one per transaction, ${STORES[store]}`,
        "events/s",
        `${KV}, sequential kv.enqueue()`,
        m.value,
        m.anchorValue,
        m.ratio,
        store === "wasm" ? { atLeast: 0.9 } : undefined,
      );
    }

    if (!wanted("idle-wake latency, Deno KV, same process")) return rows;
    const targets = [
      ["WASM file (defaults)", { path: files().path }],
      [`PostgreSQL ${server.version}`, { url: await server.createDatabase() }],
    ] as const;
    const kvWake = await runKv<{ p50: number; p99: number }>({
      kind: "kvLatency",
      kvPath: files().kvPath,
      samples: sizes.samples,
    });
    for (const [label, target] of targets) {
      const measured: Record<string, { p50: number; p99: number }> = {};
      for (const from of ["same", "other"] as const) {
        progress(`idle-wake latency, ${label}, ${from} process`);
        measured[from] = await runJsonProcess(
          SCRIPT,
          {
            kind: "latency",
            target,
            from,
            samples: sizes.samples,
          } satisfies LoopScenario,
        );
      }
      for (const p of ["p50", "p99"] as const) {
        const same = measured.same![p];
        const other = measured.other![p];
        row(
          `idle-wake latency ${p}, enqueue committed to handler start, same process, ${label}`,
          "ms",
          `${KV}, kv.enqueue() to its listenQueue() handler, same process`,
          same,
          kvWake[p],
          same / kvWake[p],
          undefined,
        );
        row(
          `idle-wake latency ${p}, enqueue committed to handler start, another process, ${label}`,
          "ms",
          "the same, enqueued in the same process",
          other,
          same,
          other / same,
          undefined,
        );
      }
    }
  } finally {
    await server.stop();
  }
  return rows;
}

if (import.meta.main) {
  const [arg] = Deno.args;
  if (arg !== undefined && arg.startsWith("{")) {
    console.log(JSON.stringify(await runLoopScenario(JSON.parse(arg))));
  } else {
    const smoke = Deno.args.includes("--smoke");
    const at = Deno.args.indexOf("--only");
    const only = at < 0 ? undefined : new RegExp(Deno.args[at + 1] ?? "");
    const dir = await Deno.makeTempDir({ prefix: "outbox_loop_bench_" });
    try {
      const rows = await loopRows(smoke, dir, only);
      console.log(markdown(rows));
      console.log();
      console.log(JSON.stringify({ smoke, rows }));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
}
