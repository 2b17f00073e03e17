import assert from "node:assert/strict";
import { join } from "node:path";
import { main } from "../cli.ts";
import { summaryText } from "../cli/stats.ts";
import { Outbox } from "../lease.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
import { cli, json, type Output, root } from "./cli_run.ts";

const child = join(root, "tests", "fixtures", "cli_child.ts");
const EVENTS_PER_CHILD = 40;
const decoder = new TextDecoder();

interface LiveRun {
  readonly dir: string;
  readonly path: string;
  /** What `stats --json` printed while the two processes ran. */
  readonly during: Output[];
}

let live: Promise<LiveRun> | undefined;

/**
 * Two processes that each enqueue and deliver events on one file, with the
 * CLI's `stats --json` run again and again beside them; once, shared by the
 * tests that only read the finished file.
 */
function liveRun(): Promise<LiveRun> {
  live ??= (async () => {
    const dir = await Deno.makeTempDir({ prefix: "cli-test-" });
    const path = join(dir, "outbox.db");
    // Created first, so the CLI never meets a file without the schema; in
    // a rollback mode, whose locks and journal these tests are about (the
    // CLI in WAL mode: wal_growth_test.ts and the WAL-mode tests below).
    await (await Outbox.open(
      await openSqliteWasm(path, { journalMode: "truncate" }),
    )).close();
    const children = [1, 2].map(() =>
      new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", child, path, String(EVENTS_PER_CHILD)],
        cwd: root,
        stdout: "piped",
        stderr: "piped",
      }).output()
    );
    let running = true;
    const finished = Promise.all(children).finally(() => running = false);
    const during: Output[] = [];
    while (running) during.push(await cli("stats", path, "--json"));
    for (const result of await finished) {
      assert.equal(result.code, 0, decoder.decode(result.stderr));
    }
    globalThis.addEventListener(
      "unload",
      () => Deno.removeSync(dir, { recursive: true }),
    );
    return { dir, path, during };
  })();
  return live;
}

/** A copy of the finished run's file, for a command that writes. */
async function copyOfRun(): Promise<string> {
  const { dir, path } = await liveRun();
  const copy = join(dir, `copy-${crypto.randomUUID()}.db`);
  await Deno.copyFile(path, copy);
  return copy;
}

interface Summary {
  pending: number;
  leased: number;
  done: number;
  dead: number;
  oldestPendingAgeMs: number;
  acknowledgedLastMinute: number;
  queues: (Omit<Summary, "queues"> & { queue: string })[];
}

Deno.test("stats --json beside two live producer/worker processes prints one JSON object of counts per state, and the final one adds up", async () => {
  const { path, during } = await liveRun();
  assert.ok(during.length >= 1);
  const total = 2 * EVENTS_PER_CHILD;
  for (const output of during) {
    assert.equal(output.code, 0, output.stderr);
    const summary = JSON.parse(output.stdout) as Summary;
    const states = ["pending", "leased", "done", "dead"] as const;
    assert.ok(states.reduce((n, s) => n + summary[s], 0) <= total);
    for (const state of states) {
      assert.equal(
        summary.queues.reduce((n, q) => n + q[state], 0),
        summary[state],
      );
    }
  }
  const final = await json("stats", path) as unknown as Summary;
  assert.deepEqual(
    {
      pending: final.pending,
      leased: final.leased,
      done: final.done,
      dead: final.dead,
      oldestPendingAgeMs: final.oldestPendingAgeMs,
      queues: final.queues.map((q) => [q.queue, q.done, q.dead]),
    },
    {
      pending: 0,
      leased: 0,
      done: total - 4,
      dead: 4,
      oldestPendingAgeMs: 0,
      queues: [["mail", total / 2 - 2, 2], ["webhooks", total / 2 - 2, 2]],
    },
  );
  // Every acknowledgement of the run happened within the last minute.
  assert.equal(final.acknowledgedLastMinute, total - 4);
});

Deno.test("stats prints a table per queue with a total row, and no colour when piped", async () => {
  const { path } = await liveRun();
  const { code, stdout } = await cli("stats", path);
  assert.equal(code, 0);
  assert.ok(!stdout.includes("\x1b"), "no escape sequences");
  const lines = stdout.trimEnd().split("\n");
  assert.match(
    lines[0]!,
    /^queue +pending +leased +done +dead +oldest pending +acks last 60 s$/,
  );
  assert.match(lines[1]!, /^mail +0 +0 +38 +2 +- +38$/);
  assert.match(lines[2]!, /^webhooks +0 +0 +38 +2 +- +38$/);
  assert.match(lines[3]!, /^total +0 +0 +76 +4 +- +76$/);
  assert.equal(lines.length, 4);
});

Deno.test("list dead shows each dead letter's identity, attempts and last error, a page at a time", async () => {
  const { path } = await liveRun();
  const all = await json("list", path, "dead");
  const events = all["events"] as Record<string, unknown>[];
  assert.equal(events.length, 4);
  assert.equal(all["next"], null);
  for (const event of events) {
    assert.equal(event["state"], "dead");
    assert.equal(event["attempt"], 2);
    assert.equal(event["maxAttempts"], 2);
    assert.match(String(event["identity"]), /^[0-9a-f]{8}-[0-9a-f-]{27}$/);
    assert.equal(
      event["lastError"],
      `Error: receiver answered 422 for ${event["id"]}`,
    );
  }
  const first = await json("list", path, "dead", "--limit", "3");
  const firstIds = (first["events"] as { id: number }[]).map((e) => e.id);
  assert.equal(first["next"], firstIds[2]);
  const second = await json(
    "list",
    path,
    "dead",
    "--limit",
    "3",
    "--after",
    String(first["next"]),
  );
  assert.deepEqual(
    [...firstIds, ...(second["events"] as { id: number }[]).map((e) => e.id)],
    events.map((e) => e["id"]),
  );

  const { code, stdout } = await cli("list", path, "dead", "--queue", "mail");
  assert.equal(code, 0);
  const lines = stdout.trimEnd().split("\n");
  assert.match(
    lines[0]!,
    /^ *id +identity +queue +attempt +enqueued +since +payload +last error$/,
  );
  const mail = events.filter((e) => e["queue"] === "mail");
  mail.forEach((event, i) => {
    assert.match(
      lines[i + 1]!,
      new RegExp(
        `^ *${event["id"]} +${
          event["identity"]
        } +mail +2/2 +[\\d.]+ m?s ago +[\\d.]+ m?s ago +\\{"n":\\d+,"poison":true\\} +Error: receiver answered 422 for ${
          event["id"]
        }$`,
      ),
    );
  });
  assert.equal(lines.at(-1), "showing 2 of 2 dead");
});

Deno.test("list pending shows when each event is due, and leased when its lease ends", async () => {
  const dir = await Deno.makeTempDir({ prefix: "cli-test-" });
  const path = join(dir, "outbox.db");
  {
    await using outbox = await Outbox.open(await openSqliteWasm(path));
    await outbox.enqueue({ n: 1 }, { delayMs: 3_600_000 });
    await outbox.enqueue({ n: 2 });
    await outbox.claim({ leaseMs: 7_200_000 });
  }
  const pending = await cli("list", path, "pending");
  assert.equal(pending.code, 0, pending.stderr);
  assert.match(
    pending.stdout,
    /^ *1 +[0-9a-f-]{36} +default +0\/5 +[\d.]+ m?s ago +in (59\.\d|60\.0) min +\{"n":1\} +-$/m,
  );
  const leased = await cli("list", path, "leased");
  assert.match(
    leased.stdout,
    /^ *id +identity +queue +attempt +enqueued +lease until +payload +last error$/m,
  );
  assert.match(
    leased.stdout,
    /^ *2 +[0-9a-f-]{36} +default +1\/5 +[\d.]+ m?s ago +in (1\.\d|2\.0) h +\{"n":2\} +-$/m,
  );
  await Deno.remove(dir, { recursive: true });
});

Deno.test("explain prints an event's timeline, by id or by identity, as text and as JSON", async () => {
  const { path } = await liveRun();
  const dead = await json("list", path, "dead", "--limit", "1");
  const [event] = dead["events"] as { id: number; identity: string }[];
  const byId = await json("explain", path, String(event!.id));
  const byIdentity = await json("explain", path, event!.identity);
  assert.deepEqual(byIdentity, byId);
  assert.equal(byId["state"], "dead");
  assert.deepEqual(
    (byId["history"] as { kind: string; fence: number }[]).map((e) =>
      `${e.kind}@${e.fence}`
    ),
    ["claimed@1", "released@1", "claimed@2", "released@2", "dead@2"],
  );

  const { code, stdout } = await cli("explain", path, String(event!.id));
  assert.equal(code, 0);
  const lines = stdout.trimEnd().split("\n");
  assert.equal(
    lines[0],
    `event ${event!.id} (${event!.identity}) in queue ${
      byId["queue"]
    }: dead, attempt 2/2, fence 2, last error "Error: receiver answered 422 for ${
      event!.id
    }"`,
  );
  assert.match(
    lines[1]!,
    /^enqueued \d{4}-\d\d-\d\dT\S+Z \([\d.]+ (ms|s|min) ago\)$/,
  );
  assert.equal(
    new Date(lines[1]!.split(" ")[1]!).getTime(),
    byId["createdAt"],
  );
  assert.equal(
    lines[2],
    `payload ${JSON.stringify(byId["payload"])}`,
  );
  assert.deepEqual(Object.keys(byId["payload"] as object), ["n", "poison"]);
  assert.match(lines[3]!, /^at +\+ +fence +what +token +detail$/);
  assert.match(lines[4]!, /^\S+Z +0 ms +1 +claimed +[0-9a-f]{9}… +lease until/);
  assert.match(lines[5]!, / +1 +released +[0-9a-f]{9}… +Error: receiver/);
  assert.match(lines[8]!, / +2 +dead +- +Error: receiver/);
  assert.equal(lines.length, 9);
});

/** Starts `watch` on `path`, refreshing every 50 ms, its output piped. */
function watch50ms(path: string): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      join(root, "cli.ts"),
      "watch",
      path,
      "--interval",
      "50ms",
    ],
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

Deno.test("watch prints the counts at every refresh until SIGINT, then exits 0", async () => {
  const { path } = await liveRun();
  const process = watch50ms(path);
  const lines: string[] = [];
  const reader = process.stdout.pipeThrough(new TextDecoderStream())
    .getReader();
  let buffer = "";
  while (lines.length < 3) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    const parts = buffer.split("\n");
    buffer = parts.pop()!;
    lines.push(...parts);
  }
  process.kill("SIGINT");
  for (;;) if ((await reader.read()).done) break;
  const { code } = await process.status;
  await process.stderr.cancel();
  assert.equal(code, 0);
  for (const line of lines) {
    assert.match(
      line,
      /^\S+Z {2}pending 0 {2}leased 0 {2}done 76 {2}dead 4 {2}oldest pending - {2}acks 76\/min/,
    );
  }
  // From the second refresh on, the rate over the last interval.
  assert.match(lines[1]!, / {2}0\.0\/s now$/);
});

Deno.test("retry and redrive put dead letters back to pending: those named, or every one of a queue", async () => {
  const path = await copyOfRun();
  const dead = (await json("list", path, "dead"))["events"] as {
    id: number;
    queue: string;
  }[];
  const [first] = dead;
  assert.deepEqual(await json("retry", path, String(first!.id)), {
    redriven: 1,
  });
  // Not dead any more: nothing to retry.
  const again = await cli("retry", path, String(first!.id));
  assert.equal(again.code, 0);
  assert.equal(again.stdout, "redrove 0 dead letters\n");
  const redriven = await json("redrive", path, "--queue", "webhooks");
  assert.equal(
    redriven["redriven"],
    dead.filter((e) => e.queue === "webhooks" && e.id !== first!.id).length,
  );
  const stats = await json("stats", path) as unknown as Summary;
  assert.equal(stats.pending, 1 + (redriven["redriven"] as number));
  assert.equal(stats.dead, 4 - stats.pending);
  const pending = (await json("list", path, "pending"))["events"] as {
    attempt: number;
  }[];
  assert.deepEqual(pending.map((e) => e.attempt), pending.map(() => 0));
});

Deno.test("cancel makes pending events dead letters marked cancelled, and leaves others alone", async () => {
  const path = await copyOfRun();
  const [dead] = (await json("list", path, "dead", "--limit", "1"))[
    "events"
  ] as { id: number }[];
  await json("retry", path, String(dead!.id));
  const done = (await json("list", path, "done", "--limit", "1"))[
    "events"
  ] as { id: number }[];
  const { code, stdout } = await cli(
    "cancel",
    path,
    String(dead!.id),
    String(done[0]!.id),
  );
  assert.equal(code, 0);
  assert.equal(
    stdout,
    `cancelled 1 of 2: ${dead!.id}\nleft alone, already delivered (done): ${
      done[0]!.id
    }\n`,
  );
  const explained = await json("explain", path, String(dead!.id));
  assert.equal(explained["state"], "dead");
  assert.equal(explained["lastError"], "cancelled");
  const stats = await json("stats", path) as unknown as Summary;
  assert.deepEqual([stats.pending, stats.done, stats.dead], [0, 76, 4]);
});

Deno.test("cancel changes all the events named or, when it fails midway, none", async () => {
  const path = await copyOfRun();
  await json("redrive", path);
  const pending = (await json("list", path, "pending"))["events"] as {
    id: number;
  }[];
  assert.equal(pending.length, 4);
  const ids = pending.map((e) => e.id);
  {
    // The ledger entry of the last one fails, after the others' rows changed.
    await using db = await openSqliteWasm(path);
    await db.exec(
      `CREATE TRIGGER refuse BEFORE INSERT ON outbox_attempts WHEN NEW.event_id = ${
        ids[3]
      } AND NEW.detail = 'cancelled' BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END`,
    );
  }
  const failed = await cli("cancel", path, ...ids.map(String));
  assert.equal(failed.code, 1);
  assert.equal(failed.stdout, "");
  assert.match(failed.stderr, /refused by a trigger/);
  const stats = await json("stats", path) as unknown as Summary;
  assert.deepEqual([stats.pending, stats.dead], [4, 0]);
});

Deno.test("list, explain and stats show the control characters of stored text as escapes, never raw", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "escapes.db");
    const queue = "q\x1b]0;owned\x07";
    {
      await using outbox = await Outbox.open(await openSqliteWasm(path), {
        maxAttempts: 1,
      });
      await outbox.enqueue({ n: 1 }, { queue });
      const lease = await outbox.claim({ queue });
      await outbox.release(lease!, {
        error: "\x1b[2J\x1b[31mred\x9b1m \u202eevil\x7f\u2028line\u2029para",
      });
    }
    const outputs = [
      await cli("list", path, "dead"),
      await cli("explain", path, "1"),
      await cli("stats", path),
      await cli("explain", path, "1", "--full"),
    ];
    for (const { code, stdout, stderr } of outputs) {
      assert.equal(code, 0, stderr);
      assert.doesNotMatch(
        stdout,
        // deno-lint-ignore no-control-regex
        /[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e\u2028\u2029]/,
      );
      assert.match(stdout, /q\\u001b\]0;owned\\u0007/);
    }
    // A list's column folds line breaks (U+2028 and U+2029 among them) to
    // a space; explain shows the whole error, escaped.
    assert.match(
      outputs[0]!.stdout,
      /\\u001b\[2J\\u001b\[31mred\\u009b1m \\u202eevil\\u007f line para/,
    );
    assert.match(
      outputs[3]!.stdout,
      /last error "\\u001b\[2J\\u001b\[31mred\\u009b1m \\u202eevil\\u007f\\u2028line\\u2029para"/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("watch whose reader goes away (watch | head -1) exits 0 at its next refresh", async () => {
  const { path } = await liveRun();
  const process = watch50ms(path);
  const reader = process.stdout.getReader();
  assert.ok((await reader.read()).value!.length > 0);
  await reader.cancel();
  const { code } = await process.status;
  assert.equal(code, 0);
  assert.equal(
    decoder.decode((await process.stderr.getReader().read()).value),
    "",
  );
});

Deno.test("a file: URI without a slash is relative to the working directory, as SQLite reads it", async () => {
  const { dir, path } = await liveRun();
  const name = path.slice(dir.length + 1);
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      join(root, "cli.ts"),
      "stats",
      `file:${name}`,
      "--json",
    ],
    cwd: dir,
    // `deno task` sets INIT_CWD, which the CLI prefers to its cwd.
    env: { INIT_CWD: dir },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, decoder.decode(stderr));
  assert.equal(JSON.parse(decoder.decode(stdout)).done, 76);
});

Deno.test("a write command that cannot create the journal beside the database names the file and says why", async () => {
  // A name whose journal's name ("-journal" added) is longer than a file
  // name may be: SQLITE_CANTOPEN, as in a directory the user cannot write.
  const { dir } = await liveRun();
  const path = join(dir, `${"j".repeat(250)}.db`);
  await Deno.copyFile(await copyOfRun(), path);
  const { code, stdout, stderr } = await cli("redrive", path);
  assert.equal(code, 1);
  assert.equal(stdout, "");
  assert.equal(
    stderr,
    `outbox: ${path}: unable to open database file: File name too long (os error 36): open '${path}-journal'\n`,
  );
});

Deno.test("purge --older-than deletes done events and dead letters older than the age, or only the states given", async () => {
  const path = await copyOfRun();
  assert.deepEqual(await json("purge", path, "--older-than", "1h"), {
    purged: 0,
  });
  const done = await cli(
    "purge",
    path,
    "--older-than",
    "0ms",
    "--state",
    "done",
  );
  assert.equal(done.code, 0, done.stderr);
  assert.equal(done.stdout, "purged 76 events (done) older than 0ms\n");
  let stats = await json("stats", path) as unknown as Summary;
  assert.deepEqual([stats.done, stats.dead], [0, 4]);
  assert.deepEqual(await json("purge", path, "--older-than", "0ms"), {
    purged: 4,
  });
  stats = await json("stats", path) as unknown as Summary;
  assert.deepEqual([stats.done, stats.dead, stats.queues.length], [0, 0, 0]);
});

Deno.test("read-only commands leave the file's bytes as they were, and never create a schema", async () => {
  const { dir, path } = await liveRun();
  const before = await Deno.readFile(path);
  for (
    const args of [
      ["stats", path],
      ["list", path, "dead"],
      ["explain", path, "1"],
    ]
  ) {
    assert.equal((await cli(...args)).code, 0);
  }
  assert.deepEqual(await Deno.readFile(path), before);

  const other = join(dir, "other.db");
  {
    await using db = await openSqliteWasm(other);
    await db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
  }
  const otherBefore = await Deno.readFile(other);
  for (const args of [["stats", other], ["retry", other, "1"]]) {
    const { code, stderr } = await cli(...args);
    assert.equal(code, 1);
    assert.equal(
      stderr,
      `outbox: cannot open ${other}: not an outbox database (no outbox tables)\n`,
    );
  }
  assert.deepEqual(await Deno.readFile(other), otherBefore);
});

Deno.test("a command waits for another connection's exclusive lock up to --busy-timeout, then fails with exit 1", async () => {
  const { path } = await liveRun();
  await using holder = await openSqliteWasm(path);
  await holder.exec("BEGIN EXCLUSIVE");
  const timedOut = await cli("stats", path, "--busy-timeout", "200ms");
  assert.equal(timedOut.code, 1);
  assert.match(
    timedOut.stderr,
    /^outbox: cannot open .*: locked by another connection for longer than --busy-timeout \(200 ms\)\n$/,
  );
  const waiting = cli("stats", path, "--json", "--busy-timeout", "30s");
  // Let go once the CLI is waiting (it needs a moment to start).
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  await holder.exec("COMMIT");
  const output = await waiting;
  assert.equal(output.code, 0, output.stderr);
  assert.equal(JSON.parse(output.stdout).done, 76);
});

Deno.test("usage errors exit 2 with the reason and the usage on stderr", async () => {
  const { path } = await liveRun();
  const cases: [string[], string][] = [
    [[], "no command given"],
    [
      ["frobnicate", path],
      "unknown command 'frobnicate' (commands: stats, list, explain, watch, redrive, retry, cancel, purge, pause, resume, limits, schedules, ui); see outbox --help",
    ],
    [["stats"], "stats needs a database"],
    [
      ["list", path],
      "list needs a state (pending, leased, dead or done): got none",
    ],
    [
      ["list", path, "sleeping"],
      'list needs a state (pending, leased, dead or done): got "sleeping"',
    ],
    [
      ["list", path, "dead", "--limit", "0"],
      '--limit must be an integer of at least 1: got "0"',
    ],
    [["explain", path], "explain needs an event id or identity"],
    [
      ["retry", path, "abc"],
      'event id must be an integer of at least 1: got "abc"',
    ],
    [["purge", path], "purge needs --older-than"],
    [
      ["purge", path, "--older-than", "1d", "--state", "leased"],
      '--state must be done or dead: got "leased"',
    ],
    [
      ["redrive", path, "3", "--queue", "mail"],
      "redrive takes event ids or --queue, not both",
    ],
    [["cancel", path], "cancel needs an event id"],
    [
      ["purge", path, "--older-than", "1d", "--queue", "mail"],
      "--queue does not apply to purge",
    ],
    [["stats", path, "--limit", "5"], "--limit does not apply to stats"],
    [
      ["purge", path, "--older-than", "7 days"],
      '--older-than must be a duration like 500ms, 30s, 15m, 12h, 7d or 1h30m: got "7 days"',
    ],
    [["stats", path, "--colour"], "Unknown option '--colour'"],
    [
      ["watch", path, "--interval", "0ms"],
      '--interval must be at least 1ms: got "0ms"',
    ],
    [
      ["watch", path, "--interval", "25d"],
      '--interval must be at most 24d: got "25d"',
    ],
    [
      ["stats", path, "--busy-timeout", "400d"],
      '--busy-timeout must be at most 365d: got "400d"',
    ],
    [
      ["stats", path, "--queue", ""],
      "Cannot select a queue as 'queue' must be a string of 1 to 1024 characters",
    ],
    [
      ["watch", path, "--queue", ""],
      "Cannot select a queue as 'queue' must be a string of 1 to 1024 characters",
    ],
    [
      ["cancel", path, ...Array.from({ length: 10_001 }, (_, i) => `${i + 1}`)],
      "cancel takes at most 10000 event ids: got 10001",
    ],
  ];
  for (const [args, reason] of cases) {
    const { code, stdout, stderr } = await cli(...args);
    assert.equal(code, 2, args.join(" "));
    assert.equal(stdout, "");
    assert.ok(stderr.startsWith(`outbox: ${reason}`), stderr);
    // The reason, and the command's synopsis when there is a command: not
    // the whole usage.
    assert.ok(stderr.trimEnd().endsWith("; see outbox --help"), stderr);
    assert.ok(stderr.trimEnd().split("\n").length <= 2, stderr);
  }
  const help = await cli("--help");
  assert.equal(help.code, 0);
  assert.match(help.stdout, /^Usage: outbox <command> <database>/);
});

Deno.test("a WAL-mode file that a live openNodeSqlite connection holds opens for read commands and for cancel", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "wal.db");
    await using outbox = await Outbox.open(await openNodeSqlite(path));
    const { eventId } = await outbox.enqueue({ n: 1 });
    await outbox.enqueue({ n: 2 });
    const stats = await json("stats", path) as unknown as Summary;
    assert.deepEqual([stats.pending, stats.done, stats.dead], [2, 0, 0]);
    assert.equal(
      (await json("explain", path, String(eventId)))["state"],
      "pending",
    );
    const { code, stdout, stderr } = await cli("cancel", path, String(eventId));
    assert.equal(code, 0, stderr);
    assert.equal(stdout, `cancelled 1 of 1: ${eventId}\n`);
    assert.equal((await outbox.explain(eventId))?.state, "dead");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("runtime errors exit 1 with one clear line: no such file, not SQLite, no PostgreSQL server there", async () => {
  const { dir } = await liveRun();
  const junk = join(dir, "junk.db");
  await Deno.writeTextFile(junk, "not a database, just text\n".repeat(100));
  const cases: [string, RegExp][] = [
    [
      join(dir, "missing.db"),
      /^outbox: cannot open .*missing\.db: unable to open database file: No such file or directory/,
    ],
    [
      junk,
      /^outbox: cannot open .*junk\.db: not an outbox database \(not SQLite\)$/,
    ],
    [
      "postgres://127.0.0.1:1/app",
      /^outbox: cannot open postgres:\/\/127\.0\.0\.1:1\/app: connect ECONNREFUSED 127\.0\.0\.1:1$/,
    ],
  ];
  for (const [database, message] of cases) {
    const { code, stderr } = await cli("stats", database);
    assert.equal(code, 1, stderr);
    assert.match(stderr.trimEnd(), message);
    assert.equal(stderr.trimEnd().split("\n").length, 1);
  }
  await Deno.stat(join(dir, "missing.db")).then(
    () => assert.fail("stats created the missing file"),
    (error) => assert.ok(error instanceof Deno.errors.NotFound),
  );
});

Deno.test("a read command on a file with a crashed writer's hot journal says how to recover it, and a write command recovers it", async () => {
  const path = await copyOfRun();
  // The CLI kills itself inside the transaction, after spilling pages.
  const crashed = await new Deno.Command("sqlite3", {
    args: [
      path,
      "PRAGMA journal_mode=truncate",
      "PRAGMA cache_size=2",
      "BEGIN",
      "CREATE TABLE spill(x)",
      "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 5000) INSERT INTO spill SELECT randomblob(200) FROM c",
      ".shell kill -9 $PPID",
    ],
    stdout: "null",
    stderr: "null",
  }).output();
  assert.equal(crashed.signal, "SIGKILL");
  assert.ok((await Deno.stat(`${path}-journal`)).size > 0);
  const before = await cli("stats", path);
  assert.equal(before.code, 1);
  assert.match(
    before.stderr,
    /hot journal, which only a read-write connection can roll back; open the database read-write once/,
  );
  const cancel = await cli("cancel", path, "999999");
  assert.equal(cancel.code, 0, cancel.stderr);
  assert.equal((await cli("stats", path)).code, 0);
  const tables = await new Deno.Command("sqlite3", {
    args: [
      path,
      "SELECT group_concat(name) FROM sqlite_schema WHERE name = 'spill'",
    ],
  }).output();
  assert.equal(new TextDecoder().decode(tables.stdout).trim(), "");
});

Deno.test("on a terminal the table's header is bold, and nothing else is coloured", async () => {
  const { path } = await liveRun();
  const lines: string[] = [];
  const code = await main(["stats", path], {
    color: true,
    stdout: (line) => lines.push(line),
  });
  assert.equal(code, 0);
  const [header, ...rest] = lines.join("\n").split("\n");
  const bold = "\x1b[1m";
  const normal = "\x1b[22m";
  assert.ok(header!.startsWith(`${bold}queue `), header);
  assert.ok(header!.endsWith(`acks last 60 s${normal}`), header);
  assert.ok(rest.every((line) => !line.includes("\x1b")));
});

/** A fresh file with `count` pending events `{ n, text }`, in a temp dir. */
async function pendingEvents(
  count: number,
  text = "x",
): Promise<{ dir: string; path: string; ids: number[] }> {
  const dir = await Deno.makeTempDir({ prefix: "cli-test-" });
  const path = join(dir, "outbox.db");
  await using outbox = await Outbox.open(await openSqliteWasm(path));
  const ids: number[] = [];
  for (let n = 1; n <= count; n++) {
    ids.push((await outbox.enqueue({ n, text })).eventId);
  }
  return { dir, path, ids };
}

Deno.test("list --limit says how many of how many it shows, and where the next page starts", async () => {
  const { dir, path, ids } = await pendingEvents(7);
  try {
    const first = await cli("list", path, "pending", "--limit", "5");
    assert.equal(first.code, 0, first.stderr);
    assert.equal(
      first.stdout.trimEnd().split("\n").at(-1),
      `showing 5 of 7 pending; next page: --after ${ids[4]}`,
    );
    const second = await cli(
      "list",
      path,
      "pending",
      "--limit",
      "5",
      "--after",
      String(ids[4]),
    );
    assert.equal(
      second.stdout.trimEnd().split("\n").at(-1),
      `showing 2 of 7 pending after id ${ids[4]}`,
    );
    const page = await json("list", path, "pending", "--limit", "5");
    assert.equal(page["total"], 7);
    assert.equal(page["next"], ids[4]);
    // A page that ends with the last event has no next page.
    const whole = await cli("list", path, "pending", "--limit", "7");
    assert.equal(
      whole.stdout.trimEnd().split("\n").at(-1),
      "showing 7 of 7 pending",
    );
    const last = await json(
      "list",
      path,
      "pending",
      "--after",
      String(ids[4]),
      "--limit",
      "2",
    );
    assert.equal(last["next"], null);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("list and explain show the start of the payload, and --full all of it", async () => {
  const long = "a".repeat(300);
  const { dir, path, ids } = await pendingEvents(1, long);
  try {
    const whole = JSON.stringify({ n: 1, text: long });
    const listed = await cli("list", path, "pending");
    assert.equal(listed.code, 0, listed.stderr);
    assert.match(listed.stdout, new RegExp(` ${whole.slice(0, 39)}… +-\n`));
    const full = await cli("list", path, "pending", "--full");
    assert.match(full.stdout, new RegExp(` ${whole} +-\n`));
    const explained = await cli("explain", path, String(ids[0]));
    assert.equal(explained.code, 0, explained.stderr);
    const lines = explained.stdout.split("\n");
    assert.equal(lines[2], `payload ${whole.slice(0, 199)}…`);
    const explainedFull = await cli("explain", path, String(ids[0]), "--full");
    assert.equal(explainedFull.stdout.split("\n")[2], `payload ${whole}`);
    const asJson = await json("explain", path, String(ids[0]));
    assert.deepEqual(asJson["payload"], { n: 1, text: long });
    assert.equal(typeof asJson["createdAt"], "number");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("cancel cancels the pending events named and says, for each one left alone, why", async () => {
  const { dir, path, ids } = await pendingEvents(4);
  try {
    {
      await using outbox = await Outbox.open(await openSqliteWasm(path));
      // A worker holds the first; the second was delivered; the third
      // failed once and is pending again.
      const [claimed] = await outbox.claim({ max: 1 });
      assert.equal(claimed?.eventId, ids[0]);
      const [last] = await outbox.claim({ max: 1 });
      await outbox.claim({ max: 1 }).then(async (leases) => {
        assert.equal(leases.length, 1);
        await outbox.release(leases[0]!);
      });
      assert.equal(await outbox.acknowledge(last!), true);
    }
    const named = [ids[0]!, ids[2]!, ids[3]!, ids[1]!, 999];
    const { code, stdout, stderr } = await cli(
      "cancel",
      path,
      ...named.map(String),
    );
    assert.equal(code, 0, stderr);
    assert.equal(
      stdout,
      [
        `cancelled 2 of 5: ${ids[2]} ${ids[3]}`,
        `left alone, being delivered by a worker (leased; cancel it again if it comes back to pending): ${
          ids[0]
        }`,
        `left alone, already delivered (done): ${ids[1]}`,
        "left alone, no such event: 999",
        "",
      ].join("\n"),
    );
    const again = await json("cancel", path, String(ids[2]));
    assert.deepEqual(again, {
      cancelled: [],
      leftAlone: [{
        id: ids[2],
        state: "dead",
        reason: "already cancelled (dead)",
      }],
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("stats, redrive and purge refuse a FIFO at once instead of waiting for a writer", async () => {
  const dir = await Deno.makeTempDir({ prefix: "cli-test-" });
  try {
    const fifo = join(dir, "outbox.db");
    const made = await new Deno.Command("mkfifo", { args: [fifo] }).output();
    assert.equal(made.code, 0);
    for (
      const args of [
        ["stats", fifo],
        ["redrive", fifo],
        ["purge", fifo, "--older-than", "1d"],
        ["stats", dir],
      ]
    ) {
      // Before, the first read of the FIFO's header never returned: the
      // signal ends such a run, which then fails on its exit code.
      const { code, stdout, stderr, signal } = await new Deno.Command(
        Deno.execPath(),
        {
          args: ["run", "-A", join(root, "cli.ts"), ...args],
          stdout: "piped",
          stderr: "piped",
          signal: AbortSignal.timeout(60_000),
        },
      ).output();
      assert.equal(signal, null, `${args.join(" ")} was still running`);
      assert.equal(code, 1);
      assert.equal(decoder.decode(stdout), "");
      assert.equal(
        decoder.decode(stderr),
        `outbox: cannot open ${args[1]}: not a regular file (it is ${
          args[1] === dir ? "a directory" : "a FIFO"
        })\n`,
      );
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("stats prints a field it does not know (a WAL's size) below its table", () => {
  const context = {
    color: false,
  } as Parameters<typeof summaryText>[0];
  const text = summaryText(context, {
    at: "2026-01-01T00:00:00.000Z",
    pending: 0,
    leased: 0,
    done: 0,
    dead: 0,
    oldestPendingAgeMs: 0,
    acknowledgedLastMinute: 0,
    queues: [],
    wal: { bytes: 4096, frames: 1 },
  });
  assert.equal(text.split("\n").at(-1), 'wal: {"bytes":4096,"frames":1}');
  assert.equal(text.split("\n").length, 3);
});

Deno.test("an unknown command is named as such, whatever follows it", async () => {
  const { code, stdout, stderr } = await cli("dashboard", "x.db");
  assert.equal(code, 2);
  assert.equal(stdout, "");
  assert.equal(
    stderr,
    "outbox: unknown command 'dashboard' (commands: stats, list, explain, watch, redrive, retry, cancel, purge, pause, resume, limits, schedules, ui); see outbox --help\n",
  );
});

Deno.test("explain prints a time past what a Date holds (written by another program) as the number stored, and exits 0", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "o.db");
    {
      const driver = await openSqliteWasm(path);
      await using outbox = await Outbox.open(driver);
      await outbox.enqueue({ n: 1 }, { queue: "mail" });
      const lease = await outbox.claim({ queue: "mail" });
      await outbox.release(lease!, { error: "boom" });
      await driver.run("UPDATE outbox_events SET created_at = ?1", [
        9_000_000_000_000_000,
      ]);
      await driver.run("UPDATE outbox_attempts SET at = ?1", [
        -9_000_000_000_000_000,
      ]);
    }
    const errors: string[] = [];
    const lines: string[] = [];
    const code = await main(["explain", path, "1"], {
      stdout: (line) => lines.push(line),
      stderr: (line) => errors.push(line),
      now: () => 1_700_000_000_000,
    });
    assert.equal(code, 0, errors.join("\n"));
    const text = lines.join("\n");
    assert.match(text, /enqueued 9000000000000000 ms since the epoch/);
    assert.match(text, /-9000000000000000 ms since the epoch/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("main() refuses args that are not an array of strings, or an io that is not a CliIo, with a TypeError naming the field", async () => {
  const cases: [unknown, unknown, string][] = [
    [
      5,
      {},
      "Cannot run outbox as 'args' must be an array of strings: current value is 5",
    ],
    [
      ["stats", 5],
      {},
      "Cannot run outbox as 'args' must be an array of strings: current value is an array",
    ],
    [
      ["stats"],
      5,
      "Cannot run outbox as 'io' must be an object: current value is 5",
    ],
    [
      ["stats"],
      { stdout: "x" },
      `Cannot run outbox as 'io.stdout' must be a function: current value is "x"`,
    ],
    [
      ["stats"],
      { colour: true },
      "Cannot run outbox as 'io.colour' is not an option: did you mean 'color'?",
    ],
    [
      ["stats"],
      { color: "yes" },
      `Cannot run outbox as 'io.color' must be a boolean: current value is "yes"`,
    ],
    [
      ["stats"],
      { signal: {} },
      "Cannot run outbox as 'io.signal' must be an AbortSignal: current value is an object",
    ],
  ];
  for (const [args, io, message] of cases) {
    await assert.rejects(
      () => main(args as never, io as never),
      (error: Error) =>
        error instanceof TypeError && error.message.startsWith(message),
      message,
    );
  }
});

Deno.test("the command line gives an option's own message for a negative value, refuses an option given twice, and says what explain takes", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "o.db");
    {
      await using outbox = await Outbox.open(await openSqliteWasm(path));
      await outbox.enqueue({ n: 1 }, { queue: "mail" });
    }
    const run = async (...args: string[]) => {
      const stdout: string[] = [];
      const stderr: string[] = [];
      const code = await main(args, {
        stdout: (line) => stdout.push(line),
        stderr: (line) => stderr.push(line),
        color: false,
      });
      return { code, stdout: stdout.join("\n"), stderr: stderr.join("\n") };
    };
    const cases: [string[], string][] = [
      [
        ["list", path, "pending", "--after", "-1"],
        '--after must be an integer of at least 0: got "-1"',
      ],
      [
        ["list", path, "pending", "--limit", "-5"],
        '--limit must be an integer of at least 1: got "-5"',
      ],
      [
        ["stats", path, "--busy-timeout", "-1s"],
        '--busy-timeout must be a duration like 500ms, 30s, 15m, 12h, 7d or 1h30m: got "-1s"',
      ],
      [
        ["ui", path, "--port", "-1"],
        '--port must be an integer of at least 0: got "-1"',
      ],
      [
        ["list", path, "pending", "--limit", "5", "--limit", "6"],
        "--limit may be given once: got it twice",
      ],
      [
        ["list", path, "pending", "--queue", "mail", "--queue=mail"],
        "--queue may be given once: got it twice",
      ],
      [
        ["stats", path, "--busy-timeout", "1s", "--busy-timeout", "2s"],
        "--busy-timeout may be given once: got it twice",
      ],
      // A value that is not a number still cannot look like an option.
      [
        ["list", path, "pending", "--queue", "--json"],
        "Option '--queue' argument is ambiguous.",
      ],
      [
        ["explain", path, "1.5"],
        'explain needs an event id (decimal digits) or identity (a UUID in canonical lowercase text): got "1.5"',
      ],
      [
        ["explain", path, " 1"],
        'explain needs an event id (decimal digits) or identity (a UUID in canonical lowercase text): got " 1"',
      ],
      [
        ["explain", path, "x\u2028y"],
        'explain needs an event id (decimal digits) or identity (a UUID in canonical lowercase text): got "x\\u2028y"',
      ],
    ];
    for (const [args, reason] of cases) {
      const { code, stdout, stderr } = await run(...args);
      assert.equal(code, 2, args.join(" "));
      assert.equal(stdout, "");
      assert.ok(stderr.startsWith(`outbox: ${reason}`), stderr);
    }
    // A repeatable option may be repeated; a value after "--" is an argument.
    const purged = await run(
      "purge",
      path,
      "--older-than",
      "1d",
      "--state",
      "done",
      "--state",
      "dead",
    );
    assert.equal(purged.code, 0, purged.stderr);
    const listed = await run("list", path, "pending", "--json", "--", "-1");
    assert.equal(listed.code, 2);
    assert.match(listed.stderr, /^outbox: unexpected -1\n/);
    const explained = await run("explain", path, "01");
    assert.equal(explained.code, 0, explained.stderr);
    assert.match(explained.stdout, /^event 1 \(/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
