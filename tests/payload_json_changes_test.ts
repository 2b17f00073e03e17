/** Payloads JSON would silently change are refused before any SQL. */
import assert from "node:assert/strict";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

Deno.test("enqueue() refuses -0, which JSON gives back as 0, nested or at the top", async () => {
  await using outbox = await Outbox.open(await openSqliteWasm(":memory:"));
  await assert.rejects(
    outbox.enqueue({ x: -0 }),
    (error) =>
      error instanceof TypeError &&
      error.message.includes("'payload.x' must be JSON data") &&
      error.message.endsWith("current value is -0"),
  );
  await assert.rejects(outbox.enqueue(-0), TypeError);
  await assert.rejects(outbox.enqueue([1, -0]), TypeError);
  assert.equal((await outbox.stats()).pending, 0);
  // 0 itself is fine.
  await outbox.enqueue({ x: 0 });
  assert.equal((await outbox.stats()).pending, 1);
});

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
