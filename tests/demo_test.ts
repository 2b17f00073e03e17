import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { connectPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { tempDir } from "./helpers.ts";

const root = dirname(dirname(fileURLToPath(import.meta.url)));

Deno.test("the demo applies every event's effect once at its inbox recipient through a crash and a pause, and its summary adds up", async () => {
  await using dir = await tempDir();
  const path = join(dir.path, "outbox.db");
  await using tmp = await tempDir();
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      join(root, "demo.ts"),
      path,
      "--events",
      "60",
      "--poison",
      "3",
      "--lease-ms",
      "1000",
      "--json",
    ],
    cwd: root,
    env: { TMPDIR: tmp.path },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const output = new TextDecoder().decode(stdout);
  assert.equal(code, 0, output + new TextDecoder().decode(stderr));
  assert.deepEqual(await entries(tmp.path), []);

  // The seed scenario's six results, in order.
  const seed = [...output.matchAll(/→ (\S+)$/gm)].map((match) => match[1]);
  assert.deepEqual(seed, ["41", "null", "41", "false", "true", "null"]);

  const summary = JSON.parse(output.trim().split("\n").at(-1)!);
  assert.deepEqual(Object.keys(summary), SUMMARY_KEYS);
  assert.equal(summary.ok, true);
  assert.equal(summary.events, 60);
  assert.equal(summary.orders, 60);
  assert.equal(summary.delivered, 57);
  assert.equal(summary.deadLetters, 3);
  assert.equal(summary.poisonDead, 3);
  assert.equal(summary.unexpectedDead, 0);
  assert.equal(summary.lost, 0);
  assert.equal(summary.acknowledgedTwice, 0);
  assert.equal(summary.integrity, "ok");
  assert.equal(summary.recipientIntegrity, "ok");
  // Every delivered event's effect was applied exactly once; the inbox
  // refused the rest, and the counts add up to the deliveries received.
  assert.equal(summary.appliedOnce, 57);
  assert.equal(summary.appliedTwice, 0);
  assert.equal(summary.effectsLost, 0);
  assert.equal(summary.accepted, 57);
  assert.equal(summary.inboxRecords, 57);
  assert.equal(
    summary.deliveries,
    summary.accepted + summary.duplicates + summary.stale,
  );
  // Every delivery is a first delivery or a redelivery under a newer fence.
  const fences = Object.entries(
    summary.redeliveryFences as Record<string, number>,
  );
  assert.ok(fences.every(([fence]) => Number(fence) >= 2));
  assert.equal(
    summary.redeliveries,
    fences.reduce((sum, [, n]) => sum + n, 0),
  );
  assert.equal(summary.deliveries, summary.delivered + summary.redeliveries);
  // w1 was killed before it could report; the other two stopped cleanly.
  assert.equal(summary.workers.w1, null);
  const survivors = [summary.workers.w2, summary.workers.w3];
  assert.ok(
    summary.staleAcknowledgements >=
      survivors.reduce((sum, c) => sum + c.staleAcknowledgements, 0),
  );

  // The table shows the same numbers.
  assert.match(
    output,
    /^ {2}events \(orders committed with their event\) +60$/m,
  );
  assert.match(output, /^ {2}lost \/ acknowledged twice +0 \/ 0$/m);
  assert.match(output, /^ {2}integrity_check \(outbox, recipient\) +ok, ok$/m);
  assert.match(
    output,
    new RegExp(
      `^ {2}deliveries received \\(inbox, deduped by identity\\) +${summary.deliveries}: 57 accepted, ${summary.duplicates} duplicate, ${summary.stale} stale \\(\\+\\d+ poison refusals\\)$`,
      "m",
    ),
  );
  assert.match(
    output,
    /^ {2}effects applied once \/ twice \/ lost +57 \/ 0 \/ 0$/m,
  );
  assert.match(
    output,
    new RegExp(
      `^ {2}stale acknowledgements rejected +${summary.staleAcknowledgements}$`,
      "m",
    ),
  );
  assert.match(output, /^ {2}w1 .* SIGKILL at [\d.]+ s$/m);
  assert.match(
    output,
    /^ {2}w2 .* SIGSTOP at [\d.]+ s for [\d.]+ s, then SIGCONT/m,
  );

  // And the file itself, reopened, agrees.
  await using db = await openSqliteWasm(path);
  assert.deepEqual(
    await db.query(
      "SELECT state, count(*) AS n FROM outbox_events GROUP BY state ORDER BY state",
    ),
    [{ state: "dead", n: 3 }, { state: "done", n: 57 }],
  );
  // The recipient's own database: one shipment per delivered event, each
  // applied once, under the identity of its event.
  await using recipient = await openSqliteWasm(`${path}.recipient.db`);
  assert.deepEqual(
    await recipient.query(
      "SELECT applied, count(*) AS n FROM shipments GROUP BY applied",
    ),
    [{ applied: 1, n: 57 }],
  );
  const identities = await db.query(
    "SELECT identity FROM outbox_events WHERE state = 'done' ORDER BY identity",
  );
  assert.deepEqual(
    await recipient.query("SELECT identity FROM shipments ORDER BY identity"),
    identities,
  );
});

Deno.test("the demo on PostgreSQL at DATABASE_URL: the same phases and summary keys, every effect applied once, its schemas dropped at exit", async () => {
  const server = await sharedPostgres();
  const url = await server.createDatabase();
  await using tmp = await tempDir();
  const { code, stdout, stderr } = await demo([
    "--postgres",
    "--events",
    "40",
    "--poison",
    "2",
    "--lease-ms",
    "1000",
    "--json",
  ], { DATABASE_URL: url, TMPDIR: tmp.path }).output();
  const output = new TextDecoder().decode(stdout);
  assert.equal(code, 0, output + new TextDecoder().decode(stderr));
  assert.match(output, /^leased-outbox demo · PostgreSQL \d+/m);
  // The recipient's inbox on PostgreSQL too, in a schema of its own.
  assert.match(
    output,
    /^recipient database postgres:\/\/\S+ schema leased_outbox_demo_\w+_recipient$/m,
  );
  const seed = [...output.matchAll(/→ (\S+)$/gm)].map((match) => match[1]);
  assert.deepEqual(seed, ["41", "null", "41", "false", "true", "null"]);

  const summary = JSON.parse(output.trim().split("\n").at(-1)!);
  assert.deepEqual(Object.keys(summary), SUMMARY_KEYS);
  assert.equal(summary.ok, true);
  assert.equal(summary.events, 40);
  assert.equal(summary.orders, 40);
  assert.equal(summary.delivered, 38);
  assert.equal(summary.appliedOnce, 38);
  assert.equal(summary.appliedTwice, 0);
  assert.equal(summary.effectsLost, 0);
  assert.equal(summary.accepted, 38);
  assert.equal(summary.inboxRecords, 38);
  assert.equal(summary.deadLetters, 2);
  assert.equal(summary.poisonDead, 2);
  assert.equal(summary.unexpectedDead, 0);
  assert.equal(summary.lost, 0);
  assert.equal(summary.acknowledgedTwice, 0);
  assert.equal(summary.integrity, "ok");
  assert.equal(summary.recipientIntegrity, "ok");
  assert.equal(summary.deliveries, summary.delivered + summary.redeliveries);
  assert.equal(summary.workers.w1, null);
  assert.match(output, /^ {2}w1 .* SIGKILL at [\d.]+ s$/m);
  assert.match(
    output,
    /^ {2}w2 .* SIGSTOP at [\d.]+ s for [\d.]+ s, then SIGCONT/m,
  );
  assert.match(output, /^ {2}lost \/ acknowledged twice +0 \/ 0$/m);

  // Nothing left behind: not its schemas, not its files.
  const db = await connectPostgres(url, { listen: false });
  try {
    assert.deepEqual(
      await db.query(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'leased_outbox_demo%'",
      ),
      [],
    );
  } finally {
    await db.close();
  }
  assert.deepEqual(await entries(tmp.path), []);
});

/** The keys of the demo's `--json` summary, on either engine. */
const SUMMARY_KEYS = [
  "events",
  "orders",
  "delivered",
  "deliveries",
  "accepted",
  "duplicates",
  "stale",
  "appliedOnce",
  "appliedTwice",
  "effectsLost",
  "inboxRecords",
  "recipientIntegrity",
  "redeliveries",
  "redeliveryFences",
  "expiredLeases",
  "staleAcknowledgements",
  "deadLetters",
  "poisonDead",
  "unexpectedDead",
  "lost",
  "acknowledgedTwice",
  "integrity",
  "elapsedS",
  "workers",
  "ok",
];

Deno.test("the demo run without a database path removes its temporary directory", async () => {
  await using tmp = await tempDir();
  const { code, stdout } = await demo([
    "--events",
    "10",
    "--poison",
    "1",
    "--lease-ms",
    "1000",
  ], {
    TMPDIR: tmp.path,
  }).output();
  const output = new TextDecoder().decode(stdout);
  assert.equal(code, 0, output);
  assert.match(output, /^database \S+ \(removed at exit\)$/m);
  assert.deepEqual(await entries(tmp.path), []);
});

Deno.test("the demo stopped with SIGTERM midway stops its processes and removes its temporary directory", async () => {
  await using tmp = await tempDir();
  const child = demo(["--events", "100000"], { TMPDIR: tmp.path }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let output = "";
  while (!output.includes("\nRun: ")) {
    const { value, done } = await reader.read();
    if (done) break;
    output += value;
  }
  child.kill("SIGTERM");
  await reader.cancel();
  // The workers and the producer inherit the demo's stderr: it ends only
  // when every one of them has exited.
  const stderr = await new Response(child.stderr).text();
  const { code } = await child.status;
  assert.equal(code, 143, output + stderr);
  assert.deepEqual(await entries(tmp.path), []);
});

Deno.test("the demo and its processes load only the npm packages they import (the WASM build, the OpenTelemetry API, croner)", async () => {
  // A Deno cache holding those packages and no way out to the registry:
  // any other package the run needed would fail to download.
  await using denoDir = await tempDir();
  const info = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json"],
    stdout: "piped",
  }).output();
  const { npmCache } = JSON.parse(new TextDecoder().decode(info.stdout));
  const registry = join(denoDir.path, "npm", "registry.npmjs.org");
  await Deno.mkdir(registry, { recursive: true });
  const copy = await new Deno.Command("cp", {
    args: [
      "-R",
      join(npmCache, "registry.npmjs.org", "@sqlite.org"),
      join(npmCache, "registry.npmjs.org", "@opentelemetry"),
      // The schedules' cron parser (core/schedules.ts).
      join(npmCache, "registry.npmjs.org", "croner"),
      registry,
    ],
  }).output();
  assert.equal(copy.code, 0);
  await using tmp = await tempDir();
  const { code, stdout, stderr } = await demo(
    ["--events", "10", "--poison", "1", "--lease-ms", "1000"],
    {
      DENO_DIR: denoDir.path,
      HTTPS_PROXY: "http://127.0.0.1:9",
      NO_PROXY: "127.0.0.1",
      TMPDIR: tmp.path,
    },
  ).output();
  const errors = new TextDecoder().decode(stderr);
  assert.equal(code, 0, new TextDecoder().decode(stdout) + errors);
  assert.doesNotMatch(errors, /Download/);
  assert.deepEqual(
    await entries(join(denoDir.path, "npm", "registry.npmjs.org")),
    ["@opentelemetry", "@sqlite.org", "croner"],
  );
});

/** The demo as the README runs it, with `args` and `env` added. */
function demo(args: string[], env: Record<string, string>): Deno.Command {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "demo.ts", ...args],
    cwd: root,
    env: { ...env, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  });
}

/** The names in a directory, sorted. */
async function entries(dir: string): Promise<string[]> {
  const names = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names.sort();
}
