/**
 * What the statement-variant benches (`postgres_variants.ts`,
 * `postgres_enqueue_variants.ts`) share: patching a statement's text,
 * a process's time on a core, rounds in alternating order, and
 * quartiles.
 *
 * @module
 */

/** `text` with each [from, to] replaced, each `from` required to occur. */
export function patched(text: string, ...edits: [string, string][]): string {
  for (const [from, to] of edits) {
    if (!text.includes(from)) throw new Error(`No ${from} in the statement`);
    text = text.replaceAll(from, to);
  }
  return text;
}

/** Process `pid`'s time on a core so far (`/proc/<pid>/schedstat`), in ms. */
export const onCoreMs = (pid: number): number =>
  Number(Deno.readTextFileSync(`/proc/${pid}/schedstat`).split(" ")[0]) / 1e6;

/**
 * `rounds` rounds of `measure` for each of `count` variants, in index order
 * in even rounds and reversed in odd ones, so drifting load falls on all
 * alike; each variant's measurements, by key, in round order.
 */
export async function alternateRounds<K extends string>(
  count: number,
  rounds: number,
  measure: (i: number) => Promise<Record<K, number>>,
): Promise<Record<K, number[]>[]> {
  const runs = Array.from({ length: count }, () => ({}) as Record<K, number[]>);
  for (let r = 0; r < rounds; r++) {
    const order = [...Array(count).keys()];
    if (r % 2 === 1) order.reverse();
    for (const i of order) {
      const m = await measure(i);
      for (const key of Object.keys(m) as K[]) {
        (runs[i]![key] ??= []).push(m[key]);
      }
    }
  }
  return runs;
}

/** The first quartile, the median and the third quartile of `values`. */
export function quartiles(values: number[]): [number, number, number] {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (f: number) => sorted[Math.floor((sorted.length - 1) * f)]!;
  return [at(0.25), at(0.5), at(0.75)];
}
