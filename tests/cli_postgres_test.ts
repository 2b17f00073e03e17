// The `outbox` command and OutboxReader on PostgreSQL: the same commands as
// on a file, against the tests' server, as the user runs them.
import assert from "node:assert/strict";
import { connectPostgres, openPostgres } from "../drivers/postgres.ts";
import { OutboxReader } from "../reader.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { cli, json } from "./cli_run.ts";
import { main } from "../cli.ts";

/** The tables of a schema, straight from the catalog. */
async function tables(url: string, schema: string): Promise<string[]> {
  const driver = await connectPostgres(url);
  try {
    const rows = await driver.query(
      "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
      [schema],
    );
    return rows.map((row) => String(row["table_name"]));
  } finally {
    await driver.close();
  }
}

Deno.test("cli on PostgreSQL: stats, list and explain read the outbox a URL names; a database without one is refused and left without one", async () => {
  const url = await (await sharedPostgres()).createDatabase();
  const refused = await cli("stats", url);
  assert.equal(refused.code, 1);
  assert.match(
    refused.stderr,
    /not an outbox database \(no outbox tables where its search_path leads\)/,
  );
  for (const command of ["cancel", "purge"]) {
    const args = command === "cancel" ? ["1"] : ["--older-than", "1d"];
    const output = await cli(command, url, ...args);
    assert.equal(output.code, 1, command);
    assert.match(output.stderr, /no outbox tables/, command);
  }
  assert.deepEqual(await tables(url, "public"), []);

  await using outbox = await openPostgres(url, { listen: false });
  const [first, second] = await outbox.enqueueBatch([
    { payload: { to: "ada" }, queue: "mail" },
    { payload: { to: "bob" }, queue: "mail", maxAttempts: 1 },
  ]);
  await outbox.enqueue({ n: 3 }, { queue: "sms" });
  const lease = await outbox.claim({ queue: "mail", max: 2 });
  assert.equal(lease.length, 2);
  assert.equal(await outbox.acknowledge(lease[0]!), true);
  assert.equal(
    await outbox.release(lease[1]!, { error: "smtp 550" }),
    true,
  );

  const stats = await json("stats", url);
  assert.deepEqual(
    [stats["pending"], stats["leased"], stats["done"], stats["dead"]],
    [1, 0, 1, 1],
  );
  assert.equal(stats["acknowledgedLastMinute"], 1);
  const dead = await json("list", url, "dead");
  assert.deepEqual(
    (dead["events"] as { id: number; lastError: string }[]).map((e) => [
      e.id,
      e.lastError,
    ]),
    [[second!.eventId, "smtp 550"]],
  );
  const pending = await json("list", url, "pending", "--queue", "sms");
  assert.equal((pending["events"] as unknown[]).length, 1);
  const explained = await json("explain", url, first!.identity);
  assert.equal(explained["state"], "done");
  assert.deepEqual(
    (explained["history"] as { kind: string }[]).map((entry) => entry.kind),
    ["claimed", "acknowledged"],
  );
  const table = await cli("stats", url);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /mail/);
  // Past the server's longest lock_timeout (about 24.8 days), as for a file.
  const patient = await cli("stats", url, "--busy-timeout", "30d");
  assert.equal(patient.code, 0, patient.stderr);
});

Deno.test("cli on PostgreSQL: redrive, cancel and purge change the outbox of the schema --schema names, and no other", async () => {
  const url = await (await sharedPostgres()).createDatabase();
  await using jobs = await openPostgres(url, {
    schema: "jobs",
    listen: false,
  });
  await using other = await openPostgres(url, { listen: false });
  await other.enqueue({ elsewhere: true });
  const dead = await jobs.enqueue({ n: 1 }, { maxAttempts: 1 });
  const lease = await jobs.claim();
  assert.equal(await jobs.release(lease!, { deadLetter: true }), true);
  const { eventId: pending } = await jobs.enqueue({ n: 2 });

  // Without --schema the public outbox is the one read.
  assert.equal((await json("stats", url))["pending"], 1);
  assert.equal((await json("stats", url, "--schema", "jobs"))["dead"], 1);
  assert.deepEqual(
    await json("redrive", url, String(dead.eventId), "--schema", "jobs"),
    { redriven: 1 },
  );
  assert.equal((await jobs.stats()).pending, 2);
  assert.deepEqual(
    await json("cancel", url, String(pending), "--schema", "jobs"),
    { cancelled: [pending], leftAlone: [] },
  );
  assert.equal((await jobs.explain(pending))?.state, "dead");
  const done = await jobs.claim();
  assert.equal(await jobs.acknowledge(done!), true);
  assert.deepEqual(
    await json(
      "purge",
      url,
      "--older-than",
      "0ms",
      "--state",
      "done",
      "--schema",
      "jobs",
    ),
    { purged: 1 },
  );
  assert.deepEqual(await jobs.stats(), {
    pending: 0,
    leased: 0,
    done: 0,
    dead: 1,
    oldestPendingAgeMs: 0,
  });
  assert.equal((await other.stats()).pending, 1);
  // A schema with no outbox is refused, not created.
  const missing = await cli("redrive", url, "--schema", "nowhere");
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /no outbox tables in schema nowhere\)/);
  assert.deepEqual(await tables(url, "nowhere"), []);
});

Deno.test("cli on PostgreSQL: stats ages events and counts acknowledgements by the server's clock, not this machine's", async () => {
  const url = await (await sharedPostgres()).createDatabase();
  await using outbox = await openPostgres(url, { listen: false });
  await outbox.enqueue({ n: 1 });
  await outbox.enqueue({ n: 2 });
  assert.equal(await outbox.acknowledge((await outbox.claim())!), true);
  const lines: string[] = [];
  // This machine's clock ten days ahead of the server's.
  const code = await main(["stats", url, "--json"], {
    stdout: (line) => lines.push(line),
    now: () => Date.now() + 10 * 86_400_000,
  });
  assert.equal(code, 0);
  const stats = JSON.parse(lines[0]!);
  // Before: ten days old, and no acknowledgement in "the last minute".
  assert.equal(stats.acknowledgedLastMinute, 1);
  assert.ok(
    stats.oldestPendingAgeMs < 60_000,
    String(stats.oldestPendingAgeMs),
  );
});

Deno.test("cli on PostgreSQL: a URL's password stays out of every message", async () => {
  // Nothing listens on port 1: the connection fails, and the message names
  // the database without its password.
  for (
    const [url, code] of [
      ["postgres://app:s3cret-pw@127.0.0.1:1/app", 1],
      ["postgresql://127.0.0.1:1/app?user=app&password=s3cret-pw", 1],
      ["postgres://app@127.0.0.1:1/app?sslpassword=s3cret-pw", 1],
      // An unencoded @, which node-postgres reads as the password's.
      ["postgres://app:s3c@ret-pw@127.0.0.1:1/app", 1],
      // URLs the client cannot read (a port out of range, a bad host)
      // are usage errors; before, its message quoted the whole URL.
      ["postgres://app:s3cret-pw@127.0.0.1:99999/app", 2],
      ["postgres://app:s3cret-pw@[::1/app", 2],
      ["postgres://app:pa/s3cret-pw@127.0.0.1:1/app", 2],
      ["postgres://app:pa#s3cret-pw@127.0.0.1:1/app", 2],
      // Typos of the scheme, and a libpq string, are files that do not
      // exist.
      ["postgress://app:s3cret-pw@127.0.0.1:1/app", 1],
      ["postgres:/app:s3cret-pw@127.0.0.1:1/app", 1],
      ["postgres:app:s3cret-pw@127.0.0.1:1/app", 1],
      ["host=127.0.0.1 password=s3cret-pw", 1],
      ["postgres://app@127.0.0.1:1/app?password=ab: s3cret-pw", 1],
      // A key percent-encoded, which the client reads decoded.
      ["postgres://app@127.0.0.1:1/app?pass%77ord=s3cret-pw", 1],
      ["postgres://app@127.0.0.1:1/app?ssl%70assword=s3cret-pw", 1],
    ] as const
  ) {
    const output = await cli("stats", url, "--busy-timeout", "1s");
    assert.equal(output.code, code, output.stderr);
    assert.doesNotMatch(output.stderr + output.stdout, /s3c/, url);
  }
  // A password that is also the user's name, or the database's, hides
  // only itself.
  const same = await cli(
    "stats",
    "postgres://outbox:outbox@127.0.0.1:1/outbox",
  );
  assert.match(
    same.stderr,
    /^outbox: cannot open postgres:\/\/\*\*\*@127\.0\.0\.1:1\/outbox: /,
  );
});

Deno.test("cli: --schema applies to a PostgreSQL database only, and must be a schema name", async () => {
  const file = await cli("stats", "outbox.db", "--schema", "jobs");
  assert.equal(file.code, 2);
  assert.match(file.stderr, /--schema applies to a PostgreSQL database only/);
  const url = await (await sharedPostgres()).createDatabase();
  const bad = await cli("stats", url, "--schema", "Jobs; DROP");
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /'schema' must be a lowercase identifier/);
});

Deno.test("OutboxReader on PostgreSQL reads what the outbox wrote, in one snapshot, and writes nothing", async () => {
  const url = await (await sharedPostgres()).createDatabase();
  await assert.rejects(
    OutboxReader.open(await connectPostgres(url)),
    /has no outbox/,
  );
  await using outbox = await openPostgres(url, { listen: false });
  const { eventId } = await outbox.enqueue({ n: 1 }, { queue: "mail" });
  await using reader = await OutboxReader.open(await connectPostgres(url));
  const [mail] = await reader.queues();
  assert.equal(mail?.pending, 1);
  const [event] = await reader.list({ state: "pending" });
  assert.deepEqual(event?.payload, { n: 1 });
  assert.equal((await reader.explain(eventId))?.state, "pending");
  // Inside a snapshot, a change committed after its first read is unseen.
  const seen = await reader.snapshot(async () => {
    const before = (await reader.queues())[0]?.pending;
    await outbox.enqueue({ n: 2 }, { queue: "mail" });
    return [before, (await reader.queues())[0]?.pending];
  });
  assert.deepEqual(seen, [1, 1]);
  assert.equal((await reader.queues())[0]?.pending, 2);
  const lease = await outbox.claim({ queue: "mail" });
  assert.equal(await outbox.acknowledge(lease!), true);
  assert.deepEqual(
    [...(await reader.acknowledgedSince(0))],
    [["mail", 1]],
  );
});
