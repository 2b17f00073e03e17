// Two outboxes (or an outbox and an inbox) on one driver: a call on the second
// while the first's transaction(fn) does not end.
import { Inbox, Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
const driver = await openSqliteWasm(":memory:");
const a = await Outbox.open(driver, { busyTimeoutMs: 100 });
const b = await Outbox.open(driver, { busyTimeoutMs: 100 });
const inbox = await Inbox.open(driver, { busyTimeoutMs: 100 } as never);
let release!: () => void;
const gate = new Promise<void>((r) => (release = r));
const tx = a.transaction(async (t) => { await t.enqueue({ a: 1 }); await gate; });
for (const [name, call] of [["other outbox enqueue", () => b.enqueue({ b: 1 })], ["inbox accept", () => inbox.accept("0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe", 1, async () => {})]] as const) {
  const t0 = performance.now();
  const r = await Promise.race([call().then(() => "resolved", (e) => (e as Error).name), new Promise((r) => setTimeout(() => r("still waiting after 2 s"), 2000))]);
  console.log(name, "->", r, Math.round(performance.now() - t0), "ms");
}
release(); await tx;
Deno.exit(0);
