// Differential: bursts of calls made at once (not awaited one by one) on
// one outbox must answer as the same calls awaited one by one in call order
// (the runner's line and group commit keep call order). Manual clock.
import { Outbox, type Lease } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { ManualClock } from "../tests/helpers.ts";

type Op =
  | { k: "enqueue"; key: string | null }
  | { k: "claim"; ms: number }
  | { k: "claimBatch"; max: number }
  | { k: "ack" | "release" | "renew"; i: number }
  | { k: "ackBatch"; is: number[] }
  | { k: "ackClaim"; is: number[]; max: number }
  | { k: "tick"; ms: number };

function rng(seed: number) { return () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; }; }

function gen(seed: number, n: number): Op[][] {
  const r = rng(seed); const bursts: Op[][] = [];
  const pick = () => Math.floor(r() * 12);
  for (let b = 0; b < n; b++) {
    const burst: Op[] = [];
    const len = 1 + Math.floor(r() * 6);
    for (let j = 0; j < len; j++) {
      const x = r();
      if (x < 0.2) burst.push({ k: "enqueue", key: r() < 0.3 ? `o${Math.floor(r() * 2)}` : null });
      else if (x < 0.35) burst.push({ k: "claim", ms: 50 + Math.floor(r() * 100) });
      else if (x < 0.42) burst.push({ k: "claimBatch", max: 1 + Math.floor(r() * 3) });
      else if (x < 0.57) burst.push({ k: "ack", i: pick() });
      else if (x < 0.65) burst.push({ k: "release", i: pick() });
      else if (x < 0.73) burst.push({ k: "renew", i: pick() });
      else if (x < 0.8) burst.push({ k: "ackBatch", is: [pick(), pick()] });
      else if (x < 0.87) burst.push({ k: "ackClaim", is: [pick()], max: 2 });
      else burst.push({ k: "tick", ms: Math.floor(r() * 120) });
    }
    bursts.push(burst);
  }
  return bursts;
}

async function run(open: () => Promise<Outbox>, clock: ManualClock, bursts: Op[][], concurrent: boolean) {
  const o = await open();
  const leases: (Lease<unknown> | undefined)[] = [];
  const out: string[] = [];
  const lease = (i: number) => leases.length === 0 ? undefined : leases[i % leases.length];
  const show = (l: Lease<unknown> | null | undefined) => l ? `L(${l.eventId},f${l.fence})` : "null";
  for (const burst of bursts) {
    const calls: (() => Promise<string>)[] = [];
    for (const op of burst) {
      switch (op.k) {
        case "tick": calls.push(async () => { clock.advance(op.ms); return "tick"; }); break;
        case "enqueue": calls.push(async () => `e${(await o.enqueue({ n: 1 }, op.key ? { orderingKey: op.key } : {})).eventId}`); break;
        case "claim": calls.push(async () => { const l = await o.claim({ leaseMs: op.ms }); if (l) leases.push(l); return show(l); }); break;
        case "claimBatch": calls.push(async () => { const ls = await o.claim({ max: op.max, leaseMs: 100 }); leases.push(...ls); return ls.map(show).join(","); }); break;
        case "ack": calls.push(async () => { const l = lease(op.i); return l ? `a${await o.acknowledge(l)}` : "-"; }); break;
        case "release": calls.push(async () => { const l = lease(op.i); return l ? `r${await o.release(l, { delayMs: 10 })}` : "-"; }); break;
        case "renew": calls.push(async () => { const l = lease(op.i); return l ? `n${await o.renew(l, 100)}` : "-"; }); break;
        case "ackBatch": calls.push(async () => { const ls = op.is.map(lease).filter((x): x is Lease<unknown> => !!x); return ls.length ? `A${await o.acknowledge(ls)}` : "-"; }); break;
        case "ackClaim": calls.push(async () => { const ls = op.is.map(lease).filter((x): x is Lease<unknown> => !!x); if (!ls.length) return "-"; const res = await o.acknowledgeAndClaim(ls, { max: op.max, leaseMs: 100 }); leases.push(...res.leases); return `AC${res.acknowledged}/${res.leases.map(show).join(",")}`; }); break;
      }
    }
    // Ticks are not calls: apply them in order only between groups.
    if (concurrent) {
      // Lease-dependent ops resolve their lease at call time: start each synchronously in order.
      const results: Promise<string>[] = [];
      for (const [j, c] of calls.entries()) {
        if (burst[j]!.k === "tick" || ["ack","release","renew","ackBatch","ackClaim"].includes(burst[j]!.k)) { await Promise.all(results); }
        results.push(c());
      }
      out.push((await Promise.all(results)).join(" "));
    } else {
      const rs: string[] = [];
      for (const c of calls) rs.push(await c());
      out.push(rs.join(" "));
    }
  }
  const stats = await o.stats();
  out.push(JSON.stringify(stats));
  await o.close();
  return out;
}

let diffs = 0;
for (let seed = 1; seed <= Number(Deno.env.get("SEEDS") ?? 40); seed++) {
  const bursts = gen(seed, 30);
  for (const [name, opener] of [["wasm", () => openSqliteWasm(":memory:")], ["node", () => openNodeSqlite(":memory:")]] as const) {
    const c1 = new ManualClock(1_000_000), c2 = new ManualClock(1_000_000);
    const a = await run(async () => await Outbox.open(await opener(), { now: c1.now }), c1, bursts, true);
    const b = await run(async () => await Outbox.open(await opener(), { now: c2.now }), c2, bursts, false);
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) { diffs++; console.log(`${name} seed ${seed} burst ${i}:\n  concurrent ${a[i]}\n  sequential ${b[i]}\n  ops ${JSON.stringify(bursts[i])}`); break; }
  }
}
console.log("diffs", diffs);
