/**
 * Prints the medians of several runs of a bench script as the markdown
 * table of bench/README.md: each row's median value and anchor, every run's
 * ratio, the median ratio, and whether it meets the row's goal.
 *
 * ```sh
 * for i in 1 2 3; do deno run -A bench/loop_bench.ts | tail -1 > /tmp/run$i.json; done
 * deno run -A bench/medians.ts /tmp/run1.json /tmp/run2.json /tmp/run3.json
 * ```
 *
 * @module
 */
import { type BenchRow, judge, median, parseGoal } from "./table.ts";

/**
 * The table of medians over `runs`, rows matched by name and anchor.
 *
 * @param runs Each run's rows, as its JSON line holds them.
 * @returns The markdown table.
 */
export function mediansTable(runs: readonly (readonly BenchRow[])[]): string {
  const format = (value: number) =>
    value >= 100
      ? Math.round(value).toLocaleString("en-US")
      : value.toPrecision(3);
  const lines = [
    "| measurement | anchor | median value | median anchor | ratios of the runs | median ratio | goal | met |",
    "|---|---|---:|---:|---:|---:|---|---|",
  ];
  for (const row of runs[0] ?? []) {
    const same = runs.map((rows) =>
      rows.find((r) => r.name === row.name && r.anchor === row.anchor)!
    );
    const value = median(same.map((r) => r.value));
    const ratio = median(same.map((r) => r.ratio));
    const { goal, met } = judge(parseGoal(row.goal), ratio, value);
    lines.push(
      `| ${row.name} | ${row.anchor} | ${format(value)} ${row.unit} | ${
        format(median(same.map((r) => r.anchorValue)))
      } | ${same.map((r) => r.ratio.toFixed(2)).join(" / ")} | ${
        ratio.toFixed(2)
      }× | ${goal} | ${met === null ? "–" : met ? "yes" : "no"} |`,
    );
  }
  return lines.join("\n");
}

if (import.meta.main) {
  const runs = await Promise.all(
    Deno.args.map(async (path) =>
      (JSON.parse(await Deno.readTextFile(path)) as { rows: BenchRow[] }).rows
    ),
  );
  console.log(mediansTable(runs));
}
