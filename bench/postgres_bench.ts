/**
 * PostgreSQL rows of `deno task bench`: single and batch claim+acknowledge
 * of this outbox, and batches acknowledged and claimed in one call
 * (`acknowledgeAndClaim`), next to pg-boss (fetch + complete) on the same
 * server, in the same process, one connection each, with the server's
 * default durability (`fsync` and `synchronous_commit` on) for both. Blocks
 * alternate which side goes first, so drifting load falls on both alike.
 *
 * Runs on its own too: `deno run -A bench/postgres_bench.ts [--smoke]`.
 *
 * @module
 */
import { PgBoss } from "npm:pg-boss@12.38.0";
import { openPostgres } from "../drivers/postgres.ts";
import type { Lease, Outbox } from "../mod.ts";
import { startPostgres } from "../scripts/postgres_server.ts";
import { alternate, type Alternated } from "./blocks.ts";
import { type BenchRow, judge, markdown } from "./table.ts";

interface Sizes {
  readonly warmup: number;
  readonly blocks: number;
  /** Claim+acknowledge cycles (single) or batches (batch) per block. */
  readonly units: number;
  readonly max: number;
}

const FULL = {
  single: { warmup: 50, blocks: 10, units: 100, max: 1 },
  batch: { warmup: 5, blocks: 10, units: 4, max: 256 },
  fused: { warmup: 5, blocks: 10, units: 4, max: 256 },
} satisfies Record<string, Sizes>;
const SMOKE = {
  single: { warmup: 1, blocks: 2, units: 3, max: 1 },
  batch: { warmup: 1, blocks: 2, units: 1, max: 8 },
  fused: { warmup: 1, blocks: 2, units: 1, max: 8 },
} satisfies Record<string, Sizes>;

interface Side {
  fill(count: number): Promise<void>;
  /** Claims up to `max` and acknowledges them; resolves to how many. */
  cycle(max: number): Promise<number>;
}

/**
 * This outbox's side. `fused`: each cycle acknowledges the batch the one
 * before claimed and claims the next in one call (`acknowledgeAndClaim`),
 * as a processing loop does, and counts the events acknowledged.
 */
function outboxSide(outbox: Outbox, fused = false): Side {
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

function bossSide(boss: PgBoss, queue: string): Side {
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
 * @returns The two rows.
 */
export async function postgresRows(smoke: boolean): Promise<BenchRow[]> {
  const sizes = smoke ? SMOKE : FULL;
  const server = await startPostgres();
  try {
    const outbox = await openPostgres(server.url, { listen: false });
    const boss = new PgBoss({
      connectionString: server.url,
      max: 1,
      schedule: false,
      supervise: false,
    });
    boss.on("error", () => {});
    await boss.start();
    try {
      const rows: BenchRow[] = [];
      const kinds = {
        single: { name: "postgres claim+ack cycles/s, one at a time", goal: 1 },
        batch: {
          name:
            `postgres batch claim+ack events/s, ${sizes.batch.max} per batch`,
          goal: 1.5,
        },
        fused: {
          name:
            `postgres batch acknowledgeAndClaim({ max: ${sizes.fused.max} }) events/s`,
          goal: undefined,
        },
      };
      for (const [kind, { name, goal }] of Object.entries(kinds)) {
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
          ...judge(
            goal === undefined ? undefined : { atLeast: goal },
            m.ratio,
            m.value,
          ),
        });
      }
      return rows;
    } finally {
      await boss.stop({ graceful: false, close: true });
      await outbox.close();
    }
  } finally {
    await server.stop();
  }
}

if (import.meta.main) {
  const smoke = Deno.args.includes("--smoke");
  const rows = await postgresRows(smoke);
  console.log(markdown(rows));
  console.log();
  console.log(JSON.stringify({ smoke, rows }));
}
