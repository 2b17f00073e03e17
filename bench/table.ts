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

/**
 * What a row must reach: its ratio at least `atLeast` (the row runs faster
 * than its anchor by that factor), at most `atMost` (a cost that may grow
 * only that much), and its own value at least `minValue`.
 */
export interface Goal {
  readonly atLeast?: number;
  readonly atMost?: number;
  readonly minValue?: number;
}

function figure(x: number): string {
  return Number.isInteger(x) ? x.toFixed(1) : String(x);
}

/**
 * A row's `goal` text and whether it is `met`.
 *
 * @param goal What the row must reach; `undefined` for a report row.
 * @param ratio The row's ratio to its anchor.
 * @param value The row's own value.
 * @returns `goal` ("report" without one) and `met` (`null` without one).
 */
export function judge(
  goal: Goal | undefined,
  ratio: number,
  value: number,
): { goal: string; met: boolean | null } {
  if (goal === undefined) return { goal: "report", met: null };
  const { atLeast, atMost, minValue } = goal;
  const parts: string[] = [];
  let met = true;
  if (minValue !== undefined) {
    parts.push(`value >= ${minValue}`);
    met &&= value >= minValue;
  }
  if (atLeast !== undefined) {
    parts.push(`>= ${figure(atLeast)}`);
    met &&= ratio >= atLeast;
  }
  if (atMost !== undefined) {
    parts.push(`<= ${figure(atMost)}`);
    met &&= ratio <= atMost;
  }
  return { goal: parts.join(", "), met };
}

/**
 * The goal a row's `goal` text states, as {@linkcode judge} writes it.
 *
 * @param text E.g. `">= 0.9"`, `"<= 1.3"`, `"value >= 50000, >= 0.85"`.
 * @returns The goal; `undefined` for `"report"`.
 * @throws {TypeError} When the text is not one {@linkcode judge} writes.
 */
export function parseGoal(text: string): Goal | undefined {
  if (text === "report") return undefined;
  const goal: { atLeast?: number; atMost?: number; minValue?: number } = {};
  for (const part of text.split(", ")) {
    const match = /^(value )?(>=|<=) ([\d.]+)$/.exec(part);
    if (match === null) throw new TypeError(`Not a goal: ${text}`);
    const figure = Number(match[3]);
    if (match[1] !== undefined) goal.minValue = figure;
    else if (match[2] === ">=") goal.atLeast = figure;
    else goal.atMost = figure;
  }
  return goal;
}
