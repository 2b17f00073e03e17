// tx.run("SELECT 1; COMMIT") inside outbox.transaction(): a second statement
// that ends the transaction, behind a first that is not transaction control.
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
const server = await sharedPostgres();
const openers: [string, () => Promise<Outbox>][] = [
  ["wasm", async () => await Outbox.open(await openSqliteWasm(":memory:"))],
  ["node", async () => await Outbox.open(await openNodeSqlite(":memory:"))],
  ["postgres", async () => await openPostgres(server.url, { schema: await server.createSchema() })],
];
for (const [name, open] of openers) {
  for (const sql of ["SELECT 1; COMMIT", "SELECT 1; ROLLBACK", "CREATE TABLE IF NOT EXISTS x (a INTEGER); COMMIT; BEGIN"]) {
    const o = await open();
    let outcome: string;
    try {
      await o.transaction(async (tx) => {
        await tx.enqueue({ first: 1 });
        await tx.run(sql);
        await tx.enqueue({ second: 1 });
        throw new Error("rolled back on purpose");
      });
      outcome = "resolved";
    } catch (e) {
      outcome = `${(e as Error).name}: ${(e as Error).message.slice(0, 100)}`;
    }
    const pending = (await o.stats()).pending;
    console.log(`${name} | ${sql} | ${outcome} | pending after a rolled-back transaction: ${pending}`);
    await o.close();
  }
}
Deno.exit(0);
