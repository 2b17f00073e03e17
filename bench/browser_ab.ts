/**
 * The browser row of `bench/browser_bench.ts` for two checkouts in one run:
 * `deno run -A --lock=deno.lock bench/browser_ab.ts <other checkout>
 * [--blocks 5] [--cycles 400]` builds this checkout's browser bundle and the
 * other's (with its own build script, into its `examples/browser/build/`), serves each from its own origin in one headless Chromium, and
 * measures in rotating blocks the Deno file driver (wal, full, this
 * checkout's) and each bundle's claim+ack (wal, full), so that the load of
 * a shared machine falls on all three alike. Prints each block's rates and
 * the median of each bundle's ratio to the Deno block of its round.
 *
 * @module
 */
import { chromium } from "npm:playwright-core@1.65.1";
import { serveExample } from "../examples/browser/server.ts";
import { buildBrowser } from "../examples/browser/build.ts";
import { Outbox } from "../lease.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { median } from "./table.ts";
import {
  CHROMIUM_ARGS,
  CHROMIUM_PATH,
} from "../tests/fixtures/browser/chromium.ts";

const other = Deno.args[0];
if (other === undefined || other.startsWith("--")) {
  throw new Error("usage: browser_ab.ts <other checkout> [--blocks N]");
}
const option = (name: string, fallback: number) => {
  const at = Deno.args.indexOf(name);
  return at === -1 ? fallback : Number(Deno.args[at + 1]);
};
const blocks = option("--blocks", 5);
const cycles = option("--cycles", 400);
const warmup = 50;
const synchronous = "full";

const dir = await Deno.makeTempDir({ prefix: "outbox_browser_ab_" });
const fixturesDir = new URL("../tests/fixtures/browser/", import.meta.url);

/**
 * Builds the other checkout's bundle with its own build script, into its
 * `examples/browser/build/`.
 */
async function buildOther(root: string): Promise<URL> {
  const { code, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--lock=deno.lock", "examples/browser/build.ts"],
    cwd: root,
    stdout: "null",
    stderr: "piped",
  }).output();
  if (code !== 0) throw new Error(new TextDecoder().decode(stderr));
  return new URL(`file://${root}/examples/browser/build/`);
}

const sides = [
  {
    name: "this",
    buildDir: await buildBrowser(new URL(`file://${dir}/this/`)),
  },
  { name: "other", buildDir: await buildOther(other) },
];
const servers = sides.map((side) =>
  serveExample({ buildDir: side.buildDir, fixturesDir })
);
const context = await chromium.launchPersistentContext(`${dir}/profile`, {
  executablePath: CHROMIUM_PATH,
  args: [...CHROMIUM_ARGS],
});

async function denoBlock(block: number): Promise<number> {
  await using outbox = await Outbox.open(
    await openSqliteWasm(`${dir}/deno-${block}.db`, { journalMode: "wal" }),
  );
  for (let i = 0; i < warmup + cycles; i++) await outbox.enqueue({ i });
  for (let i = 0; i < warmup; i++) {
    await outbox.acknowledge((await outbox.claim())!);
  }
  const start = performance.now();
  for (let i = 0; i < cycles; i++) {
    await outbox.acknowledge((await outbox.claim())!);
  }
  return cycles / ((performance.now() - start) / 1000);
}

// A page of its own per block, closed after it: with two pages open, the
// one opened first ran the same bundle 1.2-1.5x slower per call (a
// read-only call's round trip, this origin or the other first alike).
async function browserBlock(url: string, block: number): Promise<number> {
  const page = await context.newPage();
  await page.goto(`${url}fixtures/blank.html`);
  const rate = await page.evaluate(
    async ({ name, synchronous, warmup, cycles }) => {
      const m = await import(["/build", "browser.js"].join("/"));
      const outbox = await m.openWorkerOutbox(name, { synchronous });
      for (let i = 0; i < warmup + cycles; i++) await outbox.enqueue({ i });
      for (let i = 0; i < warmup; i++) {
        await outbox.acknowledge(await outbox.claim());
      }
      const start = performance.now();
      for (let i = 0; i < cycles; i++) {
        await outbox.acknowledge(await outbox.claim());
      }
      const rate = cycles / ((performance.now() - start) / 1000);
      await outbox.close();
      return rate;
    },
    { name: `ab-${block}`, synchronous, warmup, cycles },
  );
  await page.close();
  return rate;
}

try {
  const rates: Record<string, number[]> = { deno: [], this: [], other: [] };
  for (let block = 0; block < blocks; block++) {
    // Rotate the order so that no side always follows another.
    const steps = [
      ["deno", () => denoBlock(block)],
      ["this", () => browserBlock(servers[0]!.url, block)],
      ["other", () => browserBlock(servers[1]!.url, block)],
    ] as const;
    for (let k = 0; k < steps.length; k++) {
      const [name, run] = steps[(k + block) % steps.length]!;
      rates[name]!.push(await run());
    }
    console.log(
      `block ${block}: deno ${rates.deno![block]!.toFixed(0)}, this ${
        rates.this![block]!.toFixed(0)
      }, other ${rates.other![block]!.toFixed(0)} cycles/s`,
    );
  }
  const ratio = (name: string) =>
    median(rates[name]!.map((rate, i) => rate / rates.deno![i]!));
  console.log(JSON.stringify({
    this: { value: median(rates.this!), ratio: ratio("this") },
    other: { value: median(rates.other!), ratio: ratio("other") },
    deno: median(rates.deno!),
    thisOverOther: median(rates.this!.map((r, i) => r / rates.other![i]!)),
  }));
} finally {
  await context.close();
  for (const server of servers) await server.shutdown();
  await Deno.remove(dir, { recursive: true });
}
