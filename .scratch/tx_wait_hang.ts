// A call that waits for a transaction on the same outbox whose fn waits
// for that call: does the call give up after busyTimeoutMs, or hang?
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
const outbox = await Outbox.open(await openSqliteWasm(":memory:"), { busyTimeoutMs: 200 });
let release!: () => void;
const gate = new Promise<void>((r) => (release = r));
const tx = outbox.transaction(async (t) => { await t.enqueue({ a: 1 }); await gate; });
const started = performance.now();
const timer = setTimeout(() => { console.log("HANG: enqueue still waiting after 3 s"); Deno.exit(1); }, 3000);
try {
  await outbox.enqueue({ b: 1 });
  console.log("enqueue resolved after", Math.round(performance.now() - started), "ms");
} catch (e) {
  console.log("enqueue rejected after", Math.round(performance.now() - started), "ms:", (e as Error).name, (e as Error).message.slice(0, 150));
}
clearTimeout(timer);
release();
await tx;
console.log((await outbox.stats()).pending);
await outbox.close();
