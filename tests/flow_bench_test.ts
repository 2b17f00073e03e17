/** bench/flow_bench.ts keeps working: its smoke run prints its ratio as a line of JSON. */
import assert from "node:assert/strict";

Deno.test("bench/flow_bench.ts --smoke prints the limited claim's cost over a plain one's as JSON", async () => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../bench/flow_bench.ts", import.meta.url).pathname,
      "--smoke",
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  const lines = new TextDecoder().decode(stdout).trimEnd().split("\n");
  const result = JSON.parse(lines.at(-1)!);
  assert.equal(result.events, 2_000);
  const ratio =
    result["claim with perKey and perSecond / without (median of 3)"];
  assert.equal(typeof ratio, "number");
  assert.ok(ratio > 0);
});
