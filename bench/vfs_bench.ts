/**
 * `deno run -A bench/vfs_bench.ts [--cycles N] [--blocks N] [--page-size N]`
 *
 * Durable claim+acknowledge cycles per second of the SQLite WASM build on
 * the Deno file VFS next to native `node:sqlite`, on files, at the same
 * `journal_mode` and `synchronous=FULL`, for every journal mode the VFS
 * offers. Blocks of cycles alternate between the two drivers (and which goes
 * first), so the disk's fsync jitter and drifting load fall on both alike;
 * the ratio is the median of the per-block ratios. Both files use the same
 * page size (native's 4096 unless `--page-size` says otherwise), so the
 * ratio measures the VFS and the WASM engine, not the page size.
 *
 * @module
 */
import { join } from "node:path";
import type { Driver } from "../driver.ts";
import { Outbox } from "../mod.ts";
import { openNodeSqlite } from "../node_sqlite.ts";
import { type JournalMode, openSqliteWasm } from "../sqlite_wasm_deno.ts";

function flag(name: string, fallback: number): number {
  const index = Deno.args.indexOf(name);
  return index >= 0 ? Number(Deno.args[index + 1]) : fallback;
}

const CYCLES = flag("--cycles", 40);
const BLOCKS = flag("--blocks", 8);
const PAGE_SIZE = flag("--page-size", 4096);
const MODES: readonly JournalMode[] = ["truncate", "delete", "persist", "wal"];

type Kind = "wasm" | "native";

async function open(kind: Kind, path: string, journalMode: JournalMode) {
  let driver: Driver;
  if (kind === "wasm") {
    // The page size must be set before the file can enter WAL mode.
    const setup = await openSqliteWasm(path);
    await setup.exec(`PRAGMA page_size=${PAGE_SIZE}; VACUUM`);
    await setup.close();
    driver = await openSqliteWasm(path, { journalMode, synchronous: "full" });
  } else {
    driver = await openNodeSqlite(path, {
      journalMode: "delete",
      synchronous: "full",
    });
    await driver.exec(`PRAGMA page_size=${PAGE_SIZE}; VACUUM`);
    // Same locking as the WASM build's only WAL mode: one exclusive connection.
    if (journalMode === "wal") {
      await driver.exec("PRAGMA locking_mode=EXCLUSIVE");
    }
    await driver.query(`PRAGMA journal_mode=${journalMode}`);
  }
  const outbox = await Outbox.open(driver);
  const events = CYCLES * (BLOCKS + 1);
  for (let done = 0; done < events; done += 500) {
    await outbox.transaction(async (tx) => {
      for (let i = done; i < Math.min(events, done + 500); i++) {
        await tx.enqueue({ order: i, body: "x".repeat(200) });
      }
    });
  }
  return outbox;
}

async function cycles(outbox: Outbox, count: number): Promise<number> {
  const started = performance.now();
  for (let i = 0; i < count; i++) {
    const lease = await outbox.claim();
    if (lease === null || !(await outbox.acknowledge(lease))) {
      throw new Error("the benchmark ran out of events");
    }
  }
  return count / ((performance.now() - started) / 1000);
}

const median = (values: number[]): number => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2
    ? sorted[middle]!
    : (sorted[middle - 1]! + sorted[middle]!) / 2;
};

const dir = await Deno.makeTempDir({ prefix: "vfs_bench_" });
const rows = [];
try {
  for (const journalMode of MODES) {
    await using wasm = await open(
      "wasm",
      join(dir, `wasm_${journalMode}.db`),
      journalMode,
    );
    await using native = await open(
      "native",
      join(dir, `native_${journalMode}.db`),
      journalMode,
    );
    await cycles(wasm, CYCLES / 4);
    await cycles(native, CYCLES / 4);
    const rates: Record<Kind, number[]> = { wasm: [], native: [] };
    for (let block = 0; block < BLOCKS; block++) {
      const order: Kind[] = block % 2 ? ["native", "wasm"] : ["wasm", "native"];
      for (const kind of order) {
        rates[kind].push(await cycles(kind === "wasm" ? wasm : native, CYCLES));
      }
    }
    rows.push({
      journalMode,
      synchronous: "full",
      wasmCyclesPerSecond: Math.round(median(rates.wasm)),
      nativeCyclesPerSecond: Math.round(median(rates.native)),
      ratio: Number(
        median(rates.wasm.map((rate, i) => rate / rates.native[i]!)).toFixed(2),
      ),
    });
  }
} finally {
  await Deno.remove(dir, { recursive: true });
}

console.log(
  `Durable claim+acknowledge cycles/s on files, page_size ${PAGE_SIZE}, ${BLOCKS} alternating blocks of ${CYCLES}`,
);
console.log(
  "| journal_mode | synchronous | WASM + Deno file VFS | native node:sqlite | ratio |",
);
console.log("|---|---|---:|---:|---:|");
for (const row of rows) {
  console.log(
    `| ${row.journalMode}${
      row.journalMode === "wal" ? " (locking_mode=EXCLUSIVE)" : ""
    } | ${row.synchronous} | ${row.wasmCyclesPerSecond} | ${row.nativeCyclesPerSecond} | ${row.ratio}x |`,
  );
}
console.log(JSON.stringify(rows));
