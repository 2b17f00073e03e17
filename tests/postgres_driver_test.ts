/**
 * The PostgreSQL driver against a real server: values, errors, and what a
 * lost connection, a restart and a timeout do to a transaction.
 */
import assert from "node:assert/strict";
import {
  connectPostgres,
  openPostgres,
  type PostgresDriver,
  type PostgresDriverOptions,
} from "../drivers/postgres.ts";
import {
  BusyError,
  ConnectionLostError,
  PostgresError,
  StatementTimeoutError,
} from "../errors.ts";
import { sharedPostgres, startPostgres } from "../scripts/postgres_server.ts";
import { POSTGRES } from "../dialects/postgres.ts";
import { POSTGRES_SCHEMA } from "../dialects/postgres_schema.ts";
import { Outbox } from "../lease.ts";
import { Inbox } from "../inbox.ts";

/** The dialect's statement texts: the only ones the driver names. */
const PREPARABLE: ReadonlySet<unknown> = new Set([
  ...Object.values(POSTGRES),
  ...Object.values(POSTGRES.inbox),
]);

/** A driver on a fresh schema of the shared server. */
async function connect(
  options: PostgresDriverOptions = {},
): Promise<PostgresDriver> {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  return await connectPostgres(server.url, { schema, ...options });
}

async function backendPid(db: PostgresDriver): Promise<number> {
  const [row] = await db.query("SELECT pg_backend_pid() AS pid");
  return Number(row?.["pid"]);
}

async function terminate(pid: number): Promise<void> {
  await using admin = await connect();
  await admin.query("SELECT pg_terminate_backend($1)", [pid]);
}

Deno.test("postgres driver: a connection lost while COMMIT is in flight fails it with ConnectionLostError saying the outcome is unknown", async () => {
  await using db = await connect();
  await db.exec(`
    CREATE TABLE t (id int);
    CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql
      AS $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
    CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON t
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
  `);
  const pid = await backendPid(db);
  await db.exec("BEGIN");
  await db.run("INSERT INTO t VALUES (1)");
  const commit = db.run("COMMIT").then(() => null, (error: unknown) => error);
  await using admin = await connect();
  // The deferred trigger runs inside COMMIT: it is in flight once it sleeps.
  for (;;) {
    const [row] = await admin.query(
      "SELECT wait_event FROM pg_stat_activity WHERE pid = $1",
      [pid],
    );
    if (row?.["wait_event"] === "PgSleep") break;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  await admin.query("SELECT pg_terminate_backend($1)", [pid]);
  const error = await commit;
  assert.ok(error instanceof ConnectionLostError, String(error));
  assert.match(
    error.message,
    /^Cannot commit as the connection was lost while COMMIT was in flight: whether the transaction committed is unknown \(.+\)$/,
  );
  assert.ok(error.cause instanceof ConnectionLostError);
  // The next statement opens a new connection.
  assert.deepEqual(await db.query("SELECT 1 AS one"), [{ one: 1 }]);
});

Deno.test("postgres driver: int8 reads back as a number within ±2^53 and a bigint beyond", async () => {
  await using db = await connect();
  await db.exec("CREATE TABLE t (id int PRIMARY KEY, v bigint)");
  const values = [
    0,
    -1,
    2 ** 31,
    Number.MAX_SAFE_INTEGER,
    Number.MIN_SAFE_INTEGER,
    2n ** 53n,
    -(2n ** 53n),
    2n ** 63n - 1n,
    -(2n ** 63n),
  ];
  for (const [i, v] of values.entries()) {
    await db.run("INSERT INTO t VALUES ($1, $2)", [i, v]);
  }
  const rows = await db.query("SELECT v FROM t ORDER BY id");
  assert.deepEqual(rows.map((row) => row["v"]), values);
});

Deno.test("postgres driver: bigints past 64 bits are refused before anything runs", async () => {
  await using db = await connect();
  await assert.rejects(db.query("SELECT $1::bigint", [2n ** 63n]), RangeError);
});

Deno.test("postgres driver: text, bytea and NULL round-trip exactly", async () => {
  await using db = await connect();
  const bytes = new Uint8Array(70_000).map((_, i) => i % 251);
  const text = "emoji 😀 and ünïcödé ".repeat(1_000);
  assert.deepEqual(
    await db.query("SELECT $1::text AS t, $2::bytea AS b, $3::text AS n", [
      text,
      bytes,
      null,
    ]),
    [{ t: text, b: bytes, n: null }],
  );
  assert.deepEqual(await db.query("SELECT ''::bytea AS b"), [{
    b: new Uint8Array(),
  }]);
});

Deno.test("postgres driver: run() reports the changed-row count", async () => {
  await using db = await connect();
  await db.exec("CREATE TABLE t (v int); INSERT INTO t VALUES (1), (2), (3)");
  assert.deepEqual(await db.run("UPDATE t SET v = v + 1 WHERE v > $1", [1]), {
    changes: 2,
    lastInsertRowid: 0,
  });
});

Deno.test("postgres driver: two statements in query() are refused and neither runs", async () => {
  await using db = await connect();
  await db.exec("CREATE TABLE t (v int)");
  await assert.rejects(
    db.query("INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)"),
    (error: Error) =>
      error instanceof RangeError &&
      error.message.startsWith("Cannot query as 'sql' must hold one statement"),
  );
  assert.deepEqual(await db.query("SELECT count(*) AS n FROM t"), [{ n: 0 }]);
});

Deno.test("postgres driver: a server error is a PostgresError with its SQLSTATE", async () => {
  await using db = await connect();
  await db.exec("CREATE TABLE t (v int PRIMARY KEY); INSERT INTO t VALUES (1)");
  await assert.rejects(
    db.run("INSERT INTO t VALUES (1)"),
    (error: unknown) =>
      error instanceof PostgresError && error.code === "23505" &&
      !(error instanceof ConnectionLostError),
  );
});

Deno.test("postgres driver: a statement past statementTimeoutMs fails with StatementTimeoutError and the connection goes on", async () => {
  await using db = await connect({ statementTimeoutMs: 50 });
  await assert.rejects(db.query("SELECT pg_sleep(5)"), StatementTimeoutError);
  assert.deepEqual(await db.query("SELECT 1 AS one"), [{ one: 1 }]);
});

Deno.test("postgres driver: a lock wait past lockTimeoutMs fails with BusyError and nothing changes", async () => {
  await using a = await connect();
  await a.exec("CREATE TABLE t (v int); INSERT INTO t VALUES (1)");
  const [schemaRow] = await a.query("SELECT current_schema() AS s");
  const server = await sharedPostgres();
  await using b = await connectPostgres(server.url, {
    schema: String(schemaRow?.["s"]),
    lockTimeoutMs: 50,
  });
  await a.run("BEGIN");
  await a.run("UPDATE t SET v = 2");
  await b.run("BEGIN");
  await assert.rejects(b.run("UPDATE t SET v = 3"), BusyError);
  await b.run("ROLLBACK");
  await a.run("ROLLBACK");
  assert.deepEqual(await b.query("SELECT v FROM t"), [{ v: 1 }]);
});

Deno.test("postgres driver: a connection terminated inside a transaction fails the rest of it, ROLLBACK succeeds, and the next transaction reconnects", async () => {
  await using db = await connect();
  await db.exec("CREATE TABLE t (v int)");
  const pid = await backendPid(db);
  await db.run("BEGIN");
  await db.run("INSERT INTO t VALUES (1)");
  await terminate(pid);
  await assert.rejects(db.run("INSERT INTO t VALUES (2)"), ConnectionLostError);
  await assert.rejects(db.run("COMMIT"), ConnectionLostError);
  await db.run("ROLLBACK");
  assert.notEqual(await backendPid(db), pid);
  assert.deepEqual(await db.query("SELECT count(*) AS n FROM t"), [{ n: 0 }]);
});

Deno.test("postgres driver: a connection terminated while idle reconnects at the next statement", async () => {
  await using db = await connect();
  const pid = await backendPid(db);
  await terminate(pid);
  // The server's goodbye may still be on its way: the first statement
  // either fails as lost or already runs on a new connection.
  const next = await backendPid(db).catch((error) => {
    assert.ok(error instanceof ConnectionLostError);
    return backendPid(db);
  });
  assert.notEqual(next, pid);
});

Deno.test("postgres driver: a server restart fails the transaction with ConnectionLostError, committed rows stay, and the driver reconnects", async () => {
  const server = await startPostgres();
  try {
    const db = await connectPostgres(server.url);
    try {
      await db.exec("CREATE TABLE t (v int); INSERT INTO t VALUES (1)");
      await db.run("BEGIN");
      await db.run("INSERT INTO t VALUES (2)");
      await server.restart();
      await assert.rejects(db.run("COMMIT"), ConnectionLostError);
      await db.run("ROLLBACK");
      assert.deepEqual(await db.query("SELECT v FROM t"), [{ v: 1 }]);
    } finally {
      await db.close();
    }
  } finally {
    await server.stop();
  }
});

Deno.test("postgres driver: connecting to a port nobody listens on fails with ConnectionLostError", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr;
  listener.close();
  await assert.rejects(
    connectPostgres(`postgres://postgres@127.0.0.1:${port}/postgres`, {
      connectTimeoutMs: 2_000,
    }),
    ConnectionLostError,
  );
});

Deno.test("postgres driver: bad options are refused with TypeError or RangeError naming the field", async () => {
  await assert.rejects(
    connectPostgres("mysql://x"),
    new TypeError(
      `Cannot connect as 'url' must be a postgres:// URL: current value begins "mysql:"`,
    ),
  );
  // No message quotes a password, however the URL is broken.
  for (
    const url of [
      "mysql://u:pa/ssW0RD@host/db",
      "postgres:/u:ssW0RD@host/db",
      "postgres://u:ssW0RD@host:99999/db",
      "postgres://u:ssW0RD@[::1/db",
      "postgres://u:pa/ssW0RD@host/db",
      "password=ssW0RD host=h",
      new URL("postgres://u:ssW0RD@host/db"),
    ]
  ) {
    await assert.rejects(
      connectPostgres(url as string),
      (error: Error) =>
        error instanceof TypeError && !/ssW0RD/.test(error.message),
      String(url).slice(0, 8),
    );
  }
  await assert.rejects(
    connectPostgres("postgres://x", { statementTimeoutMs: -1 }),
    new RangeError(
      "Cannot connect as 'statementTimeoutMs' must be a non-negative integer at most 2147483647: current value is -1",
    ),
  );
  await assert.rejects(
    connectPostgres("postgres://x", { schema: "Robert'); DROP" }),
    TypeError,
  );
  // Not a string: refused, not read as its String().
  for (
    const [schema, shown] of [
      [["jobs"], "an array"],
      [{ toString: () => "jobs" }, "an object"],
      [5, "5"],
    ] as const
  ) {
    await assert.rejects(
      connectPostgres("postgres://x", { schema: schema as never }),
      new TypeError(
        `Cannot connect as 'schema' must be a lowercase identifier of at most 63 characters, not beginning with pg_: current value is ${shown}`,
      ),
    );
  }
  await assert.rejects(
    connectPostgres("postgres://x", { statementTimeout: 5 } as never),
    new TypeError(
      "Cannot connect as 'statementTimeout' is not an option: the options are connectTimeoutMs, statementTimeoutMs, lockTimeoutMs, schema, prepare, applicationName, listen",
    ),
  );
  // A flag read from the environment is text, and "false" is truthy.
  for (const field of ["prepare", "listen"]) {
    await assert.rejects(
      connectPostgres("postgres://x", { [field]: "false" }),
      new TypeError(
        `Cannot connect as '${field}' must be a boolean: current value is "false"`,
      ),
    );
  }
});

Deno.test("postgres driver: NOTIFY reaches a listener between transactions", async () => {
  await using a = await connect();
  await using b = await connect();
  const received = Promise.withResolvers<string>();
  const stop = await a.listen("outbox_test", (payload) => {
    received.resolve(payload);
  });
  await b.query("SELECT pg_notify('outbox_test', 'hello')");
  assert.equal(await received.promise, "hello");
  await stop();
});

Deno.test("postgres driver: the outbox's statements are prepared by name, the app's never", async () => {
  const prepared = async (db: PostgresDriver) =>
    (await db.query(
      "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'leased_outbox_%'",
    )).map((row) => String(row["statement"]));
  await using db = await connect();
  for (let i = 0; i < 3; i++) {
    assert.equal((await db.query(POSTGRES.now)).length, 1);
    assert.deepEqual(await db.query("SELECT $1::int + 1 AS n", [i]), [{
      n: i + 1,
    }]);
  }
  const named = await prepared(db);
  assert.equal(named.filter((sql) => sql === POSTGRES.now).length, 1);
  assert.deepEqual(named.filter((sql) => !PREPARABLE.has(sql)), []);
  await using off = await connect({ prepare: false });
  await off.query(POSTGRES.now);
  assert.deepEqual(await prepared(off), []);
});

Deno.test("postgres driver: the inbox's record and lookup are prepared by name too", async () => {
  const db = await connect();
  await using inbox = await Inbox.open(db);
  const identity = "0190b2c4-7d3e-7a11-8f00-5c0ffee0cafe";
  const effect = () => Promise.resolve();
  assert.equal((await inbox.accept(identity, 1, effect)).status, "accepted");
  assert.equal((await inbox.accept(identity, 1, effect)).status, "duplicate");
  const named = (await db.query(
    "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'leased_outbox_%'",
  )).map((row) => String(row["statement"]));
  assert.deepEqual(
    [POSTGRES.inbox.record, POSTGRES.inbox.accepted].map((sql) =>
      named.filter((statement) => statement === sql).length
    ),
    [1, 1],
  );
});

Deno.test("postgres driver: after the application drops the named statements, they are parsed again: at once outside a transaction, at the next one inside", async () => {
  await using db = await connect();
  const now = async () => (await db.query(POSTGRES.now))[0]?.["now"];
  assert.equal(typeof await now(), "number");
  // Seen in the SQL: the names are forgotten before the next use.
  await db.run("DEALLOCATE ALL");
  assert.equal(typeof await now(), "number");
  // Unseen (inside a DO block): the server answers 26000, and the
  // statement runs again under a new name.
  const hidden = "DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$";
  await db.run(hidden);
  assert.equal(typeof await now(), "number");
  // Inside a transaction the server has failed it: the call fails once,
  // and the next transaction parses again.
  await db.run(hidden);
  await db.run("BEGIN");
  await assert.rejects(
    now(),
    (error) => error instanceof PostgresError && error.code === "26000",
  );
  await db.run("ROLLBACK");
  await db.run("BEGIN");
  assert.equal(typeof await now(), "number");
  await db.run("COMMIT");
});

Deno.test("postgres driver: an outbox goes on after the application's DEALLOCATE ALL in its transaction and after a returned column's type changes", async () => {
  const server = await sharedPostgres();
  const schema = await server.createSchema();
  await using outbox = await openPostgres(server.url, {
    schema,
    listen: false,
  });
  await using admin = await connect();
  await outbox.enqueue({ n: 1 });
  await outbox.transaction((tx) => tx.query("DEALLOCATE ALL"));
  await outbox.enqueue({ n: 2 });
  const first = await outbox.claim();
  assert.deepEqual(first?.payload, { n: 1 });
  assert.equal(await outbox.acknowledge(first!), true);
  // Planned claims and acknowledgements return last_error's type (in both
  // tables of events; the views over them are dropped and made again).
  await admin.exec(`SET search_path = ${schema};
    DROP VIEW outbox_ledger, outbox_unwritten_attempts, outbox_all;
    ALTER TABLE outbox_events ALTER COLUMN last_error TYPE varchar(1000);
    ALTER TABLE outbox_done ALTER COLUMN last_error TYPE varchar(1000)`);
  await admin.exec(POSTGRES_SCHEMA);
  const second = await outbox.claim();
  assert.deepEqual(second?.payload, { n: 2 });
  assert.equal(await outbox.acknowledge(second!), true);
  assert.equal((await outbox.stats()).done, 2);
});

Deno.test("postgres driver: inTransaction() follows BEGIN, a failed statement and ROLLBACK", async () => {
  await using db = await connect();
  assert.equal(db.inTransaction(), false);
  await db.run("BEGIN");
  assert.equal(db.inTransaction(), true);
  await assert.rejects(db.query("SELECT 1/0"), PostgresError);
  assert.equal(db.inTransaction(), true);
  await db.run("ROLLBACK");
  assert.equal(db.inTransaction(), false);
});

Deno.test("postgres driver: inTransaction() is true from the moment a BEGIN or START TRANSACTION is sent, before the server answers", async () => {
  await using db = await connect();
  for (
    const begin of [
      "BEGIN",
      "  start transaction isolation level read committed",
    ]
  ) {
    const sent = db.run(begin);
    // An outbox sharing the connection checks here, before its own BEGIN.
    assert.equal(db.inTransaction(), true, begin);
    await sent;
    assert.equal(db.inTransaction(), true, begin);
    await db.run("ROLLBACK");
    assert.equal(db.inTransaction(), false, begin);
  }
  // A BEGIN the server refuses leaves no transaction behind.
  await db.run("BEGIN");
  await assert.rejects(db.run("BEGIN ISOLATION LEVEL nonsense"), PostgresError);
  await db.run("ROLLBACK");
  assert.equal(db.inTransaction(), false);
});

/**
 * A TCP proxy in front of the server that cuts the connection, once armed,
 * when the client sends a statement holding `text`.
 */
function cuttingProxy(port: number, text: string) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const proxy = { armed: false, port: (listener.addr as Deno.NetAddr).port };
  const needle = new TextEncoder().encode(text);
  const holds = (chunk: Uint8Array) =>
    chunk.some((_, i) => needle.every((byte, j) => chunk[i + j] === byte));
  (async () => {
    for await (const client of listener) {
      const server = await Deno.connect({ hostname: "127.0.0.1", port });
      const cut = () => {
        for (const end of [client, server]) {
          try {
            end.close();
          } catch {
            // Closed already.
          }
        }
      };
      (async () => {
        for await (const chunk of client.readable) {
          if (proxy.armed && holds(chunk)) {
            proxy.armed = false;
            return cut();
          }
          const writer = server.writable.getWriter();
          await writer.write(chunk);
          writer.releaseLock();
        }
      })().catch(cut);
      server.readable.pipeTo(client.writable).catch(cut);
    }
  })().catch(() => {});
  return { proxy, close: () => listener.close() };
}

Deno.test("postgres driver: a connection cut during the ROLLBACK of a transaction leaves no transaction behind, and the next calls reconnect", async () => {
  const server = await sharedPostgres();
  const url = new URL(await server.createDatabase());
  const { proxy, close } = cuttingProxy(Number(url.port), "ROLLBACK");
  try {
    url.port = String(proxy.port);
    const driver = await connectPostgres(url.href, { listen: false });
    await using outbox = await Outbox.open(driver, { busyTimeoutMs: 500 });
    await outbox.enqueue("a");
    await assert.rejects(
      outbox.transaction(async (tx) => {
        await tx.run("SELECT 1");
        proxy.armed = true;
        throw new Error("the handler failed");
      }),
      /the handler failed/,
    );
    // Before, the driver still counted the transaction open: every claim
    // waited for "the application's transaction" and failed with BusyError.
    assert.equal(driver.inTransaction(), false);
    assert.equal((await outbox.claim())?.payload, "a");
    assert.equal((await outbox.enqueue("b")).deduplicated, false);
  } finally {
    close();
  }
});
