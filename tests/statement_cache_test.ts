import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import {
  STATEMENT_CACHE_SIZE,
  StatementCache,
} from "../drivers/statement_cache.ts";
import { loadSqlite3, sqliteWasmDriver } from "../drivers/sqlite_wasm.ts";
import { nodeSqliteDriver } from "../drivers/node_sqlite.ts";

/** 1,000 distinct SQL texts, values inlined, half run and half queried. */
const DISTINCT = 1_000;

Deno.test("StatementCache keeps the most recently used statements up to its capacity and finalizes each one it evicts once", () => {
  const finalized: string[] = [];
  const cache = new StatementCache<string>((s) => finalized.push(s), 3);
  for (const sql of ["a", "b", "c"]) cache.add(sql, sql.toUpperCase());
  assert.equal(cache.get("a"), "A");
  cache.add("d", "D");
  assert.deepEqual(finalized, ["B"]);
  assert.equal(cache.get("b"), undefined);
  cache.add("e", "E");
  assert.deepEqual(finalized, ["B", "C"]);
  assert.equal(cache.size, 3);
  cache.clear();
  assert.deepEqual(finalized, ["B", "C", "A", "D", "E"]);
  assert.equal(cache.size, 0);
  assert.equal(cache.finalized, 5);
});

Deno.test("StatementCache finalizes a statement that leaves it while in use only once its last use is left", () => {
  const finalized: string[] = [];
  const cache = new StatementCache<string>((s) => finalized.push(s), 1);
  cache.add("a", "A");
  cache.enter("A");
  cache.enter("A");
  cache.add("b", "B");
  cache.enter("B");
  cache.add("c", "C");
  assert.deepEqual(finalized, []);
  assert.equal(cache.size, 1);
  cache.leave();
  assert.deepEqual(finalized, ["B"]);
  cache.leave();
  assert.deepEqual(finalized, ["B"]);
  cache.leave();
  assert.deepEqual(finalized, ["B", "A"]);
});

Deno.test("StatementCache refuses a capacity that is not a positive integer with a RangeError naming it", () => {
  for (const capacity of [0, -1, 1.5, NaN]) {
    assert.throws(() => new StatementCache(() => {}, capacity), {
      name: "RangeError",
      message:
        `Cannot create a statement cache as 'capacity' must be a positive integer: current value is ${capacity}`,
    });
  }
});

Deno.test("the WASM driver keeps at most 256 prepared statements however many distinct SQL texts it runs, and finalizes the rest", async () => {
  const sqlite3 = await loadSqlite3();
  const db = new sqlite3.oo1.DB(":memory:");
  try {
    await using driver = await sqliteWasmDriver(db, { sqlite3 });
    /** The statements open on the connection, as SQLite lists them. */
    const open = () => {
      let count = 0;
      let stmt = sqlite3.capi.sqlite3_next_stmt(db.pointer!, 0);
      while (stmt) {
        count++;
        stmt = sqlite3.capi.sqlite3_next_stmt(db.pointer!, stmt);
      }
      return count;
    };
    await driver.run("CREATE TABLE t (n INTEGER)");
    for (let n = 0; n < DISTINCT; n++) {
      if (n % 2 === 0) await driver.run(`INSERT INTO t (n) VALUES (${n})`);
      else {
        assert.deepEqual(await driver.query(`SELECT ${n} AS n`), [{ n }]);
      }
    }
    assert.equal(STATEMENT_CACHE_SIZE, 256);
    assert.equal(open(), STATEMENT_CACHE_SIZE);
    // The most recent ones are still cached and still work.
    assert.deepEqual(
      await driver.query(`SELECT ${DISTINCT - 1} AS n`),
      [{ n: DISTINCT - 1 }],
    );
    assert.deepEqual(await driver.query("SELECT count(*) AS c FROM t"), [{
      c: DISTINCT / 2,
    }]);
    assert.equal(open(), STATEMENT_CACHE_SIZE);
    await driver.close();
    assert.equal(open(), 0);
  } finally {
    db.close();
  }
});

Deno.test("the WASM driver does not finalize a statement that statements run inside its step (an application's SQL function) push out of the cache", async () => {
  const sqlite3 = await loadSqlite3();
  const db = new sqlite3.oo1.DB(":memory:");
  try {
    await using driver = await sqliteWasmDriver(db, { sqlite3 });
    let calls = 0;
    db.createFunction("busy_work", () => {
      // More distinct statements than the cache holds, while the outer
      // query is between two steps.
      for (let i = 0; i <= STATEMENT_CACHE_SIZE; i++) {
        void driver.query(`SELECT ${calls * 1_000 + i}`);
      }
      return ++calls;
    });
    const rows = await driver.query(
      "SELECT busy_work() AS n FROM (VALUES (1), (2), (3))",
    );
    assert.deepEqual(rows, [{ n: 1 }, { n: 2 }, { n: 3 }]);
    assert.deepEqual(
      await driver.query(
        "SELECT busy_work() AS n FROM (VALUES (1), (2), (3))",
      ),
      [{ n: 4 }, { n: 5 }, { n: 6 }],
    );
  } finally {
    db.close();
  }
});

Deno.test("the node:sqlite driver keeps at most 256 statements however many distinct SQL texts it runs, and lets the rest be collected (and so finalized)", async () => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--v8-flags=--expose-gc",
      new URL("./fixtures/node_statements_child.ts", import.meta.url).pathname,
      String(DISTINCT),
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  assert.deepEqual(JSON.parse(new TextDecoder().decode(stdout)), {
    prepared: DISTINCT,
    collected: DISTINCT - STATEMENT_CACHE_SIZE,
  });
});

Deno.test("the node:sqlite driver still answers a statement that left its cache, by preparing it again", async () => {
  await using driver = nodeSqliteDriver(new DatabaseSync(":memory:"), {
    closeDatabase: true,
  });
  assert.deepEqual(await driver.query("SELECT 0 AS n"), [{ n: 0 }]);
  for (let n = 1; n <= STATEMENT_CACHE_SIZE; n++) {
    await driver.query(`SELECT ${n} AS n`);
  }
  assert.deepEqual(await driver.query("SELECT 0 AS n"), [{ n: 0 }]);
});

/**
 * Runs `SQL` on `driver` while an application's SQL function `nested`,
 * called by its own step, runs the same text once more; a function called
 * past 100 times throws, so a statement that restarts its step fails
 * rather than loops.
 */
async function runNested(
  driver: { query(sql: string, params?: unknown[]): Promise<unknown[]> },
  createFunction: (fn: (n: number) => number) => void,
): Promise<{ outer: unknown; inner: unknown[] }> {
  const SQL = "SELECT nested(?1 + column1) AS n FROM (VALUES (1), (2), (3))";
  let depth = 0;
  let calls = 0;
  const inner: unknown[] = [];
  createFunction((n) => {
    if (++calls > 100) throw new Error("the outer statement restarted");
    if (depth === 0) {
      depth++;
      driver.query(SQL, [1000]).then(
        (rows) => inner.push(rows),
        (error) => inner.push(String(error)),
      );
      depth--;
    }
    return n;
  });
  const outer = await driver.query(SQL, [10]).catch((error) => String(error));
  await Promise.resolve();
  return { outer, inner };
}

const NESTED = {
  outer: [{ n: 11 }, { n: 12 }, { n: 13 }],
  // One inner run per outer row.
  inner: Array.from({ length: 3 }, () => [
    { n: 1001 },
    { n: 1002 },
    { n: 1003 },
  ]),
};

Deno.test("the WASM driver runs a statement's own SQL text inside its step (an application's SQL function) on a second statement, so neither restarts the other", async () => {
  const sqlite3 = await loadSqlite3();
  const db = new sqlite3.oo1.DB(":memory:");
  try {
    await using driver = await sqliteWasmDriver(db, { sqlite3 });
    const result = await runNested(
      driver as never,
      (fn) =>
        db.createFunction(
          "nested",
          (_context: number, n: unknown) => fn(Number(n)),
        ),
    );
    assert.deepEqual(result, NESTED);
  } finally {
    db.close();
  }
});

Deno.test("the node:sqlite driver runs a statement's own SQL text inside its step (an application's SQL function) on a second statement, so neither restarts the other", async () => {
  const db = new DatabaseSync(":memory:");
  await using driver = nodeSqliteDriver(db, { closeDatabase: true });
  const result = await runNested(
    driver as never,
    (fn) => db.function("nested", (n) => fn(Number(n))),
  );
  assert.deepEqual(result, NESTED);
});
