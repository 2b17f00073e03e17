/**
 * The overview's chart: events done and failed per minute, as stacked bars
 * in plain SVG (no script, so it renders with JavaScript off).
 *
 * @module
 */
import { type Html, html } from "./html.ts";

/** One minute of activity. */
export interface ActivityBucket {
  /** The minute's start, epoch milliseconds. */
  readonly at: number;
  /** Events acknowledged in it. */
  readonly done: number;
  /** Failed attempts in it: releases with an error, lapsed leases, dead letters. */
  readonly failed: number;
}

const WIDTH = 600;
const HEIGHT = 120;
const TOP = 10;
const BOTTOM = 16;

/** Stacked bars of `buckets`, oldest left, with the largest minute's count as scale. */
export function activityChart(buckets: readonly ActivityBucket[]): Html {
  const max = Math.max(1, ...buckets.map((b) => b.done + b.failed));
  const slot = WIDTH / Math.max(1, buckets.length);
  const plot = HEIGHT - TOP - BOTTOM;
  const bars = buckets.map((b, i) => {
    const x = (i * slot + 1).toFixed(1);
    const w = Math.max(1, slot - 2).toFixed(1);
    const done = (b.done / max) * plot;
    const failed = (b.failed / max) * plot;
    const base = HEIGHT - BOTTOM;
    const label = `${
      new Date(b.at).toISOString().slice(11, 16)
    }: ${b.done} done, ${b.failed} failed`;
    return html`
      <g>
        <title>${label}</title>
        <rect class="done" x="${x}" y="${(base - done).toFixed(1)}" width="${w}"
          height="${done.toFixed(1)}"></rect>
        <rect class="failed" x="${x}" y="${(base - done - failed).toFixed(
          1,
        )}" width="${w}"
          height="${failed.toFixed(1)}"></rect>
      </g>
    `;
  });
  const total = buckets.reduce((n, b) => n + b.done, 0);
  const failed = buckets.reduce((n, b) => n + b.failed, 0);
  return html`
    <figure class="chart">
      <svg viewBox="0 0 ${WIDTH} ${HEIGHT}" role="img"
        aria-label="${`${total} done and ${failed} failed in the last hour`}">${bars}<text x="0" y="${HEIGHT -
          2}">-60 min</text><text x="${WIDTH - 24}" y="${HEIGHT -
          2}">now</text><text x="0" y="9">${max}/min</text></svg>
      <figcaption
        class="muted">${total} done, ${failed} failed in the last hour (per minute; failed: a release with an error, or a lapsed lease)</figcaption>
    </figure>
  `;
}
