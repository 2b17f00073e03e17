// Contrast: the same wait on a second connection to the file throws BusyError.
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
const path = await Deno.makeTempFile({ suffix: ".db" });
await Deno.remove(path);
const a = await Outbox.open(await openSqliteWasm(path), { busyTimeoutMs: 100 });
const b = await Outbox.open(await openSqliteWasm(path), { busyTimeoutMs: 100 });
let release!: () => void;
const gate = new Promise<void>((r) => (release = r));
const tx = a.transaction(async (t) => { await t.enqueue({ a: 1 }); await gate; });
await new Promise((r) => setTimeout(r, 50));
const t0 = performance.now();
try { await b.enqueue({ b: 1 }); console.log("resolved"); } catch (e) { console.log((e as Error).name, "after", Math.round(performance.now() - t0), "ms"); }
release(); await tx; await a.close(); await b.close();
