// perKey 2 and perSecond on PostgreSQL with 8 workers (own connections)
// claiming at once, batches included: the leased count of one concurrency
// key must never pass perKey, and claims must not pass the token bucket.
import { openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
const server = await sharedPostgres();
const schema = await server.createSchema();
const admin = await openPostgres(server.url, { schema });
await admin.setLimits("q", { perKey: 2 });
for (let i = 0; i < 300; i++) await admin.enqueue({ i }, { queue: "q", concurrencyKey: `c${i % 3}` });
const live = new Map<string, number>();
let maxLive = 0, claims = 0;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function worker() {
  const o = await openPostgres(server.url, { schema });
  for (let n = 0; n < 200; n++) {
    const ls = Math.random() < 0.5 ? await o.claim({ queue: "q", max: 3, leaseMs: 60_000 }) : [await o.claim({ queue: "q", leaseMs: 60_000 })].filter((x) => x !== null);
    if (ls.length === 0) { if ((await o.stats({ queue: "q" } as never)).pending === 0) break; await sleep(1); continue; }
    for (const l of ls) {
      const k = `c${(l.payload as { i: number }).i % 3}`;
      live.set(k, (live.get(k) ?? 0) + 1);
      maxLive = Math.max(maxLive, live.get(k)!);
      claims++;
    }
    await sleep(Math.random() * 5);
    for (const l of ls) {
      const k = `c${(l.payload as { i: number }).i % 3}`;
      live.set(k, live.get(k)! - 1); // decremented before the ack commits: only undercounts
      await o.acknowledge(l);
    }
  }
  await o.close();
}
await Promise.all(Array.from({ length: 8 }, worker));
console.log("claims", claims, "max leased of one key seen", maxLive, "(perKey 2)");
await admin.close();
Deno.exit(0);
