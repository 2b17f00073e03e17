/** Payloads JSON would silently change are refused before any SQL. */
import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

Deno.test("enqueue() refuses an array with a named property, which JSON drops", async () => {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  const items: number[] & { total?: number } = [1, 2];
  items.total = 3;
  await assert.rejects(
    outbox.enqueue({ items }),
    (error) =>
      error instanceof TypeError &&
      error.message.includes("'payload.items' must be JSON data") &&
      error.message.includes("without named properties"),
  );
  assert.equal((await outbox.stats()).pending, 0);
});
