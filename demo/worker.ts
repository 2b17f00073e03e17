/**
 * The demo's worker process: delivers order events to the HTTP receiver
 * with {@linkcode processEvents}, until SIGTERM; then stops gracefully and
 * prints its counters as one JSON line.
 *
 * Usage: `deno run -A demo/worker.ts --db PATH|URL [--schema S] --url URL
 * --name w1 --lease-ms 1000 --concurrency 4`
 *
 * @module
 */
import { deliveryHeaders } from "../mod.ts";
import { processEvents } from "../worker.ts";
import { engineFromArgs, flag, intFlag, type OrderPlaced } from "./db.ts";

const args = Deno.args;
const engine = await engineFromArgs(args);
const url = flag(args, "url")!;
const name = flag(args, "name") ?? "worker";
const leaseMs = intFlag(args, "lease-ms", 1_000);

const outbox = await engine.openOutbox({ busyTimeoutMs: 60_000 }, name);
const processor = processEvents(outbox, async (lease, context) => {
  const order = lease.payload as OrderPlaced;
  // Checked right before the side effect: after a pause, timers run late.
  context.throwIfLost();
  const response = await fetch(url, {
    method: "POST",
    // The recipient dedupes on the identity; the fence orders attempts.
    headers: { "content-type": "application/json", ...deliveryHeaders(lease) },
    body: JSON.stringify(order),
    signal: context.signal,
  });
  await response.body?.cancel();
  if (!response.ok) throw new Error(`receiver answered ${response.status}`);
}, {
  concurrency: intFlag(args, "concurrency", 4),
  leaseMs,
  pollMinMs: 5,
  pollMaxMs: 100,
  backoffMinMs: 50,
  backoffMaxMs: 400,
  stopTimeoutMs: 5_000,
  onError: (error) =>
    console.error(
      `[${name}] ${error instanceof Error ? error.message : error}`,
    ),
});

Deno.addSignalListener("SIGTERM", async () => {
  await processor.stop();
  await outbox.close();
  console.log(JSON.stringify({ name, ...processor.counters }));
  Deno.exit(0);
});
