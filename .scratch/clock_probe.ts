import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
for (const [name, now] of [["fractional", () => Date.now() + 0.5], ["NaN", () => NaN], ["backwards", (() => { let t = Date.now(); return () => (t -= 1000); })()], ["negative", () => -5], ["huge", () => 8.64e15 + 1]] as const) {
  try {
    const o = await Outbox.open(await openSqliteWasm(":memory:"), { now });
    const r = await o.enqueue({ a: 1 });
    const l = await o.claim({ leaseMs: 1000 });
    const ack = l ? await o.acknowledge(l) : null;
    console.log(name, "enqueued", r.eventId, "claimed", l?.leaseUntil, "ack", ack, JSON.stringify(await o.stats()));
    await o.close();
  } catch (e) { console.log(name, "THROWS", (e as Error).name, (e as Error).message.slice(0, 150)); }
}
