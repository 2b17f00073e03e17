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
  // 89, then the loop rows with the 1 ms timer against the handler alone (2
  // more in each of 9 scenarios) and those with 1 ms on another thread (4 in
  // each of 4).
  assert.equal(rows.length, 89 + 2 * 9 + 4 * 4);
  for (const row of rows) {
    assert.ok(Number.isFinite(row.value) && row.value > 0, row.name);
    assert.ok(
      Number.isFinite(row.anchorValue) && row.anchorValue > 0,
      row.name,
    );
  }
});
