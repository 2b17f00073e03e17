import assert from "node:assert/strict";
import { runBenchSmoke } from "./helpers.ts";

Deno.test("deno task bench runs every scenario and prints the table and its JSON", async () => {
  const { tableLines, rows, smoke } = await runBenchSmoke("run.ts");
  assert.equal(smoke, true);
  assert.equal(tableLines.length, 2 + rows.length);
  assert.equal(rows.length, 11);
  for (const row of rows) {
    assert.ok(Number.isFinite(row.value) && row.value > 0, row.name);
    assert.ok(
      Number.isFinite(row.anchorValue) && row.anchorValue > 0,
      row.name,
    );
  }
});
