/** `deno task test` (scripts/run_tests.ts): Chromium, the banner, temporary files. */
import assert from "node:assert/strict";

const TASK = new URL("../scripts/run_tests.ts", import.meta.url).pathname;
const FIXTURES = new URL("./fixtures/runner/", import.meta.url).pathname;

/** Runs the test task on one fixture file with `env` added. */
async function runTask(
  fixture: string,
  env: Record<string, string>,
): Promise<{ code: number; stderr: string }> {
  const { code, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", TASK, `${FIXTURES}${fixture}`],
    env: { NO_COLOR: "1", ...env },
    stdout: "null",
    stderr: "piped",
  }).output();
  return { code, stderr: new TextDecoder().decode(stderr) };
}

Deno.test("without Chromium the run passes, ignores the browser tests and ends with a banner saying what did not run and how to run it", async () => {
  const { code, stderr } = await runTask("browser.ts", {
    CHROMIUM_PATH: "/nonexistent/chromium",
    CI: "",
  });
  assert.equal(code, 0, stderr);
  const bar = "=".repeat(78);
  // The banner closes the output: a bar, what did not run, how to run it.
  const banner = stderr.slice(stderr.lastIndexOf(`${bar}\nSKIPPED`));
  assert.match(
    banner,
    /^=+\nSKIPPED: no Chromium at \/nonexistent\/chromium: the browser tests did NOT run/,
  );
  assert.match(banner, /apt-get install chromium/);
  assert.match(banner, /CHROMIUM_PATH/);
  assert.ok(banner.trimEnd().endsWith(bar), banner);
});
Deno.test("with CI set, a run without Chromium fails", async () => {
  const { code, stderr } = await runTask("browser.ts", {
    CHROMIUM_PATH: "/nonexistent/chromium",
    CI: "1",
  });
  assert.equal(code, 1, stderr);
  assert.match(stderr, /SKIPPED: no Chromium/);
  assert.match(stderr, /CI is set: this run fails\./);
});

Deno.test("a run whose tests leave a temporary directory fails and names it", async () => {
  const { code, stderr } = await runTask("leaves_temp_dir.ts", {});
  assert.equal(code, 1, stderr);
  assert.match(
    stderr,
    /the tests left temporary files behind: left-behind-\w+/,
  );
});

Deno.test("a run whose last test file uses the shared PostgreSQL server passes: its server is stopped and its directory removed before the process ends", async () => {
  const { code, stderr } = await runTask("shared_postgres.ts", {});
  assert.equal(code, 0, stderr);
  assert.doesNotMatch(stderr, /left temporary files behind/);
});
