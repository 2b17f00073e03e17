/**
 * What flow control costs a claim (issue 40): a lone claim from a queue of
 * 100,000 pending events with a per-key limit and a rate limit set (keys
 * spread over 1,000 tenants, limits high enough never to hold a claim
 * back, so the bench times the mechanism and not the waiting), against the
 * same claim from a queue without them, in one file through the WASM
 * driver. Blocks alternate which side goes first; the ratio is the median
 * of three runs' medians over blocks (goal: at most 1.3).
 *
 * `--base <dir>` also times the claim without limits of the library in
 * `<dir>` (a checkout of the commit before flow control, for instance from
 * `git archive 858e8b7 | tar -x -C <dir>`) against this one's, each on a
 * file of its own: flow control must not slow the default claim.
 *
 * Run: `deno run -A bench/flow_bench.ts [--smoke] [--base <dir>]`.
 *
 * @module
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import type { Lease, Outbox } from "../mod.ts";
import type { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { alternate, type Side } from "./blocks.ts";
import { median } from "./table.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    smoke: { type: "boolean", default: false },
    base: { type: "string" },
    plain: { type: "string" },
    postgres: { type: "boolean", default: false },
  },
});
const EVENTS = values.smoke ? 2_000 : 100_000;
const CLAIMS = values.smoke ? 5 : 200;
const BLOCKS = values.smoke ? 2 : 10;
const RUNS = 3;

interface Lib {
  readonly Outbox: typeof Outbox;
  readonly openSqliteWasm: typeof openSqliteWasm;
}

/**
 * Loads the library in `dir` (imported on demand: two builds of the WASM
 * module cannot load in one process).
 */
async function load(dir: string): Promise<Lib> {
  return {
    Outbox: (await import(join(dir, "mod.ts"))).Outbox,
    openSqliteWasm:
      (await import(join(dir, "deno/sqlite_wasm.ts"))).openSqliteWasm,
  };
}
const HERE = new URL("..", import.meta.url).pathname;
type Opened = Outbox<unknown>;

async function fill(
  outbox: Opened,
  queue: string,
  keyed: boolean,
): Promise<void> {
  for (let start = 0; start < EVENTS; start += 10_000) {
    await outbox.enqueueBatch(
      Array.from({ length: Math.min(10_000, EVENTS - start) }, (_, i) => ({
        payload: { i: start + i },
        queue,
        ...keyed ? { concurrencyKey: `tenant-${(start + i) % 1_000}` } : {},
      })),
    );
  }
}

/** Timed lone claims from `queue`; the leases are acknowledged untimed. */
function claims(outbox: Opened, queue: string): Side {
  let held: Lease[] = [];
  return {
    async prepare() {
      if (held.length > 0) await outbox.acknowledge(held);
      held = [];
    },
    async block() {
      for (let i = 0; i < CLAIMS; i++) {
        const lease = await outbox.claim({ queue });
        if (lease === null) throw new Error(`${queue} ran dry`);
        held.push(lease);
      }
      return CLAIMS;
    },
  };
}

async function open(lib: Lib, dir: string, name: string): Promise<Opened> {
  return await lib.Outbox.open(await lib.openSqliteWasm(join(dir, name)));
}

/**
 * Runs this script with `--plain <lib>`: the library in `<lib>` fills a
 * file of its own and times lone claims without limits; resolves to the
 * median of its blocks' milliseconds per claim.
 */
async function plainChild(lib: string): Promise<number> {
  const { stdout, success } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL(import.meta.url).pathname,
      ...values.smoke ? ["--smoke"] : [],
      "--plain",
      lib,
    ],
    stderr: "inherit",
  }).output();
  if (!success) throw new Error(`the claim of ${lib} failed`);
  return Number(new TextDecoder().decode(stdout).trim());
}

if (values.plain !== undefined) {
  const lib = await load(values.plain);
  const dir = await Deno.makeTempDir({ prefix: "flow_bench_plain_" });
  try {
    const outbox = await open(lib, dir, "plain.db");
    await fill(outbox, "plain", false);
    const side = claims(outbox, "plain");
    const times: number[] = [];
    for (let b = 0; b < BLOCKS + 1; b++) {
      await side.prepare!();
      const started = performance.now();
      await side.block();
      if (b > 0) times.push((performance.now() - started) / CLAIMS);
    }
    await outbox.close();
    console.log(median(times));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  Deno.exit(0);
}

/**
 * The main comparison on one outbox: lone claims from the queue with both
 * limits over those from the queue without; the median of three runs.
 */
async function limitedOverPlain(outbox: Opened): Promise<number> {
  await fill(outbox, "plain", false);
  await fill(outbox, "limited", true);
  await outbox.setLimits("limited", { perKey: 1_000, perSecond: 1_000_000 });
  const ratios: number[] = [];
  for (let run = 0; run < RUNS; run++) {
    // Claims per second without limits over with them: the cost factor.
    const { ratio } = await alternate(
      claims(outbox, "plain"),
      claims(outbox, "limited"),
      1,
      BLOCKS,
    );
    ratios.push(ratio);
  }
  return median(ratios);
}

if (values.postgres) {
  // PostgreSQL: a claim from a queue with flow control is one statement,
  // as one from a queue without is (dialects/postgres_flow.ts claimGate).
  const { startPostgres } = await import("../scripts/postgres_server.ts");
  const { openPostgres } = await import("../drivers/postgres.ts");
  const server = await startPostgres();
  try {
    const outbox = await openPostgres(server.url, {
      listen: false,
      schema: await server.createSchema(),
    });
    const rows: Record<string, number> = {
      "postgres: claim with perKey and perSecond / without (median of 3)":
        await limitedOverPlain(outbox),
    };
    await outbox.close();
    if (values.base !== undefined) {
      // The PostgreSQL driver loads no WASM: both libraries run in this
      // process, each on a schema of its own, in alternating blocks.
      const base = await import(join(values.base, "drivers/postgres.ts"));
      const before: Opened = await base.openPostgres(server.url, {
        listen: false,
        schema: await server.createSchema(),
      });
      const after = await openPostgres(server.url, {
        listen: false,
        schema: await server.createSchema(),
      });
      await fill(before, "plain", false);
      await fill(after, "plain", false);
      const speeds: number[] = [];
      for (let run = 0; run < RUNS; run++) {
        const { ratio } = await alternate(
          claims(after, "plain"),
          claims(before, "plain"),
          1,
          BLOCKS,
        );
        speeds.push(ratio);
      }
      await before.close();
      await after.close();
      rows[
        "postgres: default claim, this library's speed / the base's (median of 3)"
      ] = median(speeds);
    }
    for (const [name, value] of Object.entries(rows)) {
      console.log(`${name}: ${value.toFixed(3)}`);
    }
    console.log(JSON.stringify({ events: EVENTS, claims: CLAIMS, ...rows }));
  } finally {
    await server.stop();
  }
  Deno.exit(0);
}

const dir = await Deno.makeTempDir({ prefix: "flow_bench_" });
try {
  const outbox = await open(await load(HERE), dir, "flow.db");
  const ratio = await limitedOverPlain(outbox);
  await outbox.close();
  const rows: Record<string, number> = {
    "claim with perKey and perSecond / without (median of 3)": ratio,
  };
  if (values.base !== undefined) {
    // Two builds of the WASM module cannot load in one process: each
    // library times its default claim in a child process of its own, the
    // two taking turns, three times.
    const speeds: number[] = [];
    for (let run = 0; run < RUNS; run++) {
      const after = await plainChild(HERE);
      const before = await plainChild(values.base);
      speeds.push(before / after);
    }
    rows["default claim, this library's speed / the base's (median of 3)"] =
      median(speeds);
  }
  for (const [name, value] of Object.entries(rows)) {
    console.log(`${name}: ${value.toFixed(3)}`);
  }
  console.log(JSON.stringify({ events: EVENTS, claims: CLAIMS, ...rows }));
} finally {
  await Deno.remove(dir, { recursive: true });
}
