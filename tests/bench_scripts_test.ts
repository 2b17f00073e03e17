/**
 * Every script in bench/ keeps up with the library: it type-checks, and it
 * loads. Most benches run only by hand, so a statement patch or a module-level
 * check gone stale would otherwise show only at the next sitting.
 */
import assert from "node:assert/strict";

const CONFIG = new URL("../deno.json", import.meta.url).pathname;
const BENCH = new URL("../bench/", import.meta.url);

/** The bench scripts' paths, sorted. */
async function benchScripts(): Promise<string[]> {
  const paths: string[] = [];
  for await (const entry of Deno.readDir(BENCH)) {
    if (entry.isFile && entry.name.endsWith(".ts")) {
      paths.push(new URL(entry.name, BENCH).pathname);
    }
  }
  return paths.sort();
}

// A script that needs an argument before it does anything: one that does
// nothing (no targets, no blocks).
const ARGUMENTS: Record<string, string[]> = {
  "scenario.ts": [
    JSON.stringify({
      kind: "pair",
      targets: [],
      warmup: 0,
      blocks: 0,
      units: 0,
    }),
  ],
};

Deno.test("every bench script type-checks", async () => {
  const scripts = await benchScripts();
  const { code, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["check", "--config", CONFIG, ...scripts],
    env: { NO_COLOR: "1" },
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
});

Deno.test("every bench script loads: without leave to write, connect or start a process it finishes or stops at the first of those, never on an error of its own", async () => {
  const scripts = await benchScripts();
  assert.ok(scripts.length > 10, `${scripts.length} scripts`);
  const outcomes: string[] = [];
  for (const script of scripts) {
    const name = script.slice(script.lastIndexOf("/") + 1);
    // Reading, the environment and the system's figures only: what a
    // module's top level computes (statements patched from the dialect's,
    // option tables) runs, and the first write, connection or child
    // process throws NotCapable.
    const { code, stderr } = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--config",
        CONFIG,
        "--no-prompt",
        "--allow-read",
        "--allow-env",
        "--allow-sys",
        script,
        ...ARGUMENTS[name] ?? [],
      ],
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
      // A safety net for a script that waits forever, far beyond the
      // second or so each takes.
      signal: AbortSignal.timeout(300_000),
    }).output();
    const text = new TextDecoder().decode(stderr);
    const uncaught = text.match(/^error: Uncaught (?:\(in promise\) )?(.*)$/m);
    if (code === 0) {
      outcomes.push(`${name}: finished`);
    } else if (uncaught?.[1]?.startsWith("NotCapable: ")) {
      outcomes.push(`${name}: stopped at the outside world`);
    } else {
      outcomes.push(
        `${name}: exited with code ${code}\n${
          text.split("\n").filter((line) => !/^\s+at /.test(line)).slice(-12)
            .join("\n")
        }`,
      );
    }
  }
  const failed = outcomes.filter((o) =>
    !o.endsWith(": finished") && !o.endsWith(": stopped at the outside world")
  );
  assert.deepEqual(failed, [], outcomes.join("\n"));
});
