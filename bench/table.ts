/**
 * The benchmark table: one row per measurement next to its anchor, printed
 * as markdown by `bench/run.ts` and `bench/browser_bench.ts`.
 *
 * @module
 */

/** The middle value of `values` (the mean of the two middle ones for an even count). */
export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1
    ? sorted[middle]!
    : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/** One line of the table. */
export interface BenchRow {
  readonly name: string;
  readonly value: number;
  readonly unit: string;
  readonly anchor: string;
  readonly anchorValue: number;
  /** `value / anchorValue`, or the median of per-block ratios where blocks alternate. */
  readonly ratio: number;
  /** The ratio the issue asks for, e.g. `">= 0.9"`; `value` for absolute goals. */
  readonly goal: string;
  readonly met: boolean | null;
}

function format(value: number): string {
  return value >= 100
    ? Math.round(value).toLocaleString("en-US")
    : value.toPrecision(3);
}

/**
 * Renders rows as a markdown table.
 *
 * @param rows The rows.
 * @returns The table, one line per row after the header.
 */
export function markdown(rows: readonly BenchRow[]): string {
  const lines = [
    "| measurement | value | anchor | anchor value | ratio | goal | met |",
    "|---|---:|---|---:|---:|---|---|",
  ];
  for (const row of rows) {
    lines.push(
      `| ${row.name} | ${format(row.value)} ${row.unit} | ${row.anchor} | ${
        format(row.anchorValue)
      } ${row.unit} | ${row.ratio.toFixed(2)}× | ${row.goal} | ${
        row.met === null ? "–" : row.met ? "yes" : "no"
      } |`,
    );
  }
  return lines.join("\n");
}
