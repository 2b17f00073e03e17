/**
 * `deno task bench:browser`: claim+acknowledge cycles per second of the
 * browser outbox in headless Chromium (`opfs-sahpool`, called from a page
 * through the worker, as an app calls it) next to the WASM driver on a Deno
 * file (WAL, as the browser runs, and its default `journal_mode=TRUNCATE`,
 * both `synchronous=FULL`), measured in the same run in alternating blocks.
 * Prints the rows in the table format of
 * `bench/run.ts`, then as JSON. `--smoke` runs toy sizes.
 *
 * @module
 */
import { chromium, type Page } from "npm:playwright-core@1.65.1";
import { buildBrowser } from "../examples/browser/build.ts";
import { serveExample } from "../examples/browser/server.ts";
import { Outbox } from "../lease.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { type BenchRow, type Goal, judge, markdown, median } from "./table.ts";
import {
  CHROMIUM_ARGS,
  CHROMIUM_PATH,
  chromiumTmp,
} from "../tests/fixtures/browser/chromium.ts";

interface Sizes {
  readonly warmup: number;
  readonly blocks: number;
  readonly cycles: number;
}

const fixturesDir = new URL("../tests/fixtures/browser/", import.meta.url);

const FULL: Sizes = { warmup: 50, blocks: 5, cycles: 400 };
const SMOKE: Sizes = { warmup: 2, blocks: 1, cycles: 5 };

/** Cycles per second on the Deno file driver, one block. */
async function denoBlock(
  dir: string,
  block: number,
  journalMode: "truncate" | "wal",
  sizes: Sizes,
) {
  await using outbox = await Outbox.open(
    await openSqliteWasm(`${dir}/block-${block}-${journalMode}.db`, {
      journalMode,
    }),
  );
  for (let i = 0; i < sizes.warmup + sizes.cycles; i++) {
    await outbox.enqueue({ i });
  }
  for (let i = 0; i < sizes.warmup; i++) {
    await outbox.acknowledge((await outbox.claim())!);
  }
  const start = performance.now();
  for (let i = 0; i < sizes.cycles; i++) {
    await outbox.acknowledge((await outbox.claim())!);
  }
  return sizes.cycles / ((performance.now() - start) / 1000);
}

/** Cycles per second in the page, one block (a fresh database each). */
function browserBlock(
  page: Page,
  block: number,
  synchronous: string,
  sizes: Sizes,
): Promise<number> {
  return page.evaluate(async ({ name, synchronous, sizes }) => {
    const m = await import(["/build", "browser.js"].join("/"));
    const outbox = await m.openWorkerOutbox(name, { synchronous });
    for (let i = 0; i < sizes.warmup + sizes.cycles; i++) {
      await outbox.enqueue({ i });
    }
    for (let i = 0; i < sizes.warmup; i++) {
      await outbox.acknowledge(await outbox.claim());
    }
    const start = performance.now();
    for (let i = 0; i < sizes.cycles; i++) {
      await outbox.acknowledge(await outbox.claim());
    }
    const rate = sizes.cycles / ((performance.now() - start) / 1000);
    await outbox.close();
    return rate;
  }, { name: `bench-${synchronous}-${block}`, synchronous, sizes });
}

/** Each setting's rates, one per block: `truncate` and `wal` the Deno file's, `full` and `normal` the browser's. */
export type BrowserRates = Record<
  "truncate" | "wal" | "full" | "normal",
  readonly number[]
>;

/**
 * The browser rows from their blocks' rates. The goal (0.5 of the Deno file
 * driver) is read on the like-for-like row: the browser runs WAL (with an
 * exclusive lock, which opfs-sahpool holds) at `synchronous=FULL`, so its
 * anchor is the Deno file driver in WAL at FULL. Against the Deno driver's
 * default (truncate) and at `synchronous=NORMAL` the rows are reported.
 *
 * @param rates Each setting's rate per block.
 * @returns Three rows, the goal row first.
 */
export function browserRowsOf(rates: BrowserRates): BenchRow[] {
  const row = (
    synchronous: "full" | "normal",
    journalMode: "truncate" | "wal",
    goal: Goal | undefined,
  ): BenchRow => {
    const ratio = median(
      rates[synchronous].map((rate, i) => rate / rates[journalMode][i]!),
    );
    const value = median(rates[synchronous]);
    return {
      name: `claim+ack, Chromium opfs-sahpool via worker (wal, ${synchronous})`,
      value,
      unit: "cycles/s",
      anchor: `WASM driver, Deno file (${journalMode}, full)`,
      anchorValue: median(rates[journalMode]),
      ratio,
      ...judge(goal, ratio, value),
    };
  };
  return [
    row("full", "wal", { atLeast: 0.5 }),
    row("full", "truncate", undefined),
    row("normal", "wal", undefined),
  ];
}

/**
 * Measures the browser rows.
 *
 * @param smoke Toy sizes, to check that the script works.
 * @returns The rows of {@linkcode browserRowsOf}, measured in the same
 * blocks.
 */
export async function browserRows(smoke = false): Promise<BenchRow[]> {
  const sizes = smoke ? SMOKE : FULL;
  const dir = await Deno.makeTempDir({ prefix: "outbox_browser_bench_" });
  const buildDir = await buildBrowser(new URL(`file://${dir}/build/`));
  const server = serveExample({ buildDir, fixturesDir });
  // An on-disk profile: incognito OPFS is held in the browser process's
  // memory and would measure IPC rather than storage.
  await using tmp = await chromiumTmp();
  const context = await chromium.launchPersistentContext(`${dir}/profile`, {
    executablePath: CHROMIUM_PATH,
    args: [...CHROMIUM_ARGS],
    env: tmp.env,
  });
  try {
    const page = await context.newPage();
    await page.goto(`${server.url}fixtures/blank.html`);
    const rates = {
      truncate: [] as number[],
      wal: [] as number[],
      full: [] as number[],
      normal: [] as number[],
    };
    for (let block = 0; block < sizes.blocks; block++) {
      rates.truncate.push(await denoBlock(dir, block, "truncate", sizes));
      rates.wal.push(await denoBlock(dir, block, "wal", sizes));
      rates.full.push(await browserBlock(page, block, "full", sizes));
      rates.normal.push(await browserBlock(page, block, "normal", sizes));
    }
    return browserRowsOf(rates);
  } finally {
    await context.close();
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
}

if (import.meta.main) {
  const smoke = Deno.args.includes("--smoke");
  const rows = await browserRows(smoke);
  console.log(markdown(rows));
  console.log();
  console.log(JSON.stringify({
    deno: Deno.version.deno,
    chromium: CHROMIUM_PATH,
    smoke,
    cores: navigator.hardwareConcurrency,
    rows,
  }));
}
