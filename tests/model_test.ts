import assert from "node:assert/strict";
import { DRIVERS } from "./drivers.ts";
import { runModelTest } from "./model.ts";

// In memory the full run passes 10,000 steps; on files, where every commit
// is an fsync, a quarter of it keeps the suite quick and still diverse. Runs
// average about 30 steps (100 runs gave 2,492 to 3,230), so 120 runs keep the
// file bound far below what chance can reach.
for (const driver of DRIVERS) {
  const numRuns = driver.file ? 120 : 400;
  Deno.test(`${driver.name}: model-based: random claim/acknowledge/renew/release/clock sequences on three connections match the reference model, every event keeping the identity its enqueue returned`, async () => {
    const report = await runModelTest(() => driver.open(3), { numRuns });
    console.log(report);
    assert.equal(report.runs, numRuns);
    assert.ok(
      report.steps >= (driver.file ? 2_500 : 10_000),
      `only ${report.steps} steps`,
    );
  });
}
