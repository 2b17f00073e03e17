import assert from "node:assert/strict";
import { DRIVERS } from "./drivers.ts";
import { runModelTest } from "./model.ts";

// In memory the full run passes 10,000 steps; on files, where every commit
// is an fsync, a quarter of it keeps the suite quick and still diverse. Runs
// average about 30 steps (100 runs gave 2,492 to 3,230), so 120 runs keep the
// file bound far below what chance can reach. On PostgreSQL each run also
// creates the schema, about a second, so 25 runs (at least 400 steps).
const RUNS = { memory: 400, file: 120, postgres: 25 };
const MIN_STEPS = { memory: 10_000, file: 2_500, postgres: 400 };
for (const driver of DRIVERS) {
  const kind = driver.engine === "postgres"
    ? "postgres"
    : driver.file
    ? "file"
    : "memory";
  const numRuns = RUNS[kind];
  Deno.test(`${driver.name}: model-based: random claim/acknowledge/renew/release/clock sequences on three connections, shared with application transactions that commit or roll back, match the reference model, every event keeping the identity its enqueue returned`, async () => {
    const report = await runModelTest(() => driver.open(3), { numRuns });
    console.log(report);
    assert.equal(report.runs, numRuns);
    assert.ok(
      report.steps >= MIN_STEPS[kind],
      `only ${report.steps} steps`,
    );
    // Both ends of the application's transactions were exercised.
    assert.ok(report.committed > 0, JSON.stringify(report));
    assert.ok(
      report.applicationTransactions > report.committed,
      JSON.stringify(report),
    );
  });
}
