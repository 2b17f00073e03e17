/**
 * One benchmark scenario per process: `deno run -A bench/scenario.ts '<json>'`
 * runs the {@linkcode Scenario} given as JSON and prints its
 * {@linkcode ScenarioResult} as one line of JSON. `bench/run.ts` starts these
 * processes so every measurement has a fresh heap and its own peak memory.
 *
 * @module
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import type { Driver } from "../driver.ts";
import { type Lease, Outbox } from "../mod.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { median } from "./table.ts";

/** Which driver a database is opened with. */
export type DriverName = "wasm" | "node";

/** One database of a scenario. */
export interface Target {
  readonly driver: DriverName;
  /** A file path, or `":memory:"`. */
  readonly path: string;
  /** Both drivers share WAL across connections (the `-shm` index). */
  readonly journalMode: "truncate" | "delete" | "persist" | "wal";
  readonly synchronous: "off" | "normal" | "full";
  /** `PRAGMA page_size` for a new database; each build's default when absent. */
  readonly pageSize?: number;
}

/** One table of a `claimCost` scenario. */
export interface ClaimCostTable {
  readonly target: Target;
  readonly pending: number;
  readonly done: number;
}

/** What one process measures. */
export type Scenario =
  | {
    /**
     * Claim+acknowledge cycles (`max` absent) or batches of `claim({ max })`
     * plus one batch acknowledge, on each target in turn: `blocks` timed
     * blocks of `units` each, alternating which target goes first, so
     * drifting machine load falls on both alike.
     */
    readonly kind: "pair";
    readonly targets: readonly Target[];
    readonly max?: number;
    /**
     * With `max`, per target: whether each unit acknowledges the previous
     * unit's leases and claims the next batch in one `acknowledgeAndClaim`
     * transaction rather than a claim and an acknowledge.
     */
    readonly fold?: readonly boolean[];
    readonly warmup: number;
    readonly blocks: number;
    readonly units: number;
  }
  | {
    /**
     * Per-claim time on each of `tables`, which has `pending` events queued
     * behind `done` finished ones, all in this process: `blocks` rounds,
     * each timing `claims` claims (each acknowledged, untimed) on every
     * table in turn, starting with a different one each round, so drifting
     * machine load falls on all alike.
     */
    readonly kind: "claimCost";
    readonly tables: readonly ClaimCostTable[];
    readonly blocks: number;
    readonly claims: number;
  }
  | {
    /** Creates the schema and `pending` events for contend workers. */
    readonly kind: "seed";
    readonly target: Target;
    readonly pending: number;
  }
  | {
    /**
     * One of several contending workers on a database prepared by `seed`.
     * Once open, it writes `ready-<worker>` into the `barrier` directory and
     * runs up to `warmupCycles` cycles, warming its JIT, until `go` appears
     * there holding the start time (epoch ms). From then time is cut into
     * `phases` phases of `phaseMs`: in even phases only worker 0 runs
     * claim+acknowledge, in odd ones every worker does. Reports the cycles
     * it finished in each phase.
     */
    readonly kind: "contend";
    readonly target: Target;
    readonly worker: number;
    readonly barrier: string;
    readonly warmupCycles: number;
    readonly phaseMs: number;
    readonly phases: number;
  };

/** Events (or claims) per second of one target, with how they were timed. */
export interface Measurement {
  /** Operations done in the timed part: events for `pair`, claims for `claimCost`. */
  readonly operations: number;
  /** Length of the timed part, in milliseconds. */
  readonly elapsedMs: number;
  /** Median time of one block (`pair`) or one claim (`claimCost`), in milliseconds. */
  readonly medianMs: number;
}

/** What one process reports. */
export interface ScenarioResult {
  /** One measurement per target (`pair`), or one. */
  readonly measurements: readonly Measurement[];
  /**
   * Median over blocks of the first target's rate over the second's
   * (`pair`): the second's block time over the first's.
   */
  readonly medianRatio?: number;
  /**
   * Per table (`claimCost`), the median over rounds of its median claim
   * time over the first table's in the same round.
   */
  readonly medianRatios?: readonly number[];
  /** Peak resident set size of the process (`VmHWM`), in bytes. */
  readonly peakRssBytes: number;
  /** Time spent building databases and warming up, in milliseconds. */
  readonly setupMs: number;
}

async function open(target: Target): Promise<Outbox> {
  const { path, journalMode, synchronous } = target;
  const driver: Driver = target.driver === "wasm"
    ? await openSqliteWasm(path, { journalMode, synchronous })
    : await openNodeSqlite(path, { journalMode, synchronous });
  if (target.pageSize !== undefined) {
    await driver.exec(`PRAGMA page_size = ${target.pageSize}`);
  }
  // Leases far longer than any run, so no lease lapses while timing; a busy
  // timeout far longer than any wait, so contention shows as time, not errors.
  return await Outbox.open(driver, {
    leaseMs: 3_600_000,
    busyTimeoutMs: 60_000,
  });
}

/**
 * Inserts `count` events of state `state` with SQL alone, so building a
 * million rows takes seconds, not a million enqueue() calls.
 */
// Numbers each fill statement, so the identities it writes are unique.
let fills = 0;

async function fill(
  outbox: Outbox,
  count: number,
  state: "pending" | "done",
  at: number,
): Promise<void> {
  const chunk = 100_000;
  for (let from = 0; from < count; from += chunk) {
    await outbox.transaction((tx) =>
      tx.run(
        `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
        INSERT INTO outbox_events
          (queue, state, payload, due_at, max_attempts, created_at, updated_at, done_at, identity)
        SELECT 'default', ?2, '{"n":' || i || '}', ?3, 5, ?3, ?3,
          CASE ?2 WHEN 'done' THEN ?3 END,
          printf('00000000-0000-7000-8%03x-%012x', ?4, i)
        FROM n`,
        [Math.min(chunk, count - from), state, at, fills++],
      )
    );
  }
}

/** Reads this process's peak resident set size from `/proc` (Linux). */
function peakRssBytes(): number {
  try {
    const status = Deno.readTextFileSync("/proc/self/status");
    const kb = /VmHWM:\s+(\d+) kB/.exec(status)?.[1];
    return kb === undefined ? 0 : Number(kb) * 1024;
  } catch {
    return 0;
  }
}

function sleepUntil(epochMs: number): Promise<void> {
  return new Promise((resolve) =>
    setTimeout(resolve, Math.max(0, epochMs - Date.now()))
  );
}

async function cycle(outbox: Outbox): Promise<number> {
  const lease = await outbox.claim();
  if (lease === null) throw new Error("Queue ran dry");
  if (!await outbox.acknowledge(lease)) throw new Error("Lost a lease");
  return 1;
}

async function batch(outbox: Outbox, max: number): Promise<number> {
  const leases = await outbox.claim({ max });
  if (leases.length < max) throw new Error("Queue ran dry");
  const acknowledged = await outbox.acknowledge(leases);
  if (!acknowledged.every(Boolean)) throw new Error("Lost a lease");
  return leases.length;
}

/**
 * A unit of batches folded into one transaction each: acknowledges the
 * leases `held` has of `outbox` (claiming the first batch alone) and claims
 * the next. Counts the events acknowledged, which equal those claimed.
 */
async function folded(
  held: Map<Outbox, Lease[]>,
  outbox: Outbox,
  max: number,
): Promise<number> {
  const previous = held.get(outbox) ?? await outbox.claim({ max });
  const { acknowledged, leases } = await outbox.acknowledgeAndClaim(
    previous,
    { max },
  );
  if (leases.length < max) throw new Error("Queue ran dry");
  if (!acknowledged.every(Boolean)) throw new Error("Lost a lease");
  held.set(outbox, leases);
  return previous.length;
}

/**
 * Runs one scenario in this process.
 *
 * @param scenario What to measure.
 * @returns The measurement.
 */
export async function runScenario(
  scenario: Scenario,
): Promise<ScenarioResult> {
  const setupStart = performance.now();
  let timedMs = 0;
  const past = Date.now() - 1_000;
  const measurements: Measurement[] = [];
  let medianRatio: number | undefined;
  let medianRatios: number[] | undefined;
  switch (scenario.kind) {
    case "seed": {
      await using outbox = await open(scenario.target);
      await fill(outbox, scenario.pending, "pending", past);
      break;
    }
    case "pair": {
      const { max, warmup, blocks, units, fold } = scenario;
      const held = new Map<Outbox, Lease[]>();
      // Each target's unit of work.
      const unitOf = scenario.targets.map((_, i) =>
        max === undefined
          ? cycle
          : fold?.[i]
          ? (outbox: Outbox) => folded(held, outbox, max)
          : (outbox: Outbox) => batch(outbox, max)
      );
      const outboxes = await Promise.all(scenario.targets.map(open));
      try {
        for (const [i, outbox] of outboxes.entries()) {
          // A folded run claims one batch ahead of what it acknowledges.
          await fill(
            outbox,
            (max ?? 1) * (warmup + blocks * units + (fold?.[i] ? 2 : 0)),
            "pending",
            past,
          );
          for (let w = 0; w < warmup; w++) await unitOf[i]!(outbox);
        }
        const times = outboxes.map((): number[] => []);
        const operations = outboxes.map(() => 0);
        for (let b = 0; b < blocks; b++) {
          for (let k = 0; k < outboxes.length; k++) {
            const i = (b + k) % outboxes.length;
            const start = performance.now();
            for (let u = 0; u < units; u++) {
              operations[i]! += await unitOf[i]!(outboxes[i]!);
            }
            times[i]!.push(performance.now() - start);
          }
        }
        for (const [i, blockTimes] of times.entries()) {
          const elapsedMs = blockTimes.reduce((a, b) => a + b, 0);
          timedMs += elapsedMs;
          measurements.push({
            operations: operations[i]!,
            elapsedMs,
            medianMs: median(blockTimes),
          });
        }
        if (times.length === 2) {
          medianRatio = median(times[0]!.map((t, b) => times[1]![b]! / t));
        }
      } finally {
        for (const outbox of outboxes) await outbox.close();
      }
      break;
    }
    case "claimCost": {
      const { tables, blocks, claims } = scenario;
      const outboxes = await Promise.all(
        tables.map(({ target }) => open(target)),
      );
      try {
        // Topped up so that at least `pending` remain queued while timing.
        const warmup = 50;
        for (const [i, { pending, done }] of tables.entries()) {
          const outbox = outboxes[i]!;
          await fill(outbox, done, "done", past - 1_000);
          await fill(
            outbox,
            pending + warmup + blocks * claims,
            "pending",
            past,
          );
          // Warm the page cache and the JIT, as a long-running worker would be.
          for (let w = 0; w < warmup; w++) await cycle(outbox);
        }
        const times = tables.map((): number[] => []);
        const ratios = tables.map((): number[] => []);
        for (let b = 0; b < blocks; b++) {
          const medians: number[] = [];
          for (let k = 0; k < tables.length; k++) {
            const i = (b + k) % tables.length;
            const blockTimes: number[] = [];
            for (let c = 0; c < claims; c++) {
              const start = performance.now();
              const lease = await outboxes[i]!.claim();
              blockTimes.push(performance.now() - start);
              if (lease === null) throw new Error("Queue ran dry");
              await outboxes[i]!.acknowledge(lease);
            }
            times[i]!.push(...blockTimes);
            medians[i] = median(blockTimes);
          }
          for (const [i, ms] of medians.entries()) {
            ratios[i]!.push(ms / medians[0]!);
          }
        }
        for (const claimTimes of times) {
          const elapsedMs = claimTimes.reduce((a, b) => a + b, 0);
          timedMs += elapsedMs;
          measurements.push({
            operations: claimTimes.length,
            elapsedMs,
            medianMs: median(claimTimes),
          });
        }
        medianRatios = ratios.map(median);
      } finally {
        for (const outbox of outboxes) await outbox.close();
      }
      break;
    }
    case "contend": {
      await using outbox = await open(scenario.target);
      const { worker, barrier, warmupCycles, phaseMs, phases } = scenario;
      Deno.writeTextFileSync(join(barrier, `ready-${worker}`), "");
      // Warm: a cold JIT (and WASM's tier-up, compiled on the same two
      // cores by every process at once) would be measured as contention.
      // Counted, not timed: the wait for the slowest process to start is
      // unbounded, and on a fast disk cycles run until then would empty the
      // queue the phases need.
      for (let warmed = 0; !existsSync(join(barrier, "go"));) {
        if (warmed++ < warmupCycles) await cycle(outbox);
        else await new Promise((resolve) => setTimeout(resolve, 10));
      }
      const startAt = Number(Deno.readTextFileSync(join(barrier, "go")));
      await sleepUntil(startAt);
      const start = performance.now();
      for (let phase = 0; phase < phases; phase++) {
        const end = startAt + (phase + 1) * phaseMs;
        let operations = 0;
        if (phase % 2 === 1 || worker === 0) {
          while (Date.now() < end) operations += await cycle(outbox);
        }
        measurements.push({
          operations,
          elapsedMs: phaseMs,
          medianMs: phaseMs,
        });
        await sleepUntil(end);
      }
      timedMs = performance.now() - start;
      break;
    }
  }
  return {
    measurements,
    ...(medianRatio === undefined ? {} : { medianRatio }),
    ...(medianRatios === undefined ? {} : { medianRatios }),
    peakRssBytes: peakRssBytes(),
    setupMs: performance.now() - setupStart - timedMs,
  };
}

if (import.meta.main) {
  const scenario = JSON.parse(Deno.args[0] ?? "") as Scenario;
  console.log(JSON.stringify(await runScenario(scenario)));
}
