// Concurrent workers on the real PostgreSQL: short leases lapse under
// handlers; acknowledge/renew/release race the expiry. Checks: at most one
// acknowledgement returns true per event, its fence is the event's last,
// and per ordering key no event is claimed before an earlier one of its
// key is done or dead.
import { openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
const server = await sharedPostgres();
const schema = await server.createSchema();
const WORKERS = Number(Deno.env.get("W") ?? 4), EVENTS = Number(Deno.env.get("N") ?? 300), KEYS = 8;
const producer = await openPostgres(server.url, { schema });
for (let i = 0; i < EVENTS; i++) {
  await producer.enqueue({ key: i % KEYS, seq: Math.floor(i / KEYS) }, { orderingKey: `k${i % KEYS}`, maxAttempts: 1000 } as never);
}
type Rec = { ev: number; key: number; seq: number; fence: number; claimedAt: number; ackStart?: number; ack?: boolean };
const recs: Rec[] = [];
const acks = new Map<number, Rec[]>();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let doneCount = 0;
const t0 = performance.now();
async function worker(w: number) {
  const o = await openPostgres(server.url, { schema });
  while (doneCount < EVENTS && performance.now() - t0 < 60_000) {
    const l = await o.claim({ leaseMs: Number(Deno.env.get("L") ?? 25) });
    if (l === null) { await sleep(2); continue; }
    const p = l.payload as { key: number; seq: number };
    const r: Rec = { ev: l.eventId, key: p.key, seq: p.seq, fence: l.fence, claimedAt: performance.now() };
    recs.push(r);
    await sleep(Math.random() * 40);
    const dice = Math.random();
    if (dice < 0.15) { await o.release(l, { delayMs: 0, error: "x" }); continue; }
    if (dice < 0.3) { await o.renew(l, 30); await sleep(Math.random() * 30); }
    r.ackStart = performance.now();
    r.ack = await o.acknowledge(l);
    if (r.ack) { doneCount++; (acks.get(l.eventId) ?? acks.set(l.eventId, []).get(l.eventId)!).push(r); }
  }
  await o.close();
}
await Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));
const problems: string[] = [];
for (const [ev, rs] of acks) if (rs.length > 1) problems.push(`event ${ev} acknowledged true ${rs.length} times`);
for (const [ev, rs] of acks) {
  const maxFence = Math.max(...recs.filter((r) => r.ev === ev).map((r) => r.fence));
  if (rs[0]!.fence !== maxFence) problems.push(`event ${ev} acked by fence ${rs[0]!.fence}, later claimed fence ${maxFence}`);
}
// per-key FIFO: a claim of seq j returned before the successful ack of seq i<j started
for (const r of recs) {
  for (const [, rs] of acks) {
    const a = rs[0]!;
    if (a.key === r.key && a.seq < r.seq && r.claimedAt < a.ackStart!) problems.push(`key ${r.key}: seq ${r.seq} claimed before seq ${a.seq} acked`);
  }
}
console.log(`events ${EVENTS} acked ${acks.size} claims ${recs.length} stale acks ${recs.filter((r) => r.ack === false).length} problems ${problems.length}`);
for (const p of problems.slice(0, 20)) console.log(p);
await producer.close();
Deno.exit(0);
