/** The CLI's flow commands (issue 40): pause, resume, limits, schedules, and stats' flow column. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Outbox } from "../mod.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { connectPostgres } from "../drivers/postgres.ts";
import { sharedPostgres } from "../scripts/postgres_server.ts";
import { cli, json } from "./cli_run.ts";

async function database(): Promise<{ path: string; dir: string }> {
  const dir = await Deno.makeTempDir({ prefix: "cli_flow_" });
  const path = join(dir, "outbox.db");
  await using outbox = await Outbox.open(await openSqliteWasm(path));
  await outbox.enqueue({ n: 1 }, { queue: "mail" });
  await outbox.enqueue({ n: 2 }, { queue: "webhooks" });
  return { path, dir };
}

Deno.test("pause and resume stop and restart a queue's claims; stats shows the paused queue in a flow column", async () => {
  const { path, dir } = await database();
  try {
    const paused = await cli("pause", path, "mail");
    assert.equal(paused.code, 0, paused.stderr);
    assert.equal(paused.stdout, "paused queue mail\n");
    {
      await using outbox = await Outbox.open(await openSqliteWasm(path));
      assert.equal(await outbox.claim({ queue: "mail" }), null);
    }
    const lines = (await cli("stats", path)).stdout.trimEnd().split("\n");
    assert.match(lines[0]!, / +acks last 60 s +flow$/);
    assert.match(lines[1]!, /^mail +1 .* paused$/);
    assert.match(lines[2]!, /^webhooks +1 .* -$/);
    const stats = await json("stats", path);
    assert.deepEqual(
      (stats["queues"] as Record<string, unknown>[]).map((q) => q["paused"]),
      [true, undefined],
    );
    assert.deepEqual(await json("resume", path, "mail"), {
      queue: "mail",
      paused: false,
    });
    await using outbox = await Outbox.open(await openSqliteWasm(path));
    assert.deepEqual((await outbox.claim({ queue: "mail" }))?.payload, {
      n: 1,
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("limits sets --per-key and --per-second, none clears one, and without them prints the queue's limits", async () => {
  const { path, dir } = await database();
  try {
    const set = await cli(
      "limits",
      path,
      "mail",
      "--per-key",
      "3",
      "--per-second",
      "20",
    );
    assert.equal(set.code, 0, set.stderr);
    assert.equal(set.stdout, "queue mail: running, per key 3, per second 20\n");
    assert.deepEqual(await json("limits", path, "mail", "--per-key", "none"), {
      queue: "mail",
      paused: false,
      perKey: null,
      perSecond: 20,
    });
    const lines = (await cli("stats", path)).stdout.trimEnd().split("\n");
    assert.match(lines[1]!, /^mail +1 .* 20\/s$/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("limits with a limit of 0 or text, and pause without a queue, exit 2 naming the mistake, and change nothing", async () => {
  const { path, dir } = await database();
  try {
    const zero = await cli("limits", path, "mail", "--per-key", "0");
    assert.equal(zero.code, 2);
    assert.match(zero.stderr, /'perKey' must be a positive integer/);
    const text = await cli("limits", path, "mail", "--per-second", "fast");
    assert.equal(text.code, 2);
    assert.match(
      text.stderr,
      /--per-second must be a positive integer or none/,
    );
    const none = await cli("pause", path);
    assert.equal(none.code, 2);
    assert.match(none.stderr, /pause takes one queue after the database/);
    const misplaced = await cli("stats", path, "--per-key", "2");
    assert.equal(misplaced.code, 2);
    assert.match(misplaced.stderr, /--per-key does not apply to stats/);
    assert.deepEqual(await json("limits", path, "mail"), {
      queue: "mail",
      paused: false,
      perKey: null,
      perSecond: null,
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("schedules lists each schedule with its next and latest tick, as a table and as JSON", async () => {
  const { path, dir } = await database();
  try {
    {
      await using outbox = await Outbox.open(await openSqliteWasm(path), {
        now: () => Date.UTC(2026, 0, 1),
      });
      await outbox.schedule("nightly", "0 3 * * *", { job: "report" }, {
        queue: "mail",
        timezone: "Europe/Paris",
      });
    }
    const lines = (await cli("schedules", path)).stdout.trimEnd().split("\n");
    assert.match(
      lines[0]!,
      /^name +cron +timezone +queue +next tick +latest tick$/,
    );
    assert.match(
      lines[1]!,
      /^nightly +0 3 \* \* \* +Europe\/Paris +mail +2026-01-01T02:00:00.000Z +-$/,
    );
    const output = await cli("schedules", path, "--json");
    assert.deepEqual(JSON.parse(output.stdout), [{
      name: "nightly",
      cron: "0 3 * * *",
      timezone: "Europe/Paris",
      queue: "mail",
      payload: { job: "report" },
      missed: "latest",
      nextAt: Date.UTC(2026, 0, 1, 2),
      lastAt: null,
      options: {},
    }]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("postgres: pause, limits and stats --json work on a PostgreSQL URL", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  {
    await using outbox = await Outbox.open(
      await connectPostgres(server.url, { schema }),
    );
    await outbox.enqueue({ n: 1 }, { queue: "mail" });
  }
  const args = ["--schema", schema];
  assert.deepEqual(await json("pause", server.url, "mail", ...args), {
    queue: "mail",
    paused: true,
  });
  assert.deepEqual(
    await json("limits", server.url, "mail", "--per-second", "5", ...args),
    { queue: "mail", paused: true, perKey: null, perSecond: 5 },
  );
  const stats = await json("stats", server.url, ...args);
  const [mail] = stats["queues"] as Record<string, unknown>[];
  assert.equal(mail?.["paused"], true);
  assert.equal(mail?.["perSecond"], 5);
});
