/**
 * What the processing loop's OpenTelemetry calls cost per handled event when
 * no SDK is installed (the API's no-op tracer and meter): the calls one event
 * makes (`handle`, which starts the span and runs the handler inside it, one
 * `count`, `end`) against calling the handler alone. Prints one JSON line.
 *
 * Usage: `deno run -A bench/telemetry_overhead.ts [events]`
 *
 * @module
 */
import type { Lease, Stats } from "../lease.ts";
import { ProcessorTelemetry } from "../telemetry.ts";
import { median } from "./table.ts";

const events = Number(Deno.args[0] ?? 200_000);
const rounds = 5;
const stats: Stats = {
  pending: 0,
  leased: 0,
  done: 0,
  dead: 0,
  oldestPendingAgeMs: 0,
};
const telemetry = new ProcessorTelemetry({
  closed: false,
  queue: "default",
  stats: () => Promise.resolve(stats),
}, undefined);
const lease: Lease<unknown> = {
  eventId: 1,
  identity: "01a22fcb-86df-735f-ad7b-ef664232ed59",
  queue: "default",
  token: "0123456789abcdef0123456789abcdef",
  fence: 1,
  attempt: 1,
  maxAttempts: 5,
  leaseUntil: 0,
  payload: null,
  orderingKey: null,
  lastError: null,
};
let sink = 0;
const handler = () => {
  sink++;
};

async function measure(instrumented: boolean): Promise<number> {
  const start = performance.now();
  for (let i = 0; i < events; i++) {
    const slot = {};
    if (instrumented) {
      telemetry.handle(slot, lease, handler);
      telemetry.count(slot, "acknowledged");
      telemetry.end(slot);
    } else {
      handler();
    }
    // The loop settles each event's promises before the next batch.
    if (i % 1_000 === 0) await Promise.resolve();
  }
  await new Promise((resolve) => setTimeout(resolve, 0));
  return (performance.now() - start) * 1e6 / events;
}

const samples = { bare: [] as number[], instrumented: [] as number[] };
for (let round = 0; round < rounds; round++) {
  samples.bare.push(await measure(false));
  samples.instrumented.push(await measure(true));
}
console.log(JSON.stringify({
  events,
  rounds,
  bareNsPerEvent: Math.round(median(samples.bare)),
  instrumentedNsPerEvent: Math.round(median(samples.instrumented)),
  overheadNsPerEvent: Math.round(
    median(samples.instrumented) - median(samples.bare),
  ),
  sink,
}));
