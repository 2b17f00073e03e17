import assert from "node:assert/strict";
import { runBenchSmoke } from "./helpers.ts";

Deno.test("deno task bench runs every scenario and prints only the table and its JSON, with or without Chromium", async () => {
  // Without Chromium nothing about the browser may reach stdout, which is
  // the table and the JSON alone.
  const { tableLines, rows, smoke } = await runBenchSmoke("run.ts", {
    CHROMIUM_PATH: "/nonexistent/chromium",
  });
  assert.equal(smoke, true);
  assert.equal(tableLines.length, 2 + rows.length);
  assert.equal(rows.length, 89);
  for (const row of rows) {
    assert.ok(Number.isFinite(row.value) && row.value > 0, row.name);
    assert.ok(
      Number.isFinite(row.anchorValue) && row.anchorValue > 0,
      row.name,
    );
  }
});
