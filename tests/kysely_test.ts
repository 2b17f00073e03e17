/**
 * A real query builder end to end: Kysely over the application's own
 * node:sqlite handle, with the outbox on the same handle. Business rows go
 * through the builder and the event joins the builder's transaction.
 */
import assert from "node:assert/strict";
import { DatabaseSync, type SQLInputValue } from "node:sqlite";
import { type Generated, Kysely, SqliteDialect } from "npm:kysely@0.29.9";
import { LeaseLostError, Outbox } from "../mod.ts";
import { nodeSqliteDriver } from "../drivers/node_sqlite.ts";
import { ManualClock } from "./helpers.ts";

interface Schema {
  orders: { id: Generated<number>; total: number };
  effects: { id: Generated<number>; event_id: number };
}

/**
 * Kysely's SqliteDialect takes a better-sqlite3-like database; node:sqlite's
 * DatabaseSync differs in spreading its parameters, naming `reader`
 * `columns()` and returning rows without a prototype.
 */
function kyselyOver(db: DatabaseSync): Kysely<Schema> {
  return new Kysely<Schema>({
    dialect: new SqliteDialect({
      database: {
        close: () => db.close(),
        prepare(sql) {
          const statement = db.prepare(sql);
          const args = (params: readonly unknown[]) =>
            params as SQLInputValue[];
          return {
            reader: statement.columns().length > 0,
            all: (params) =>
              statement.all(...args(params)).map((row) => ({ ...row })),
            run: (params) => statement.run(...args(params)),
            iterate: (params) => statement.iterate(...args(params)),
          };
        },
      },
    }),
  });
}

async function setup() {
  const db = new DatabaseSync(":memory:");
  const kysely = kyselyOver(db);
  await kysely.schema.createTable("orders")
    .addColumn("id", "integer", (c) => c.primaryKey())
    .addColumn("total", "integer", (c) => c.notNull())
    .execute();
  await kysely.schema.createTable("effects")
    .addColumn("id", "integer", (c) => c.primaryKey())
    .addColumn("event_id", "integer", (c) => c.notNull())
    .execute();
  const clock = new ManualClock(1_000);
  const outbox = await Outbox.open(nodeSqliteDriver(db), { now: clock.now });
  return {
    db,
    kysely,
    clock,
    outbox,
    async [Symbol.asyncDispose]() {
      await outbox.close();
      // Kysely's destroy() closes the handle it was given.
      await kysely.destroy();
    },
  };
}

Deno.test("Kysely: an order inserted through the builder and its event commit together in the builder's transaction", async () => {
  await using app = await setup();
  const id = await app.kysely.transaction().execute(async (trx) => {
    const order = await trx.insertInto("orders").values({ total: 4200 })
      .returning("id").executeTakeFirstOrThrow();
    await app.outbox.within(() =>
      app.outbox.enqueue({ type: "order.placed", order: order.id })
    );
    return order.id;
  });
  assert.deepEqual(
    await app.kysely.selectFrom("orders").selectAll().execute(),
    [{ id, total: 4200 }],
  );
  const lease = await app.outbox.claim();
  assert.deepEqual(lease?.payload, { type: "order.placed", order: id });
});

Deno.test("Kysely: a rollback of the builder's transaction drops the order and its event", async () => {
  await using app = await setup();
  await assert.rejects(
    () =>
      app.kysely.transaction().execute(async (trx) => {
        await trx.insertInto("orders").values({ total: 1 }).execute();
        await app.outbox.within(() =>
          app.outbox.enqueue({ type: "order.placed" })
        );
        throw new Error("payment declined");
      }),
    /payment declined/,
  );
  assert.deepEqual(
    await app.kysely.selectFrom("orders").selectAll().execute(),
    [],
  );
  assert.deepEqual(await app.outbox.stats(), {
    pending: 0,
    leased: 0,
    done: 0,
    dead: 0,
    oldestPendingAgeMs: 0,
  });
});

Deno.test("Kysely: a handler's effect and its fenced acknowledgement commit together, and a stale lease rolls the effect back", async () => {
  await using app = await setup();
  await app.outbox.enqueue("e1");
  const stale = (await app.outbox.claim({ leaseMs: 10 }))!;
  app.clock.advance(10);
  const current = (await app.outbox.claim({ leaseMs: 10 }))!;
  const effect = (lease: typeof stale) =>
    app.kysely.transaction().execute(async (trx) => {
      await trx.insertInto("effects").values({ event_id: lease.eventId })
        .execute();
      await app.outbox.within(() => app.outbox.acknowledge(lease));
    });
  await assert.rejects(() => effect(stale), LeaseLostError);
  assert.deepEqual(
    await app.kysely.selectFrom("effects").selectAll().execute(),
    [],
  );
  await effect(current);
  assert.deepEqual(
    await app.kysely.selectFrom("effects").select("event_id").execute(),
    [{ event_id: current.eventId }],
  );
  assert.equal((await app.outbox.stats()).done, 1);
  assert.deepEqual(
    (await app.outbox.explain(current.eventId))?.history.map((e) => e.kind),
    ["claimed", "expired", "claimed", "acknowledged"],
  );
});
