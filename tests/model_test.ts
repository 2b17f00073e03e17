import assert from "node:assert/strict";
import { openSqliteWasm } from "../sqlite_wasm.ts";
import { runModelTest } from "./model.ts";

Deno.test("model-based: random claim/acknowledge/renew/release/clock sequences on three connections match the reference model", async () => {
  const report = await runModelTest(async () => {
    const name = `file:/model-${crypto.randomUUID()}?vfs=memdb`;
    const drivers = [
      await openSqliteWasm(name),
      await openSqliteWasm(name),
      await openSqliteWasm(name),
    ];
    return {
      drivers,
      close: async () => void await Promise.all(drivers.map((d) => d.close())),
    };
  });
  console.log(report);
  assert.ok(report.steps >= 10_000, `only ${report.steps} steps`);
});
