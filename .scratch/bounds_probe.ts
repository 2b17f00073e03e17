import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
const o = await Outbox.open(await openSqliteWasm(":memory:"));
const tryit = async (name: string, f: () => Promise<unknown>) => {
  try { console.log(name, "->", JSON.stringify(await f())); } catch (e) { console.log(name, "THROWS", (e as Error).name, (e as Error).message.slice(0, 140)); }
};
await tryit("enqueue delay MAX_SAFE", () => o.enqueue({ a: 1 }, { delayMs: Number.MAX_SAFE_INTEGER }));
await tryit("nextDueInMs", () => o.nextDueInMs());
await o.enqueue({ b: 1 });
const l = (await o.claim({ leaseMs: 1000 }))!;
await tryit("renew MAX_SAFE", () => o.renew(l, Number.MAX_SAFE_INTEGER));
await tryit("release delay MAX_SAFE", () => o.release(l, { delayMs: Number.MAX_SAFE_INTEGER }));
await tryit("stats", () => o.stats());
await o.enqueue({ c: 1 });
const l2 = (await o.claim({ leaseMs: 1000 }))!;
await tryit("ack [L,L]", () => o.acknowledge([l2, l2]));
await o.enqueue({ d: 1 });
const l3 = (await o.claim({ leaseMs: 1000 }))!;
await tryit("ack with tampered fence", () => o.acknowledge({ ...l3, fence: l3.fence + 1 }));
await tryit("ack with uppercase token", () => o.acknowledge({ ...l3, token: l3.token.toUpperCase() }));
await tryit("claim leaseMs MAX_SAFE", () => o.claim({ leaseMs: Number.MAX_SAFE_INTEGER }));
await tryit("ack l3", () => o.acknowledge(l3));
await tryit("explain 1", async () => (await o.explain(1))?.state);
await o.close();
