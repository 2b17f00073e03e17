/**
 * `deno task demo`: the whole product on real processes, a real database
 * file and a real HTTP recipient on 127.0.0.1 with a second database and
 * an inbox.
 *
 * 1. The seed scenario on two connections to a file.
 * 2. A producer process commits N orders, each with its event; three worker
 *    processes deliver them to the recipient, which dedupes on each event's
 *    identity with its inbox. Midway one worker is killed
 *    (SIGKILL) and another is paused past its lease (SIGSTOP, then SIGCONT),
 *    so its late acknowledgements come back stale. Poison events end in the
 *    dead letters.
 * 3. A summary; the exit code is 1 when any event was lost, acknowledged
 *    twice, or had its effect applied other than exactly once.
 *
 * Usage: `deno run -A demo.ts [PATH | --postgres] [--events 2000]
 * [--poison 5] [--lease-ms 2000] [--latency-ms 5] [--json]`. PATH is a
 * database file that must not exist yet, nor PATH.recipient.db beside it,
 * the recipient's database (default: both in a new temporary directory,
 * removed when the demo exits).
 *
 * `--postgres` runs the outbox on PostgreSQL: at `DATABASE_URL` when set, in
 * a new schema (and one for the seed scenario) dropped at exit; otherwise on
 * a server the demo starts and stops, as the tests do
 * (`scripts/postgres_server.ts`). The recipient's inbox is then on
 * PostgreSQL too, in a schema of its own beside the outbox's, dropped at
 * exit.
 *
 * @module
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { BusyError, type Outbox, type Row } from "./mod.ts";
import { type Engine, lazy, postgresEngine, sqliteEngine } from "./demo/db.ts";
import { startReceiver } from "./demo/receiver.ts";

const root = dirname(fileURLToPath(import.meta.url));
// node:util's parser refuses unknown flags and missing values, so a typo
// never silently runs the default demo.
const usage =
  "usage: deno task demo [PATH | --postgres] [--events N] [--poison N] [--lease-ms N] [--latency-ms N] [--json]";
let parsed;
try {
  parsed = parseArgs({
    // `deno task demo -- --events 5` passes the `--` along.
    args: Deno.args[0] === "--" ? Deno.args.slice(1) : Deno.args,
    allowPositionals: true,
    options: {
      events: { type: "string" },
      poison: { type: "string" },
      "lease-ms": { type: "string" },
      "latency-ms": { type: "string" },
      json: { type: "boolean" },
      postgres: { type: "boolean" },
    },
  });
  if (parsed.positionals.length > 1) throw new TypeError("one PATH at most");
  if (parsed.values.postgres && parsed.positionals.length > 0) {
    throw new TypeError(
      "PATH names a SQLite file: with --postgres, set DATABASE_URL instead",
    );
  }
} catch (error) {
  console.error(`${(error as Error).message}\n${usage}`);
  Deno.exit(2);
}
const integer = (name: keyof typeof parsed.values, fallback: number) => {
  const text = parsed.values[name];
  if (typeof text !== "string") return fallback;
  const value = Number(text);
  if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(value)) {
    console.error(
      `--${name} must be a non-negative integer: current value is ${text}\n${usage}`,
    );
    Deno.exit(2);
  }
  return value;
};
const events = integer("events", 2_000);
const poison = Math.min(integer("poison", 5), events);
const leaseMs = Math.max(100, integer("lease-ms", 2_000));
const latencyMs = integer("latency-ms", 5);
const json = parsed.values.json === true;
const path = parsed.positionals[0];
const postgres = parsed.values.postgres === true;

for (
  const file of path === undefined ? [] : [path, `${path}.recipient.db`]
) {
  if (await exists(file)) {
    console.error(`${file} exists already: give the demo a new file name`);
    Deno.exit(2);
  }
}
const children = new Set<Deno.ChildProcess>();
const tempDir = path === undefined
  ? await Deno.makeTempDir({ prefix: "leased-outbox-demo-" })
  : undefined;
// However the demo ends (done, failed, thrown, interrupted), no worker or
// producer outlives it and its temporary directory goes; a file the caller
// named stays.
const cleanUp = () => {
  for (const child of children) {
    try {
      child.kill("SIGKILL");
    } catch {
      // It exited already.
    }
  }
  children.clear();
  if (tempDir !== undefined) Deno.removeSync(tempDir, { recursive: true });
};
globalThis.addEventListener("unload", cleanUp);
globalThis.addEventListener("unhandledrejection", cleanUp);
Deno.addSignalListener("SIGINT", () => Deno.exit(130));
Deno.addSignalListener("SIGTERM", () => Deno.exit(143));
const dbPath = path ?? join(tempDir!, "outbox.db");

const databaseUrl = postgres ? Deno.env.get("DATABASE_URL") : undefined;
const server = postgres && databaseUrl === undefined
  ? await (await lazy<typeof import("./scripts/postgres_server.ts")>(
    "../scripts/postgres_server.ts",
  )).startPostgres()
  : undefined;
const engine: Engine = postgres
  ? await postgresEngine(
    databaseUrl ?? server!.url,
    `leased_outbox_demo_${crypto.randomUUID().slice(0, 8)}`,
    false,
  )
  : sqliteEngine(dbPath);

console.log(`leased-outbox demo · ${engine.name}`);
if (server !== undefined) {
  console.log(
    `server started for the demo on 127.0.0.1:${server.port} (stopped at exit)`,
  );
}
console.log(
  `database ${engine.where}${
    postgres
      ? " (dropped at exit)"
      : tempDir === undefined
      ? ""
      : " (removed at exit)"
  }`,
);
console.log(`recipient database ${engine.recipient.where}\n`);

// 1. The seed scenario, on two connections to one file.
{
  let clockMs = 0;
  const open = () => engine.openSeedOutbox(() => clockMs);
  await using first = await open();
  await using second = await open();
  await first.transaction((tx) =>
    tx.run(
      "INSERT INTO outbox_events (id, identity, queue, state, payload, due_at, max_attempts, created_at, updated_at) VALUES (41, '00000000-0000-7000-8000-000000000041', 'default', 'pending', 'null', 0, 5, 0, 0)",
    )
  );
  const claim = async (outbox: Outbox, at: number, token: string) => {
    clockMs = at;
    return await outbox.claim({ token });
  };
  const leaseA = await claim(first, 100, "claimA");
  const active = await claim(second, 109, "claimB");
  const leaseB = await claim(second, 110, "claimB");
  const staleAck = await first.acknowledge(leaseA!);
  const currentAck = await second.acknowledge(leaseB!);
  const afterAck = await claim(first, 120, "claimC");
  console.log(
    `Seed scenario on ${engine.seedWhere} (two connections, lease 10 ms):`,
  );
  const rows: [string, unknown][] = [
    ["first claim       claim(first, 100, claimA)", leaseA?.eventId ?? null],
    ["active lease      claim(second, 109, claimB)", active?.eventId ?? null],
    ["reclaimed         claim(second, 110, claimB)", leaseB?.eventId ?? null],
    ["stale ack         acknowledge(first, 41, claimA)", staleAck],
    ["current ack       acknowledge(second, 41, claimB)", currentAck],
    ["after ack         claim(first, 120, claimC)", afterAck?.eventId ?? null],
  ];
  for (const [label, value] of rows) {
    console.log(`  ${label.padEnd(50)} → ${value}`);
  }
  console.log();
}

// 2. The run: a producer, three workers, a recipient, a crash and a pause.
const receiver = await startReceiver(engine.recipient, latencyMs);
const setup = await engine.openOutbox({ busyTimeoutMs: 1_000 });
await setup.transaction(async (tx) => {
  for (const sql of engine.setupSql) await tx.run(sql);
});
const monitor = await engine.openMonitor();

console.log(
  `Run: 1 producer writes ${events} orders (${poison} poison), 3 workers deliver to ${receiver.url} (an inbox)`,
);
console.log(
  `     lease ${leaseMs} ms, 4 handlers per worker, recipient latency ${latencyMs} ms\n`,
);

function spawn(
  script: string,
  name: string,
  extra: string[],
): Deno.ChildProcess {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--quiet",
      join(root, script),
      ...engine.argsFor(name),
      ...extra,
    ],
    cwd: root,
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  children.add(child);
  child.status.then(() => children.delete(child));
  return child;
}

const startedAt = performance.now();
const elapsedS = () => (performance.now() - startedAt) / 1_000;
const names = ["w1", "w2", "w3"];
const workers = await Promise.all(
  names.map((name) =>
    spawn("demo/worker.ts", name, [
      "--url",
      receiver.url,
      "--name",
      name,
      "--lease-ms",
      String(leaseMs),
    ])
  ),
);
const workerOutputs = workers.map((child) => child.output());
const producer = spawn("demo/producer.ts", "producer", [
  "--events",
  String(events),
  "--poison",
  String(poison),
]);
let producerDone = false;
const producerStatus = producer.output().then((output) => {
  producerDone = true;
  return output;
});

const fate = new Map<string, string>([
  ["w1", "running"],
  ["w2", "running"],
  ["w3", "running"],
]);
let killedAt: number | undefined;
let pause: Promise<void> | undefined;
let paused = false;

/**
 * Pauses w2 between its deliveries and their acknowledgements, the moment
 * fencing exists for (a GC pause, a frozen VM): the demo holds w2's
 * statements for 100 ms (on SQLite by taking the write lock, on PostgreSQL
 * in a relay between w2 and the server), so w2's finished handlers queue
 * their acknowledgements, and stops w2 then, at a moment it has no
 * transaction open (else it resumes w2 and tries again). The pause lasts at
 * least 2.5 leases and until every event leased at that moment was finished
 * or claimed again by someone else (lapsed leases queue behind older
 * pending events), so w2's late acknowledgements meet newer fences.
 */
async function pauseWorker(child: Deno.ChildProcess): Promise<void> {
  let retries = 0;
  let hold;
  for (;;) {
    hold = await engine.hold("w2", setup, monitor);
    await delay(100);
    child.kill("SIGSTOP");
    if (await hold.stopped()) break;
    if (retries >= 20) {
      throw new Error("w2 had a transaction open at each of 21 stops");
    }
    hold.resume();
    child.kill("SIGCONT");
    retries++;
    await delay(20);
  }
  paused = true;
  const pausedAt = elapsedS();
  fate.set("w2", "paused");
  const held = await read(
    `SELECT id, fence FROM ${engine.eventsTable} WHERE state = 'leased'`,
  );
  const fences = new Map(held.map((row) => [row["id"], row["fence"]]));
  for (;;) {
    await delay(100);
    const pausedS = elapsedS() - pausedAt;
    if (pausedS < leaseMs * 2.5 / 1_000) continue;
    if (pausedS > 30) break;
    const rows = await read(
      `SELECT id, state, fence FROM ${engine.eventsTable} WHERE id IN (${
        [...fences.keys()].join(",") || "NULL"
      })`,
    );
    const waiting = rows.filter((row) =>
      row["state"] === "leased" && row["fence"] === fences.get(row["id"])
    );
    if (waiting.length === 0) break;
  }
  hold.resume();
  child.kill("SIGCONT");
  paused = false;
  fate.set(
    "w2",
    `SIGSTOP at ${pausedAt.toFixed(1)} s for ${
      (elapsedS() - pausedAt).toFixed(1)
    } s, then SIGCONT${
      retries > 0
        ? ` (stopped ${retries + 1} times: it had a transaction open)`
        : ""
    }`,
  );
}

/** A read on the monitor connection, retried while a writer commits. */
async function read(sql: string): Promise<Row[]> {
  for (;;) {
    try {
      return await monitor.query(sql);
    } catch (error) {
      if (!(error instanceof BusyError)) throw error;
      await delay(5);
    }
  }
}

const tty = Deno.stdout.isTerminal();
const encoder = new TextEncoder();
let lastLine = 0;
const nonPoison = events - poison;
const timeoutS = 60 + events * 0.05;
let counts = { pending: 0, leased: 0, done: 0, dead: 0 };
let timedOut = false;
for (;;) {
  await delay(100);
  const rows = await read(
    `SELECT state, count(*) AS n FROM ${engine.eventsTable} GROUP BY state`,
  );
  counts = { pending: 0, leased: 0, done: 0, dead: 0 };
  for (const row of rows) {
    counts[row["state"] as keyof typeof counts] = Number(row["n"]);
  }
  const delivered = receiver.fences.size;
  if (killedAt === undefined && delivered >= nonPoison * 0.25) {
    workers[0]!.kill("SIGKILL");
    killedAt = elapsedS();
    fate.set("w1", `SIGKILL at ${killedAt.toFixed(1)} s`);
  }
  if (
    killedAt !== undefined && pause === undefined &&
    delivered >= nonPoison * 0.7
  ) {
    pause = pauseWorker(workers[1]!);
  }
  const produced = counts.pending + counts.leased + counts.done + counts.dead;
  const line = `[${elapsedS().toFixed(1).padStart(5)} s] produced ${
    String(produced).padStart(String(events).length)
  }/${events} · delivered ${delivered} · done ${counts.done} · dead ${counts.dead} · leased ${counts.leased} · w1 ${
    killedAt === undefined ? "up" : "killed"
  } · w2 ${paused ? "PAUSED" : "up"}`;
  if (tty) {
    await Deno.stdout.write(encoder.encode(`\r${line}\x1b[K`));
  } else if (performance.now() - lastLine >= 1_000) {
    console.log(line);
    lastLine = performance.now();
  }
  const finished = producerDone && counts.done + counts.dead === events;
  if (finished && pause !== undefined) {
    await pause;
    break;
  }
  if (elapsedS() > timeoutS) {
    timedOut = true;
    break;
  }
}
const elapsed = elapsedS();
if (tty) console.log();

// Graceful stop: each live worker finishes or releases what it holds.
for (const child of workers.slice(1)) {
  child.kill("SIGCONT");
  child.kill("SIGTERM");
}
const decoder = new TextDecoder();
const outputs = await Promise.all(workerOutputs);
await producerStatus;
const counters = outputs.map((output) => {
  const last = decoder.decode(output.stdout).trim().split("\n").at(-1);
  return last ? JSON.parse(last) as Record<string, number> : undefined;
});

// 3. The verdict, from the database and the receiver.
const one = async (sql: string): Promise<number> =>
  Number(Object.values((await read(sql))[0] ?? {})[0] ?? 0);
const eventCount = await one(`SELECT count(*) FROM ${engine.eventsTable}`);
const orderCount = await one("SELECT count(*) FROM orders");
const ordersWithoutEvent = await one(
  `SELECT count(*) FROM orders AS o WHERE NOT EXISTS (SELECT 1 FROM ${engine.eventsTable} AS e WHERE e.dedup_key = 'order-' || o.id)`,
);
const rows = await read(
  `SELECT e.id, e.identity, e.state, ${engine.poisonSql} AS poison, e.attempt,
     (SELECT count(*) FROM outbox_ledger AS a WHERE a.event_id = e.id AND a.kind = 'acknowledged') AS acks
   FROM ${engine.eventsTable} AS e`,
);
// How many times each identity's effect was applied, from the recipient's
// own database.
const recipient = await engine.recipient.open();
const applied = new Map(
  (await recipient.query("SELECT identity, applied FROM shipments")).map((
    row,
  ) => [String(row["identity"]), Number(row["applied"])]),
);
const [{ n: inboxRecords = 0 } = {}] = await recipient.query(
  "SELECT count(*) AS n FROM inbox_accepted",
);
const recipientIntegrity = await engine.recipient.integrity(recipient);
await recipient.close();
let appliedTwice = 0;
for (const times of applied.values()) if (times > 1) appliedTwice++;
let lost = 0;
let effectsLost = 0;
let acknowledgedTwice = 0;
let unexpectedDead = 0;
let poisonDead = 0;
const poisonAttempts = new Set<number>();
for (const row of rows) {
  if (Number(row["acks"]) > 1) acknowledgedTwice++;
  if (row["poison"] === 1) {
    if (row["state"] === "dead") {
      poisonDead++;
      poisonAttempts.add(Number(row["attempt"]));
    } else lost++;
    continue;
  }
  if (row["state"] === "dead") unexpectedDead++;
  if (row["state"] !== "done") lost++;
  // Done without its effect at the recipient is a lost event too.
  else if (!applied.has(String(row["identity"]))) effectsLost++;
}
lost += events - eventCount + ordersWithoutEvent;
const staleAcknowledgements = await one(
  "SELECT count(*) FROM outbox_ledger WHERE kind = 'stale_acknowledge'",
);
const expiredLeases = await one(
  "SELECT count(*) FROM outbox_ledger WHERE kind = 'expired'",
);
const redeliveryFences = new Map<number, number>();
for (const fences of receiver.fences.values()) {
  for (const fence of fences.slice(1)) {
    redeliveryFences.set(fence, (redeliveryFences.get(fence) ?? 0) + 1);
  }
}
const redeliveries = [...redeliveryFences.values()].reduce((a, b) => a + b, 0);
const deliveredEvents = applied.size;
const deliveries = [...receiver.fences.values()].reduce(
  (sum, fences) => sum + fences.length,
  0,
);
const integrity = await engine.integrity(monitor);
const deadLetters = await setup.deadLetters({ limit: 10_000 });
await monitor.close();
await setup.close();
await receiver[Symbol.asyncDispose]();
await engine.close();
await server?.stop();

const ok = !timedOut && lost === 0 && effectsLost === 0 &&
  appliedTwice === 0 && acknowledgedTwice === 0 && unexpectedDead === 0 &&
  integrity === "ok" && recipientIntegrity === "ok" &&
  orderCount === events && deliveredEvents === nonPoison &&
  Number(inboxRecords) === deliveredEvents;
const fenceText = [...redeliveryFences.entries()].sort(([a], [b]) => a - b)
  .map(([fence, n]) => `fence ${fence} ×${n}`).join(", ");
const summary: [string, string][] = [
  ["events (orders committed with their event)", `${eventCount}`],
  [
    "delivered (events whose effect the recipient applied)",
    `${deliveredEvents} of ${nonPoison}`,
  ],
  [
    "deliveries received (inbox, deduped by identity)",
    `${deliveries}: ${receiver.accepted} accepted, ${receiver.duplicates} duplicate, ${receiver.stale} stale (+${receiver.refused} poison refusals)`,
  ],
  [
    "effects applied once / twice / lost",
    `${deliveredEvents - appliedTwice} / ${appliedTwice} / ${effectsLost}`,
  ],
  ["redeliveries", `${redeliveries}${fenceText ? ` (${fenceText})` : ""}`],
  ["expired leases taken over", `${expiredLeases}`],
  ["stale acknowledgements rejected", `${staleAcknowledgements}`],
  [
    "dead letters",
    `${deadLetters.length} (${poisonDead} poison after ${
      [...poisonAttempts].join("/") || "-"
    } attempts, last error "${deadLetters[0]?.lastError ?? "-"}"${
      unexpectedDead > 0 ? `, ${unexpectedDead} NOT poison` : ""
    })`,
  ],
  ["lost / acknowledged twice", `${lost} / ${acknowledgedTwice}`],
  [
    "integrity_check (outbox, recipient)",
    `${integrity}, ${recipientIntegrity}`,
  ],
  ["elapsed", `${elapsed.toFixed(1)} s${timedOut ? " (TIMED OUT)" : ""}`],
  ["throughput", `${(events / elapsed).toFixed(1)} events/s`],
];
const width = Math.max(...summary.map(([label]) => label.length));
console.log("\nSummary");
for (const [label, value] of summary) {
  console.log(`  ${label.padEnd(width)}  ${value}`);
}
console.log("\nWorkers");
const header = [
  "claimed",
  "acked",
  "stale acks",
  "leases lost",
  "released",
  "dead",
];
console.log(
  `  ${"".padEnd(4)}${header.map((h) => h.padStart(12)).join("")}  fate`,
);
for (const [i, name] of names.entries()) {
  const c = counters[i];
  const cells = c === undefined
    ? header.map(() => "-".padStart(12)).join("")
    : [
      c["claimed"],
      c["acknowledged"],
      c["staleAcknowledgements"],
      c["leasesLost"],
      c["released"],
      c["dead"],
    ].map((n) => String(n).padStart(12)).join("");
  console.log(`  ${name.padEnd(4)}${cells}  ${fate.get(name)}`);
}
console.log(
  `\n${
    ok ? "OK" : "FAILED"
  }: every event's effect applied exactly once and every event acknowledged once, poison in the dead letters${
    ok ? "" : " — see above"
  }`,
);
if (json) {
  console.log(JSON.stringify({
    events: eventCount,
    orders: orderCount,
    delivered: deliveredEvents,
    deliveries,
    accepted: receiver.accepted,
    duplicates: receiver.duplicates,
    stale: receiver.stale,
    appliedOnce: deliveredEvents - appliedTwice,
    appliedTwice,
    effectsLost,
    inboxRecords: Number(inboxRecords),
    recipientIntegrity,
    redeliveries,
    redeliveryFences: Object.fromEntries(redeliveryFences),
    expiredLeases,
    staleAcknowledgements,
    deadLetters: deadLetters.length,
    poisonDead,
    unexpectedDead,
    lost,
    acknowledgedTwice,
    integrity,
    elapsedS: elapsed,
    workers: Object.fromEntries(
      names.map((name, i) => [name, counters[i] ?? null]),
    ),
    ok,
  }));
}
Deno.exit(ok ? 0 : 1);

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function exists(file: string): Promise<boolean> {
  try {
    await Deno.lstat(file);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}
