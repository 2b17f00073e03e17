/**
 * `.ci/run` fails whenever a test command fails, including when the command
 * fails after printing a summary with no failure in it (scripts/run_tests.ts
 * does, when the tests leave temporary files behind).
 */
import assert from "node:assert/strict";
import { tempDir } from "./helpers.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const COUNT = `${ROOT}.ci/count.sh`;
const RUN = `${ROOT}.ci/run`;
const decoder = new TextDecoder();
// .ci/run runs test:vfs-posix (a passing stand-in here) when deno.json has it.
const POSIX_TASK =
  (await Deno.readTextFile(`${ROOT}deno.json`)).includes('"test:vfs-posix"')
    ? 1
    : 0;

/** Runs `.ci/count.sh` on a log; returns its last line and exit code. */
async function count(
  log: string,
  status: number,
): Promise<{ code: number; last: string; output: string }> {
  await using dir = await tempDir("ci-count-");
  await Deno.writeTextFile(`${dir.path}/log`, log);
  const { code, stdout } = await new Deno.Command("bash", {
    args: [COUNT, "deno task test", `${dir.path}/log`, String(status)],
    stdout: "piped",
  }).output();
  const output = decoder.decode(stdout);
  return { code, last: output.trimEnd().split("\n").at(-1)!, output };
}

Deno.test(".ci/count.sh counts a run whose summary says ok but whose command exited 1 as one failure", async () => {
  const { code, last, output } = await count(
    "running 5 tests\nok | 5 passed | 0 failed (12ms)\ntest: something after the summary\n",
    1,
  );
  assert.equal(last, "5 passed, 1 failed");
  assert.match(
    output,
    /deno task test exited with status 1 after a summary with no failure/,
  );
  assert.equal(code, 1);
});

Deno.test(".ci/count.sh counts the same summary with exit status 0 as passed", async () => {
  const { code, last } = await count("ok | 5 passed | 0 failed (12ms)\n", 0);
  assert.equal(last, "5 passed, 0 failed");
  assert.equal(code, 0);
});

Deno.test(".ci/count.sh counts failed and ignored tests from the summary, and a missing summary as one failure", async () => {
  assert.equal(
    (await count("FAILED | 3 passed | 2 failed | 1 ignored (1s)\n", 1)).last,
    "3 passed, 3 failed",
  );
  // A server too old for a test reports it ignored, and the run fails.
  assert.equal(
    (await count("ok | 5 passed | 0 failed | 2 ignored (1s)\n", 0)).last,
    "5 passed, 2 failed",
  );
  assert.equal(
    (await count("error: Module not found\n", 1)).last,
    "0 passed, 1 failed",
  );
});

Deno.test(".ci/count.sh ends with what failed, by name: the FAILURES section, the ignored tests and the runner's complaints, just before the counts", async () => {
  const { code, output } = await count(
    [
      "claims ... FAILED (3ms)",
      "old server ... ignored (0ms)",
      "",
      " FAILURES ",
      "",
      "claims => ./tests/a_test.ts:2:6",
      "steps ... inner => ./tests/a_test.ts:9:43",
      "",
      "FAILED | 4 passed | 2 failed (1 step) | 1 ignored (9ms)",
      "test: the tests left temporary files behind: x-1",
      "",
    ].join("\n"),
    1,
  );
  assert.deepEqual(output.trimEnd().split("\n").slice(-7), [
    "== what failed",
    "deno task test (exit status 1):",
    "  failed: claims => ./tests/a_test.ts:2:6",
    "  failed: steps ... inner => ./tests/a_test.ts:9:43",
    "  ignored: old server",
    "  test: the tests left temporary files behind: x-1",
    "4 passed, 3 failed",
  ]);
  assert.equal(code, 1);
});

Deno.test(".ci/count.sh prints no recap when nothing failed, and the log's end when there is no summary", async () => {
  const passing = await count(
    "ok | 5 passed | 0 failed (12ms)\ntest: a note\n",
    0,
  );
  assert.equal(passing.output, "5 passed, 0 failed\n");
  const crashed = await count("one\ntwo: Module not found\n", 1);
  assert.deepEqual(crashed.output.trimEnd().split("\n").slice(-5), [
    "deno task test:",
    "  no test summary; the log ends:",
    "  one",
    "  two: Module not found",
    "0 passed, 1 failed",
  ]);
});

Deno.test("the test runner's output and exit status on tests that leave a temporary directory count as failed through .ci/count.sh", async () => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      `${ROOT}scripts/run_tests.ts`,
      `${ROOT}tests/fixtures/runner/leaves_temp_dir.ts`,
    ],
    // Chromium is not needed by the fixture: the runner installs none.
    env: { NO_COLOR: "1", CHROMIUM_PATH: Deno.execPath() },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const log = decoder.decode(stdout) + decoder.decode(stderr);
  assert.match(log, /^ok \| 1 passed \| 0 failed/m);
  assert.equal(code, 1, log);
  assert.equal((await count(log, code)).last, "1 passed, 1 failed");
});

Deno.test(".ci/run fails, counting one failure, when the test task exits 1 after an ok summary", async () => {
  const { code, last, output } = await ciRun("leaves_temp_dir.ts");
  // The test task (1 passed, then its exit status), test:stress, check.
  assert.equal(last, `${3 + POSIX_TASK} passed, 1 failed`, output);
  // What failed is named last, where CI's view of the log ends.
  const end = output.slice(output.lastIndexOf("== what failed"));
  assert.match(
    end,
    /^== what failed\ndeno task test \(exit status 1\):\n {2}test: the tests left temporary files behind: /,
  );
  assert.equal(code, 1, output);
});

Deno.test(".ci/run passes when every task passes (the same stand-ins, a test file that leaves nothing behind)", async () => {
  const { code, last, output } = await ciRun("browser.ts");
  assert.equal(last, `${4 + POSIX_TASK} passed, 0 failed`, output);
  assert.equal(code, 0, output);
});

/**
 * Runs `.ci/run` itself with stand-ins first on its PATH: `deno task test`
 * runs the real test runner on one fixture of tests/fixtures/runner/,
 * `deno task test:stress` prints a passing summary, `deno task check`
 * passes, every other `deno` command is the real one, and `apt-get`,
 * `sudo` and `npm` install nothing.
 */
async function ciRun(
  fixture: string,
): Promise<{ code: number; last: string; output: string }> {
  await using bin = await tempDir("ci-run-bin-");
  const deno = Deno.execPath();
  const stand = async (name: string, body: string) => {
    await Deno.writeTextFile(
      `${bin.path}/${name}`,
      `#!/usr/bin/env bash\n${body}\n`,
    );
    await Deno.chmod(`${bin.path}/${name}`, 0o755);
  };
  await stand(
    "deno",
    `case "$1 \${2:-}" in
  "task test") exec "${deno}" run -A scripts/run_tests.ts tests/fixtures/runner/${fixture} ;;
  "task test:stress") echo "ok | 1 passed | 0 failed (1ms)"; exit 0 ;;
  "task test:vfs-posix") echo "ok | 1 passed | 0 failed (1ms)"; exit 0 ;;
  "task check") exit 0 ;;
  *) exec "${deno}" "$@" ;;
esac`,
  );
  for (const name of ["apt-get", "sudo", "npm"]) await stand(name, "exit 1");
  const { code, stdout, stderr } = await new Deno.Command("bash", {
    args: [RUN],
    env: {
      PATH: `${bin.path}:${Deno.env.get("PATH") ?? ""}`,
      // Chromium is not needed by the stand-in's fixtures.
      CHROMIUM_PATH: Deno.execPath(),
    },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const output = decoder.decode(stdout) + decoder.decode(stderr);
  return {
    code,
    last: decoder.decode(stdout).trimEnd().split("\n").at(-1)!,
    output,
  };
}
