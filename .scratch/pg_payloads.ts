import assert from "node:assert/strict";
import { openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
const server = await sharedPostgres();
const payloads: unknown[] = [
  "plain", "", "\u0000", { s: "\u0000" }, { s: "\ud800" }, "\ud800x", { "\u0000k": 1 }, 1e21, 5e-324, -1.5, [], {}, [null],
  { b: 1, a: 2, 10: 3, 2: 4 }, "\\", '"', "\u2028", "x".repeat(70000), { n: 0.1 + 0.2 }, 123456789012345680000, true, null,
  new Uint8Array([0, 1, 255]), new Uint8Array(0),
];
let bad = 0;
for (const mode of ["one", "batch", "batch-opts"]) {
  const schema = await server.createSchema();
  const o = await openPostgres(server.url, { schema });
  if (mode === "one") for (const p of payloads) await o.enqueue(p);
  else if (mode === "batch") await o.enqueueBatch(payloads.map((payload) => ({ payload })));
  else await o.enqueueBatch(payloads.map((payload, i) => ({ payload, dedupKey: `k${i}` })));
  const leases = await o.claim({ max: 100, leaseMs: 10000 });
  leases.sort((a, b) => a.eventId - b.eventId);
  for (const [i, l] of leases.entries()) {
    try { assert.deepStrictEqual(l.payload, payloads[i]); } catch { bad++; console.log(mode, i, "MISMATCH", JSON.stringify(payloads[i])?.slice(0, 60), "->", JSON.stringify(l.payload)?.slice(0, 60)); }
  }
  console.log(mode, "claimed", leases.length, "of", payloads.length);
  await o.close();
}
console.log("mismatches", bad);
Deno.exit(0);
