import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
const server = await sharedPostgres();
const id = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
const batches = {
  dedupTwice: [{ payload: 1, dedupKey: "k" }, { payload: 2, dedupKey: "k" }],
  identityTwice: [{ payload: 1, identity: id }, { payload: 2, identity: id }],
  identityThenDedupOther: [{ payload: 1, identity: id, dedupKey: "a" }, { payload: 2, identity: id, dedupKey: "b" }],
  dedupSameKeyOtherQueue: [{ payload: 1, dedupKey: "k", queue: "x" }, { payload: 2, dedupKey: "k", queue: "y" }],
  identitySameOtherQueue: [{ payload: 1, identity: id, queue: "x" }, { payload: 2, identity: id, queue: "y" }],
};
for (const [name, open] of [["wasm", async () => await Outbox.open(await openSqliteWasm(":memory:"))], ["postgres", async () => await openPostgres(server.url, { schema: await server.createSchema() })]] as const) {
  for (const [b, events] of Object.entries(batches)) {
    const o = await open();
    try {
      const r = await o.enqueueBatch(events as never);
      const s = await o.stats();
      console.log(name, b, JSON.stringify(r.map((x) => [x.eventId, x.deduplicated])), "pending", s.pending);
    } catch (e) { console.log(name, b, "THROWS", (e as Error).name, (e as Error).message.slice(0, 120)); }
    await o.close();
  }
}
Deno.exit(0);
