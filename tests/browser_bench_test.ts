import assert from "node:assert/strict";
import { browserTest } from "./fixtures/browser/harness.ts";

Deno.test(
  {
    name:
      "deno task bench:browser measures sahpool and the Deno file driver and prints the table and its JSON",
    ...browserTest,
  },
  async () => {
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--config",
        new URL("../deno.json", import.meta.url).pathname,
        new URL("../bench/browser_bench.ts", import.meta.url).pathname,
        "--smoke",
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.ok(output.success, new TextDecoder().decode(output.stderr));
    const [table, json] = new TextDecoder().decode(output.stdout).trim()
      .split("\n\n");
    const { rows, smoke } = JSON.parse(json!);
    assert.equal(smoke, true);
    assert.equal(table!.split("\n").length, 2 + rows.length);
    assert.deepEqual(
      rows.map((row: { name: string }) => row.name),
      [
        "claim+ack, Chromium opfs-sahpool via worker (wal, full)",
        "claim+ack, Chromium opfs-sahpool via worker (wal, normal)",
        "claim+ack, Chromium opfs-sahpool via worker (wal, full)",
      ],
    );
    for (const row of rows) {
      assert.ok(Number.isFinite(row.value) && row.value > 0, row.name);
      assert.ok(Number.isFinite(row.ratio) && row.ratio > 0, row.name);
    }
  },
);
