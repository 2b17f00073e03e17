import assert from "node:assert/strict";
import { browserTest } from "./fixtures/browser/harness.ts";
import { runBenchSmoke } from "./helpers.ts";

Deno.test(
  {
    name:
      "deno task bench:browser measures sahpool and the Deno file driver and prints the table and its JSON",
    ...browserTest,
  },
  async () => {
    const { tableLines, rows, smoke } = await runBenchSmoke(
      "browser_bench.ts",
    );
    assert.equal(smoke, true);
    assert.equal(tableLines.length, 2 + rows.length);
    assert.deepEqual(
      rows.map((row) => row.name),
      [
        "claim+ack, Chromium opfs-sahpool via worker (wal, full)",
        "claim+ack, Chromium opfs-sahpool via worker (wal, full)",
        "claim+ack, Chromium opfs-sahpool via worker (wal, normal)",
      ],
    );
    for (const row of rows) {
      assert.ok(Number.isFinite(row.value) && row.value > 0, row.name);
      assert.ok(Number.isFinite(row.ratio) && row.ratio > 0, row.name);
    }
  },
);
