/**
 * Alternating blocks: two sides of a comparison timed in turn, in the same
 * process, so drifting machine load falls on both alike.
 *
 * @module
 */
import { median } from "./table.ts";

/** One side of a comparison. */
export interface Side {
  /** Untimed work before each block (e.g. queueing what the block drains). */
  prepare?(): Promise<void>;
  /** Does one timed block; resolves to how many events it handled. */
  block(): Promise<number>;
}

/** What {@linkcode alternate} measured. */
export interface Alternated {
  /** Events per second of the first side, over all its blocks. */
  readonly value: number;
  /** Events per second of the second side, over all its blocks. */
  readonly anchorValue: number;
  /** Median over blocks of the first side's rate over the second's. */
  readonly ratio: number;
}

/**
 * Runs `warmup` untimed blocks of each side, then `blocks` timed blocks of
 * each, the first side going first in even blocks and second in odd ones.
 *
 * @param ours The measured side.
 * @param theirs The anchor.
 * @param warmup Untimed blocks per side.
 * @param blocks Timed blocks per side.
 * @returns Both rates and the median of the per-block ratios.
 */
export async function alternate(
  ours: Side,
  theirs: Side,
  warmup: number,
  blocks: number,
): Promise<Alternated> {
  const { values, ratios } = await alternateAll([ours, theirs], warmup, blocks);
  return { value: values[0]!, anchorValue: values[1]!, ratio: ratios[0]! };
}

/** What {@linkcode alternateAll} measured. */
export interface AlternatedAll {
  /** Events per second of each side, over all its blocks. */
  readonly values: number[];
  /**
   * For each side after the first, the median over blocks of the first
   * side's rate over that side's (`ratios[0]` is side 1's).
   */
  readonly ratios: number[];
  /** Each side's events per second in each timed block, in block order. */
  readonly blockRates: number[][];
}

/**
 * {@linkcode alternate} for more than two sides: `warmup` untimed blocks of
 * each, then `blocks` timed blocks of each, the order rotating by one side
 * per block.
 *
 * @param sides The measured side first, then its anchors.
 * @param warmup Untimed blocks per side.
 * @param blocks Timed blocks per side.
 * @returns Each side's rate and the first side's ratio to each other.
 */
export async function alternateAll(
  sides: readonly Side[],
  warmup: number,
  blocks: number,
): Promise<AlternatedAll> {
  const time = async (side: Side) => {
    await side.prepare?.();
    const started = performance.now();
    const events = await side.block();
    return { events, ms: performance.now() - started };
  };
  for (let i = 0; i < warmup; i++) {
    for (const side of sides) await time(side);
  }
  const totals = sides.map(() => ({ events: 0, ms: 0 }));
  const ratios: number[][] = sides.slice(1).map(() => []);
  const blockRates: number[][] = sides.map(() => []);
  for (let b = 0; b < blocks; b++) {
    const rates: number[] = [];
    for (let k = 0; k < sides.length; k++) {
      const i = (b + k) % sides.length;
      const { events, ms } = await time(sides[i]!);
      totals[i]!.events += events;
      totals[i]!.ms += ms;
      rates[i] = events / ms;
      blockRates[i]![b] = events / ms * 1000;
    }
    for (let i = 1; i < sides.length; i++) {
      ratios[i - 1]!.push(rates[0]! / rates[i]!);
    }
  }
  return {
    values: totals.map(({ events, ms }) => events / (ms / 1000)),
    ratios: ratios.map(median),
    blockRates,
  };
}
