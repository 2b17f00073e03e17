/**
 * PostgreSQL rows of `deno task bench`: single and batch claim+acknowledge
 * of this outbox, and batches acknowledged and claimed in one call
 * (`acknowledgeAndClaim`), next to pg-boss (fetch + complete) on the same
 * server, in the same process, one connection each, with the server's
 * default durability (`fsync` and `synchronous_commit` on) for both. Blocks
 * alternate which side goes first, so drifting load falls on both alike.
 *
 * Issue 39's rows put graphile-worker beside pg-boss, the three in rotating
 * blocks: batch claim+acknowledge (256), batch enqueue (256) and 64
 * concurrent producers, each with the WAL bytes per event every side wrote
 * in its timed blocks (`pg_current_wal_lsn()` before and after, read on a
 * connection of its own).
 *
 * Runs on its own too: `deno run -A bench/postgres_bench.ts [--smoke]
 * [--peers]` (`--peers`: issue 39's rows alone).
 *
 * @module
 */
import { Logger, makeWorkerUtils } from "npm:graphile-worker@0.18.0";
import type { PgBoss } from "npm:pg-boss@12.38.0";
import { connectPostgres, openPostgres } from "../drivers/postgres.ts";
import type { Driver, Lease, Outbox } from "../mod.ts";
import { startPostgres } from "../scripts/postgres_server.ts";
import {
  alternate,
  alternateAll,
  type Alternated,
  type Side as Block,
} from "./blocks.ts";
import { graphileSide } from "./loop_bench.ts";
import { startBoss } from "./pg_boss.ts";
import { type BenchRow, type Goal, judge, markdown } from "./table.ts";

interface Sizes {
  readonly warmup: number;
  readonly blocks: number;
  /** Claim+acknowledge cycles (single) or batches (batch) per block. */
  readonly units: number;
  readonly max: number;
}

const FULL = {
  single: { warmup: 50, blocks: 10, units: 100, max: 1 },
  fused: { warmup: 5, blocks: 10, units: 4, max: 256 },
} satisfies Record<string, Sizes>;
const SMOKE = {
  single: { warmup: 1, blocks: 2, units: 3, max: 1 },
  fused: { warmup: 1, blocks: 2, units: 1, max: 8 },
} satisfies Record<string, Sizes>;

/** The sizes of the rows against both peers. */
interface PeerSizes {
  readonly warmup: number;
  readonly blocks: number;
  /** Batches per block (claim+ack, enqueue). */
  readonly batches: number;
  /** Events per batch. */
  readonly max: number;
  readonly producers: number;
  /** Sequential enqueues of each producer per block. */
  readonly perProducer: number;
}

// Blocks of 16 batches: graphile-worker's run() starts and stops inside
// each timed block (as in the loop rows), which a longer block amortizes.
const FULL_PEERS: PeerSizes = {
  warmup: 1,
  blocks: 6,
  batches: 16,
  max: 256,
  producers: 64,
  perProducer: 8,
};
const SMOKE_PEERS: PeerSizes = {
  warmup: 1,
  blocks: 1,
  batches: 1,
  max: 8,
  producers: 4,
  perProducer: 2,
};

/** The anchors of this module's rows. */
export type Peer = "pg-boss" | "graphile-worker";

/** This module's rows. */
export type PostgresRow =
  | "single"
  | "batch"
  | "fused"
  | "enqueue"
  | "producers";

/**
 * The goal of a PostgreSQL row against a peer (issue 39): batch
 * claim+acknowledge at least 1.3 graphile-worker and 2.0 pg-boss, batch
 * enqueue at least 1.2 both, 64 concurrent producers at least 5 both; one
 * at a time at least pg-boss (issue 16). The others are reported.
 *
 * @param row The row.
 * @param peer Its anchor.
 * @returns The goal, or `undefined` for a report row.
 */
export function postgresGoal(
  row: PostgresRow,
  peer: Peer,
): Goal | undefined {
  switch (row) {
    case "single":
      return peer === "pg-boss" ? { atLeast: 1 } : undefined;
    case "batch":
      return { atLeast: peer === "pg-boss" ? 2 : 1.3 };
    case "enqueue":
      return { atLeast: 1.2 };
    case "producers":
      return { atLeast: 5 };
    case "fused":
      return undefined;
  }
}

const ANCHORS: Record<Peer, Record<"claim" | "enqueue", string>> = {
  "pg-boss": {
    claim: "pg-boss 12 fetch+complete, same server",
    enqueue: "pg-boss 12 insert/send, its default pool, same server",
  },
  "graphile-worker": {
    claim:
      "graphile-worker 0.18 run(), localQueue and completeJobBatchDelay 0, same server",
    enqueue:
      "graphile-worker 0.18 addJobs/addJob, its default pool, same server",
  },
};

export interface Side {
  fill(count: number): Promise<void>;
  /** Claims up to `max` and acknowledges them; resolves to how many. */
  cycle(max: number): Promise<number>;
}

/**
 * This outbox's side. `fused`: each cycle acknowledges the batch the one
 * before claimed and claims the next in one call (`acknowledgeAndClaim`),
 * as a processing loop does, and counts the events acknowledged.
 */
export function outboxSide(outbox: Outbox, fused = false): Side {
  let held: Lease[] | undefined;
  return {
    async fill(count) {
      for (let start = 0; start < count; start += 1_000) {
        await outbox.transaction(async (tx) => {
          for (let i = start; i < Math.min(count, start + 1_000); i++) {
            await tx.enqueue({ i });
          }
        });
      }
    },
    async cycle(max) {
      if (max === 1) {
        const lease = await outbox.claim();
        if (lease === null) return 0;
        await outbox.acknowledge(lease);
        return 1;
      }
      if (fused) {
        const previous = held ?? await outbox.claim({ max });
        const { acknowledged, leases } = await outbox.acknowledgeAndClaim(
          previous,
          { max },
        );
        if (!acknowledged.every(Boolean)) throw new Error("Lost a lease");
        held = leases;
        return previous.length;
      }
      const leases = await outbox.claim({ max });
      await outbox.acknowledge(leases);
      return leases.length;
    },
  };
}

export function bossSide(boss: PgBoss, queue: string): Side {
  return {
    async fill(count) {
      for (let start = 0; start < count; start += 1_000) {
        const jobs = [];
        for (let i = start; i < Math.min(count, start + 1_000); i++) {
          jobs.push({ data: { i } });
        }
        await boss.insert(queue, jobs);
      }
    },
    async cycle(max) {
      const jobs = await boss.fetch(queue, { batchSize: max });
      if (jobs.length === 0) return 0;
      await boss.complete(queue, jobs.map((job) => job.id));
      return jobs.length;
    },
  };
}

/** Events per second of each side, and the median of per-block ratios. */
async function measure(
  ours: Side,
  theirs: Side,
  sizes: Sizes,
): Promise<Alternated> {
  // One batch more: a fused side's last call claims one.
  const perSide = (sizes.warmup + sizes.blocks * sizes.units + 1) * sizes.max;
  await ours.fill(perSide);
  await theirs.fill(perSide);
  for (let i = 0; i < sizes.warmup; i++) {
    await ours.cycle(sizes.max);
    await theirs.cycle(sizes.max);
  }
  const blocks = (side: Side) => ({
    async block() {
      let events = 0;
      for (let i = 0; i < sizes.units; i++) {
        events += await side.cycle(sizes.max);
      }
      return events;
    },
  });
  return await alternate(blocks(ours), blocks(theirs), 0, sizes.blocks);
}

/**
 * Starts a server, measures both rows and stops it.
 *
 * @param smoke Toy sizes, to keep the script working.
 * @param peersOnly Only the rows against both peers (issue 39's).
 * @returns The rows.
 */
export async function postgresRows(
  smoke: boolean,
  peersOnly = false,
): Promise<BenchRow[]> {
  const sizes = smoke ? SMOKE : FULL;
  const server = await startPostgres();
  try {
    const outbox = await openPostgres(server.url, { listen: false });
    const boss = await startBoss(server.url, 1);
    try {
      const rows: BenchRow[] = [];
      if (peersOnly) return await peerRows(server.url, outbox, smoke);
      const kinds = {
        single: { name: "postgres claim+ack cycles/s, one at a time" },
        fused: {
          name:
            `postgres batch acknowledgeAndClaim({ max: ${sizes.fused.max} }) events/s`,
        },
      };
      for (const [kind, { name }] of Object.entries(kinds)) {
        const goal = postgresGoal(kind as keyof typeof kinds, "pg-boss");
        const queue = `bench_${kind}`;
        await boss.createQueue(queue);
        const m = await measure(
          outboxSide(outbox, kind === "fused"),
          bossSide(boss, queue),
          sizes[kind as keyof typeof kinds],
        );
        rows.push({
          name,
          value: m.value,
          unit: "events/s",
          anchor: "pg-boss 12 fetch+complete, same server",
          anchorValue: m.anchorValue,
          ratio: m.ratio,
          ...judge(goal, m.ratio, m.value),
        });
      }
      rows.push(...await peerRows(server.url, outbox, smoke));
      return rows;
    } finally {
      await boss.stop({ graceful: false, close: true });
      await outbox.close();
    }
  } finally {
    await server.stop();
  }
}

/** Reads the server's WAL position, in bytes. */
export function walPosition(monitor: Driver): () => Promise<number> {
  return async () => {
    const [row] = await monitor.query(
      "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS at",
    );
    return Number(row?.["at"]);
  };
}

/** A block side that also counts the WAL bytes its timed blocks wrote. */
interface Metered extends Block {
  /** WAL bytes per event over the blocks after the first `skip`. */
  perEvent(skip: number): number;
}

/**
 * `side` with the server's WAL position read after its untimed `prepare`
 * and at the end of its block (one round trip in the timed block, alike on
 * every side). Blocks run one side at a time, so what the server wrote
 * between the two reads is that side's.
 */
function metered(side: Block, position: () => Promise<number>): Metered {
  const blocks: { bytes: number; events: number }[] = [];
  let start = 0;
  return {
    async prepare() {
      await side.prepare?.();
      start = await position();
    },
    async block() {
      const events = await side.block();
      blocks.push({ bytes: (await position()) - start, events });
      return events;
    },
    perEvent(skip) {
      const timed = blocks.slice(skip);
      const bytes = timed.reduce((sum, b) => sum + b.bytes, 0);
      const events = timed.reduce((sum, b) => sum + b.events, 0);
      return bytes / events;
    },
  };
}

/**
 * A {@linkcode Side} as rotating blocks: each block drains `batches`
 * batches of `max` queued (untimed) before it.
 */
function drained(side: Side, batches: number, max: number): Block {
  return {
    prepare: () => side.fill(batches * max),
    async block() {
      let events = 0;
      for (let i = 0; i < batches; i++) events += await side.cycle(max);
      return events;
    },
  };
}

/**
 * Measures this outbox and the two peers in rotating blocks and returns
 * the two rows of the rates and the two of WAL bytes per event.
 */
async function peerRow(
  row: PostgresRow,
  what: string,
  anchor: "claim" | "enqueue",
  sides: readonly [Block, Block, Block],
  sizes: PeerSizes,
  position: () => Promise<number>,
): Promise<BenchRow[]> {
  const meters = sides.map((side) => metered(side, position));
  const { values, ratios } = await alternateAll(
    meters,
    sizes.warmup,
    sizes.blocks,
  );
  const wal = meters.map((m) => m.perEvent(sizes.warmup));
  const peers: Peer[] = ["graphile-worker", "pg-boss"];
  const rows: BenchRow[] = peers.map((peer, i) => ({
    name: `postgres ${what} events/s vs ${peer}`,
    value: values[0]!,
    unit: "events/s",
    anchor: ANCHORS[peer][anchor],
    anchorValue: values[i + 1]!,
    ratio: ratios[i]!,
    ...judge(postgresGoal(row, peer), ratios[i]!, values[0]!),
  }));
  for (const [i, peer] of peers.entries()) {
    rows.push({
      name: `postgres WAL bytes/event, ${what}, vs ${peer}`,
      value: wal[0]!,
      unit: "B/event",
      anchor: ANCHORS[peer][anchor],
      anchorValue: wal[i + 1]!,
      ratio: wal[0]! / wal[i + 1]!,
      ...judge(undefined, 0, 0),
    });
  }
  return rows;
}

/**
 * Issue 39's rows against graphile-worker and pg-boss on the server at
 * `url`: batch claim+acknowledge, batch enqueue and concurrent producers,
 * with WAL bytes per event.
 */
async function peerRows(
  url: string,
  outbox: Outbox,
  smoke: boolean,
): Promise<BenchRow[]> {
  const sizes = smoke ? SMOKE_PEERS : FULL_PEERS;
  const { batches, max, producers, perProducer } = sizes;
  await using monitor = await connectPostgres(url, { listen: false });
  const position = walPosition(monitor);
  // The peers' enqueue paths with their defaults (a pool of 10 each).
  const boss = await startBoss(url);
  const utils = await makeWorkerUtils({
    connectionString: url,
    logger: new Logger(() => () => {}),
  });
  await utils.migrate();
  const rows: BenchRow[] = [];
  try {
    const claimQueue = "bench_peers_claim";
    await boss.createQueue(claimQueue);
    // Every job of a block starts at once and completes in one batch, as
    // this outbox's claim of `max` and its one acknowledgement do.
    await using graphile = await graphileSide(url, "noop", max, batches * max, {
      localQueue: { size: max },
      completeJobBatchDelay: 0,
    });
    rows.push(
      ...await peerRow(
        "batch",
        `batch claim+ack (${max})`,
        "claim",
        [
          drained(outboxSide(outbox), batches, max),
          graphile,
          drained(bossSide(boss, claimQueue), batches, max),
        ],
        sizes,
        position,
      ),
    );

    // Enqueued into queues (and a task) no claim above reads.
    const queue = "bench_peers_enqueue";
    await boss.createQueue(queue);
    const batch = (n: number) => Array.from({ length: max }, (_, i) => n + i);
    rows.push(
      ...await peerRow(
        "enqueue",
        `batch enqueue (${max})`,
        "enqueue",
        [
          {
            async block() {
              for (let b = 0; b < batches; b++) {
                await outbox.enqueueBatch(
                  batch(b * max).map((i) => ({ payload: { i }, queue })),
                );
              }
              return batches * max;
            },
          },
          {
            async block() {
              for (let b = 0; b < batches; b++) {
                await utils.addJobs(
                  batch(b * max).map((i) => ({
                    identifier: "bench_enqueue",
                    payload: { i },
                  })),
                );
              }
              return batches * max;
            },
          },
          {
            async block() {
              for (let b = 0; b < batches; b++) {
                await boss.insert(
                  queue,
                  batch(b * max).map((i) => ({ data: { i } })),
                );
              }
              return batches * max;
            },
          },
        ],
        sizes,
        position,
      ),
    );

    // `producers` callers at once, each enqueueing one event at a time.
    const concurrently = (enqueue: (i: number) => Promise<unknown>): Block => ({
      async block() {
        await Promise.all(
          Array.from({ length: producers }, async (_, p) => {
            for (let i = 0; i < perProducer; i++) {
              await enqueue(p * perProducer + i);
            }
          }),
        );
        return producers * perProducer;
      },
    });
    rows.push(
      ...await peerRow(
        "producers",
        `${producers} concurrent producers`,
        "enqueue",
        [
          concurrently((i) => outbox.enqueue({ i }, { queue })),
          concurrently((i) => utils.addJob("bench_enqueue", { i })),
          concurrently((i) => boss.send(queue, { i })),
        ],
        sizes,
        position,
      ),
    );
  } finally {
    await utils.release();
    await boss.stop({ graceful: false, close: true });
  }
  return rows;
}

if (import.meta.main) {
  const smoke = Deno.args.includes("--smoke");
  const rows = await postgresRows(smoke, Deno.args.includes("--peers"));
  console.log(markdown(rows));
  console.log();
  console.log(JSON.stringify({ smoke, rows }));
}
