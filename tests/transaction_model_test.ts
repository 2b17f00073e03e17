/**
 * Model-based: random `fn` bodies mix writes, enqueues, a fenced
 * acknowledgement and statements that end or fail the transaction (a
 * trigger's RAISE(ROLLBACK), INSERT OR ROLLBACK, a constraint, a deferred
 * constraint checked at COMMIT, PostgreSQL's statement timeout), each
 * caught by `fn` or not. The invariant: when `transaction()` resolves,
 * every write and enqueue of `fn` that succeeded is in the database and the
 * acknowledged lease is done; when it rejects, none of them is, and the
 * lease is still leased. For the inbox: the identity is recorded if and
 * only if the effect committed.
 */
import assert from "node:assert/strict";
import fc from "npm:fast-check@4.11.0";
import type { Driver } from "../driver.ts";
import { Inbox, Outbox, uuidv7 } from "../mod.ts";
import { type DriverCase, DRIVERS } from "./drivers.ts";

const ON = ["wasm file", "node:sqlite file", "postgres"];
const RUNS = Number(Deno.env.get("TX_MODEL_RUNS") ?? 60);

type Failure = "constraint" | "raise" | "orRollback" | "deferred" | "timeout";

type Op =
  | {
    readonly kind: "write" | "enqueue" | "acknowledge";
    readonly caught: boolean;
  }
  | {
    readonly kind: "fail";
    readonly failure: Failure;
    readonly caught: boolean;
  };

function failures(engine: DriverCase["engine"]): Failure[] {
  return engine === "sqlite"
    ? ["constraint", "raise", "orRollback", "deferred"]
    : ["constraint", "deferred", "timeout"];
}

function ops(
  engine: DriverCase["engine"],
  withAck: boolean,
): fc.Arbitrary<Op[]> {
  const kinds: ("write" | "enqueue" | "acknowledge")[] = withAck
    ? ["write", "enqueue", "acknowledge"]
    : ["write"];
  return fc.array(
    fc.oneof(
      {
        weight: 3,
        arbitrary: fc.record({
          kind: fc.constantFrom(...kinds),
          caught: fc.boolean(),
        }),
      },
      {
        weight: 1,
        arbitrary: fc.record({
          kind: fc.constant("fail" as const),
          failure: fc.constantFrom(...failures(engine)),
          caught: fc.boolean(),
        }),
      },
    ),
    { maxLength: 6 },
  );
}

/** The schema the bodies write to; `uniq` holds the row a constraint meets. */
async function schema(db: Driver, engine: DriverCase["engine"]): Promise<void> {
  // Checked only at COMMIT, on both engines.
  const deferred = "REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED";
  await db.exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY);
    CREATE TABLE uniq (k INTEGER PRIMARY KEY);
    INSERT INTO uniq (k) VALUES (0);
    CREATE TABLE parent (id INTEGER PRIMARY KEY);
    CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER ${deferred})`);
  if (engine === "sqlite") {
    await db.exec(`PRAGMA foreign_keys = ON;
      CREATE TABLE guard (x INTEGER);
      CREATE TRIGGER guard_rollback BEFORE INSERT ON guard
        BEGIN SELECT RAISE(ROLLBACK, 'refused'); END`);
  }
}

/** Runs one failing statement of `failure`'s kind through `run`. */
async function fail(
  run: (sql: string) => Promise<unknown>,
  failure: Failure,
  key: number,
): Promise<void> {
  switch (failure) {
    case "constraint":
      await run("INSERT INTO uniq (k) VALUES (0)");
      break;
    case "raise":
      await run("INSERT INTO guard VALUES (1)");
      break;
    case "orRollback":
      await run("INSERT OR ROLLBACK INTO uniq (k) VALUES (0)");
      break;
    case "deferred":
      // Succeeds now; the COMMIT refuses it.
      await run(`INSERT INTO child (id, parent) VALUES (${key}, -1)`);
      break;
    case "timeout":
      await run("SET LOCAL statement_timeout = 20");
      await run("SELECT pg_sleep(1)");
      break;
  }
}

async function ids(db: Driver, table: string): Promise<Set<number>> {
  const rows = await db.query(`SELECT id FROM ${table}`);
  return new Set(rows.map((row) => Number(row["id"])));
}

/** The keys of the pending events the bodies enqueued. */
async function keys(outbox: Outbox): Promise<Set<number>> {
  const pending = await outbox.list({ state: "pending", limit: 10_000 });
  return new Set(
    pending.filter((e) => e.payload !== "work").map((e) =>
      (e.payload as { key: number }).key
    ),
  );
}

async function identities(db: Driver): Promise<Set<string>> {
  const rows = await db.query("SELECT identity FROM inbox_accepted");
  return new Set(rows.map((row) => String(row["identity"])));
}

/** Runs `fn` on a fresh database of `driver` holding the bodies' schema. */
async function withDatabase(
  driver: DriverCase,
  fn: (db: Driver) => Promise<void>,
): Promise<void> {
  const connections = await driver.open(1);
  try {
    await schema(connections.drivers[0]!, driver.engine);
    await fn(connections.drivers[0]!);
  } finally {
    await connections.close();
  }
}

/**
 * Plays `body`, each op with a fresh key, through `step`: an op marked
 * `caught` has its error caught, as application code often does.
 */
async function play(
  body: readonly Op[],
  key: () => number,
  step: (op: Op, key: number) => Promise<void>,
): Promise<void> {
  for (const op of body) {
    const run = step(op, key());
    if (op.caught) await run.catch(() => {});
    else await run;
  }
}

for (const driver of DRIVERS.filter((d) => ON.includes(d.name))) {
  Deno.test(`${driver.name}: transaction() resolves with every write and enqueue of fn committed, or rejects with none, whatever statement ends or fails it`, async () => {
    await withDatabase(driver, async (db) => {
      await using outbox = await Outbox.open(db);
      let next = 1;
      await fc.assert(
        fc.asyncProperty(ops(driver.engine, true), async (body) => {
          // In a queue of its own, so the claim never takes a body's event.
          await outbox.enqueue("work", { queue: "work" });
          const lease = (await outbox.claim({ queue: "work" }))!;
          const orders = await ids(db, "orders");
          const events = await keys(outbox);
          const wrote: number[] = [];
          const enqueued: number[] = [];
          let acknowledged = false;
          const outcome = await outbox.transaction((tx) =>
            play(body, () => next++, async (op, key) => {
              if (op.kind === "write") {
                await tx.run(`INSERT INTO orders (id) VALUES (${key})`);
                wrote.push(key);
              } else if (op.kind === "enqueue") {
                await tx.enqueue({ key });
                enqueued.push(key);
              } else if (op.kind === "acknowledge") {
                if (acknowledged) return;
                await tx.acknowledge(lease);
                acknowledged = true;
              } else if (op.kind === "fail") {
                await fail((sql) => tx.run(sql), op.failure, key);
              }
            })
          ).then(() => true, () => false);
          if (outcome) {
            for (const key of wrote) orders.add(key);
            for (const key of enqueued) events.add(key);
          }
          assert.deepEqual(await ids(db, "orders"), orders);
          assert.deepEqual(await keys(outbox), events);
          assert.equal(
            (await outbox.explain(lease.eventId))?.state,
            outcome && acknowledged ? "done" : "leased",
          );
          // Nothing of a rejected body is left behind either.
          assert.equal((await ids(db, "child")).size, 0);
          assert.equal(db.transactionStatus?.() ?? "idle", "idle");
          // The lease's event must not block the next claim.
          if (!(outcome && acknowledged)) {
            await outbox.release(lease);
            await outbox.cancel(lease.eventId);
          }
        }),
        { numRuns: RUNS },
      );
    });
  });

  Deno.test(`${driver.name}: an inbox records the identity if and only if the effect committed, whatever statement ends or fails its transaction`, async () => {
    await withDatabase(driver, async (db) => {
      await using inbox = await Inbox.open(db);
      let next = 1;
      await fc.assert(
        fc.asyncProperty(ops(driver.engine, false), async (body) => {
          const identity = uuidv7();
          const wrote: number[] = [];
          const orders = await ids(db, "orders");
          const accepted = await identities(db);
          const outcome = await inbox.accept(
            identity,
            1,
            (tx) =>
              play(body, () => next++, async (op, key) => {
                if (op.kind === "fail") {
                  await fail((sql) => tx.run(sql), op.failure, key);
                } else {
                  await tx.run(`INSERT INTO orders (id) VALUES (${key})`);
                  wrote.push(key);
                }
              }),
          ).then((result) => result.status === "accepted", () => false);
          if (outcome) {
            for (const key of wrote) orders.add(key);
            accepted.add(identity);
          }
          assert.deepEqual(await ids(db, "orders"), orders);
          assert.deepEqual(await identities(db), accepted);
          assert.equal((await ids(db, "child")).size, 0);
        }),
        { numRuns: RUNS },
      );
    });
  });
}
