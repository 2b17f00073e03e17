import assert from "node:assert/strict";

Deno.test("deno task bench runs every scenario and prints the table and its JSON", async () => {
  const output = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--config",
      new URL("../deno.json", import.meta.url).pathname,
      new URL("../bench/run.ts", import.meta.url).pathname,
      "--smoke",
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(output.stdout);
  assert.ok(output.success, new TextDecoder().decode(output.stderr));
  const [table, json] = stdout.trim().split("\n\n");
  const lines = table!.split("\n");
  const { rows, smoke } = JSON.parse(json!);
  assert.equal(smoke, true);
  assert.equal(lines.length, 2 + rows.length);
  assert.equal(rows.length, 9);
  for (const row of rows) {
    assert.ok(Number.isFinite(row.value) && row.value > 0, row.name);
    assert.ok(
      Number.isFinite(row.anchorValue) && row.anchorValue > 0,
      row.name,
    );
  }
});
