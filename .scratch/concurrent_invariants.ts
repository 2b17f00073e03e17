// Bursts of calls made at once on one outbox, leases chosen from those
// known before the burst, so acknowledge/release/renew/acknowledgeAndClaim
// of the same lease race one another (and the group commit). Checks:
// per lease at most one ending call answers true; per event at most one
// acknowledgement true; done == events acknowledged; a claim answered
// after an acknowledgement resolved never returns that event again.
import { Outbox, type Lease } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { ManualClock } from "../tests/helpers.ts";

function rng(seed: number) { return () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; }; }
let problems = 0;
const report = (s: string) => { problems++; if (problems < 15) console.log(s); };
for (let seed = 1; seed <= Number(Deno.env.get("SEEDS") ?? 60); seed++) {
  for (const [name, opener] of [["wasm", () => openSqliteWasm(":memory:")], ["node", () => openNodeSqlite(":memory:")]] as const) {
    const r = rng(seed);
    const clock = new ManualClock(1_000_000);
    const o = await Outbox.open(await opener(), { now: clock.now });
    const leases: Lease<unknown>[] = [];
    const ended = new Map<string, string[]>(); // lease key -> true-answering enders
    const acked = new Map<number, number>(); // event -> count of ack true
    const doneAt = new Map<number, number>(); // event -> burst index its ack resolved in
    for (let b = 0; b < 40; b++) {
      const known = [...leases];
      const pick = () => known[Math.floor(r() * known.length)];
      const calls: Promise<void>[] = [];
      const len = 2 + Math.floor(r() * 8);
      const end = (l: Lease<unknown>, how: string) => { const k = `${l.eventId}/${l.fence}`; (ended.get(k) ?? ended.set(k, []).get(k)!).push(how); };
      const ack = (l: Lease<unknown>, how: string) => { end(l, how); acked.set(l.eventId, (acked.get(l.eventId) ?? 0) + 1); doneAt.set(l.eventId, b); };
      const claimedNow = (l: Lease<unknown>) => { const d = doneAt.get(l.eventId); if (d !== undefined && d < b) report(`${name} seed ${seed}: event ${l.eventId} acknowledged in burst ${d} claimed again in burst ${b} (fence ${l.fence})`); leases.push(l); };
      for (let j = 0; j < len; j++) {
        const x = r();
        const l = pick();
        if (x < 0.2) calls.push(o.enqueue({ j }, r() < 0.3 ? { orderingKey: "k" } : {}).then(() => {}));
        else if (x < 0.35) calls.push(o.claim({ leaseMs: 50 + Math.floor(r() * 100) }).then((l) => { if (l) claimedNow(l); }));
        else if (x < 0.42) calls.push(o.claim({ max: 3, leaseMs: 100 }).then((ls) => ls.forEach(claimedNow)));
        else if (!l) continue;
        else if (x < 0.55) calls.push(o.acknowledge(l).then((ok) => { if (ok) ack(l, "ack"); }));
        else if (x < 0.63) calls.push(o.release(l, { delayMs: 5 }).then((ok) => { if (ok) end(l, "release"); }));
        else if (x < 0.7) calls.push(o.renew(l, 100).then(() => {}));
        else if (x < 0.78) { const m = pick()!; calls.push(o.acknowledge([l, m]).then((oks) => { if (oks[0]) ack(l, "ackBatch"); if (oks[1]) ack(m, "ackBatch"); })); }
        else if (x < 0.86) calls.push(o.acknowledgeAndClaim([l], { max: 2, leaseMs: 100 }).then((res) => { if (res.acknowledged[0]) ack(l, "ackClaim"); res.leases.forEach(claimedNow); }));
        else clock.advance(Math.floor(r() * 80));
      }
      const settled = await Promise.allSettled(calls);
      for (const s of settled) if (s.status === "rejected") report(`${name} seed ${seed} burst ${b}: call rejected ${s.reason}`);
    }
    for (const [k, hows] of ended) if (hows.length > 1) report(`${name} seed ${seed}: lease ${k} ended true ${hows.length} times: ${hows}`);
    for (const [e, n] of acked) if (n > 1) report(`${name} seed ${seed}: event ${e} acknowledged true ${n} times`);
    const stats = await o.stats();
    if (stats.done !== acked.size) report(`${name} seed ${seed}: done ${stats.done} but ${acked.size} events acknowledged`);
    await o.close();
  }
}
console.log("problems", problems);
