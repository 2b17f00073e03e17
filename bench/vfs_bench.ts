/**
 * `deno task bench:vfs [--blocks N] [--units N]`: the durable
 * claim+acknowledge row of `deno task bench` (WASM file driver against
 * native node:sqlite, `synchronous=full`), once per journal mode the Deno
 * file VFS offers. Each mode runs as one `pair` scenario of
 * `bench/scenario.ts` in its own process, timed exactly as the main table's
 * row: alternating blocks, ratio = median of per-block ratios. Both drivers
 * keep their default page size (4096 for both on files).
 *
 * @module
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { runScenarioProcess } from "./run.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    blocks: { type: "string", default: "40" },
    units: { type: "string", default: "10" },
  },
});
const blocks = Number(values.blocks);
const units = Number(values.units);
const modes = ["truncate", "delete", "persist", "wal"] as const;

const dir = await Deno.makeTempDir({ prefix: "vfs_bench_" });
try {
  console.log(
    `Durable claim+acknowledge cycles/s on files, synchronous=full, ${blocks} alternating blocks of ${units}`,
  );
  console.log("| journal_mode | WASM + Deno file VFS | node:sqlite | ratio |");
  console.log("|---|---:|---:|---:|");
  for (const journalMode of modes) {
    const target = (driver: "wasm" | "node") => ({
      driver,
      path: join(dir, `${journalMode}-${driver}.db`),
      journalMode,
      synchronous: "full",
    } as const);
    const result = await runScenarioProcess({
      kind: "pair",
      targets: [target("wasm"), target("node")],
      warmup: 20,
      blocks,
      units,
    });
    const [wasm, node] = result.measurements.map((m) =>
      Math.round(m.operations / (m.elapsedMs / 1000))
    );
    console.log(
      `| ${journalMode} | ${wasm} | ${node} | ${
        result.medianRatio!.toFixed(2)
      }× |`,
    );
  }
} finally {
  await Deno.remove(dir, { recursive: true });
}
