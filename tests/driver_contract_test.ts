/**
 * The Driver contract itself (values, results, errors), run on every row of
 * the driver table: whatever one driver returns, every other must too.
 */
import assert from "node:assert/strict";
import { BusyError, ConstraintError, SqliteError } from "../errors.ts";
import type { Driver } from "../driver.ts";
import { type Connections, SQLITE_DRIVERS as DRIVERS } from "./drivers.ts";

function driverTest(
  name: string,
  fn: (a: Driver, b: Driver) => Promise<void>,
): void {
  for (const row of DRIVERS) {
    Deno.test(`${row.name}: ${name}`, async () => {
      const connections: Connections = await row.open();
      try {
        await fn(connections.drivers[0]!, connections.drivers[1]!);
      } finally {
        await connections.close();
      }
    });
  }
}

driverTest(
  "integers read back as numbers within ±2^53 and bigints beyond",
  async (db) => {
    await db.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v ANY) STRICT");
    const values = [
      0,
      -1,
      2 ** 31 - 1,
      2 ** 31,
      -(2 ** 31) - 1,
      1_700_000_000_000 + 2 ** 31,
      Number.MAX_SAFE_INTEGER,
      Number.MIN_SAFE_INTEGER,
      2n ** 53n,
      -(2n ** 53n),
      2n ** 53n + 1n,
      2n ** 63n - 1n,
      -(2n ** 63n),
    ];
    for (const [i, v] of values.entries()) {
      await db.run("INSERT INTO t VALUES (?, ?)", [i, v]);
    }
    const rows = await db.query(
      "SELECT v, typeof(v) AS type FROM t ORDER BY id",
    );
    assert.deepEqual(rows.map((row) => row["v"]), values);
    assert.ok(rows.every((row) => row["type"] === "integer"));
  },
);

driverTest("bigints past 64 bits are refused", async (db) => {
  await assert.rejects(db.query("SELECT ?", [2n ** 63n]), RangeError);
  await assert.rejects(db.query("SELECT ?", [-(2n ** 63n) - 1n]), RangeError);
});

driverTest("each parameter type binds as its SQLite type", async (db) => {
  assert.deepEqual(
    await db.query(
      "SELECT typeof(?) AS a, typeof(?) AS b, typeof(?) AS c, typeof(?) AS d, typeof(?) AS e, typeof(?) AS f",
      [3, 2 ** 40, 0.5, "x", new Uint8Array([1]), null],
    ),
    [{
      a: "integer",
      b: "integer",
      c: "real",
      d: "text",
      e: "blob",
      f: "null",
    }],
  );
});

driverTest(
  "text and blobs of any length and content round-trip",
  async (db) => {
    const texts = [
      "",
      "a",
      "x".repeat(32),
      "y".repeat(33),
      "z".repeat(64),
      "w".repeat(65),
      "tök",
      "emoji 😀 and ünïcödé",
      "long ".repeat(5_000) + "😀",
    ];
    for (const text of texts) {
      assert.deepEqual(
        await db.query("SELECT ? AS v, length(?) AS n", [text, text]),
        [
          { v: text, n: [...text].length },
        ],
      );
    }
    const blobs = [
      new Uint8Array([]),
      new Uint8Array([0, 1, 255]),
      new Uint8Array(100_000).map((_, i) => i % 251),
    ];
    for (const blob of blobs) {
      assert.deepEqual(await db.query("SELECT ? AS v", [blob]), [{ v: blob }]);
    }
    assert.deepEqual(await db.query("SELECT 0.25 AS r, NULL AS n"), [
      { r: 0.25, n: null },
    ]);
  },
);

driverTest(
  "a statement run again with fewer parameters sees NULL for the rest",
  async (db) => {
    assert.deepEqual(await db.query("SELECT ?1 AS a, ?2 AS b", [1, 2]), [
      { a: 1, b: 2 },
    ]);
    assert.deepEqual(await db.query("SELECT ?1 AS a, ?2 AS b", [1]), [
      { a: 1, b: null },
    ]);
  },
);

driverTest("run() reports changes and the last inserted rowid", async (db) => {
  await db.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT) STRICT");
  assert.deepEqual(
    await db.run("INSERT INTO t VALUES (?, ?)", [2n ** 60n, "a"]),
    {
      changes: 1,
      lastInsertRowid: 2n ** 60n,
    },
  );
  assert.deepEqual(await db.run("UPDATE t SET v = 'x'"), {
    changes: 1,
    lastInsertRowid: 2n ** 60n,
  });
  assert.deepEqual(await db.run("INSERT INTO t(v) VALUES ('b'), ('c')"), {
    changes: 2,
    lastInsertRowid: 2n ** 60n + 2n,
  });
});

driverTest(
  "a cached SELECT * sees columns this connection added",
  async (db) => {
    await db.exec("CREATE TABLE t(a INTEGER); INSERT INTO t VALUES (1)");
    assert.deepEqual(await db.query("SELECT * FROM t"), [{ a: 1 }]);
    await db.run("ALTER TABLE t ADD COLUMN b INTEGER DEFAULT 2");
    assert.deepEqual(await db.query("SELECT * FROM t"), [{ a: 1, b: 2 }]);
    await db.exec("ALTER TABLE t RENAME COLUMN a TO c");
    assert.deepEqual(await db.query("SELECT * FROM t"), [{ c: 1, b: 2 }]);
  },
);

driverTest(
  "engine errors carry the same class, code and message on every driver",
  async (db) => {
    await db.exec("CREATE TABLE t(x INTEGER UNIQUE); INSERT INTO t VALUES (1)");
    await assert.rejects(
      db.run("INSERT INTO t VALUES (?)", [1]),
      (error) =>
        error instanceof ConstraintError && error.code === 2067 &&
        error.message === "UNIQUE constraint failed: t.x",
    );
    await assert.rejects(
      db.query("SELECT * FROM missing"),
      (error) =>
        error instanceof SqliteError && error.code === 1 &&
        error.message === "no such table: missing",
    );
    await assert.rejects(
      db.query("SELECT ?", [1, 2]),
      (error) =>
        error instanceof SqliteError && error.primaryCode === 25 &&
        error.message === "column index out of range",
    );
    for (const empty of ["", "  ", "-- only a comment", " ; ;"]) {
      await assert.rejects(
        db.query(empty),
        (error) =>
          error instanceof SqliteError && error.code === 1 &&
          error.message === "Cannot prepare empty SQL.",
      );
    }
    // The failed statements were reset: the connection carries on.
    assert.deepEqual(await db.query("SELECT x FROM t"), [{ x: 1 }]);
  },
);

driverTest(
  "a second writer gets BusyError at once and can write after the first commits",
  async (a, b) => {
    await a.exec("CREATE TABLE t(x INTEGER)");
    await a.run("BEGIN IMMEDIATE");
    await assert.rejects(
      b.run("BEGIN IMMEDIATE"),
      (error) => error instanceof BusyError && error.primaryCode === 5,
    );
    await a.run("INSERT INTO t VALUES (1)");
    await a.run("COMMIT");
    await b.run("INSERT INTO t VALUES (2)");
    assert.deepEqual(await b.query("SELECT x FROM t ORDER BY x"), [
      { x: 1 },
      { x: 2 },
    ]);
  },
);

driverTest(
  "calls after close() reject and closing twice is a no-op",
  async (db) => {
    await db.query("SELECT 1");
    await db.close();
    await db.close();
    await assert.rejects(db.query("SELECT 1"), new Error("Database is closed"));
    await assert.rejects(db.run("SELECT 1"), new Error("Database is closed"));
    await assert.rejects(db.exec("SELECT 1"), new Error("Database is closed"));
  },
);

driverTest(
  "query() and run() refuse SQL holding a second statement, before running any",
  async (db) => {
    await db.exec("CREATE TABLE q(x TEXT); INSERT INTO q VALUES ('1')");
    await assert.rejects(
      db.run("INSERT INTO q VALUES(2); DELETE FROM q"),
      new RangeError(
        `Cannot run as 'sql' must hold one statement: found more after "INSERT INTO q VALUES(2);": "DELETE FROM q"`,
      ),
    );
    await assert.rejects(
      db.query("SELECT x FROM q; DELETE FROM q"),
      new RangeError(
        `Cannot query as 'sql' must hold one statement: found more after "SELECT x FROM q;": "DELETE FROM q"`,
      ),
    );
    for (
      const sql of [
        "INSERT INTO q VALUES (';'); DELETE FROM q",
        "INSERT INTO q VALUES ('2') -- note\n; DELETE FROM q",
        "INSERT INTO q VALUES ('2') /* ; */; /* c */ DELETE FROM q",
        "INSERT INTO q VALUES ('2');\n-- c\nDELETE FROM q; -- c",
        "INSERT INTO q VALUES ('2');;x",
        // SQLite stops reading at a NUL; the text after it is not ignored.
        "INSERT INTO q VALUES ('2')\0; DELETE FROM q",
      ]
    ) {
      // Twice: a refused text is not cached as if it had been checked.
      for (let i = 0; i < 2; i++) {
        await assert.rejects(db.run(sql), RangeError);
        await assert.rejects(db.query(sql), RangeError);
      }
    }
    // A bad parameter list changes nothing either.
    await assert.rejects(
      db.run("INSERT INTO q VALUES (?); DELETE FROM q", ["2"]),
      RangeError,
    );
    assert.deepEqual(await db.query("SELECT x FROM q"), [{ x: "1" }]);
    // exec() still runs whole scripts.
    await db.exec("INSERT INTO q VALUES ('2'); DELETE FROM q WHERE x = '1'");
    assert.deepEqual(await db.query("SELECT x FROM q"), [{ x: "2" }]);
  },
);

driverTest(
  "one statement may be followed by semicolons, comments and whitespace",
  async (db) => {
    await db.exec("CREATE TABLE q(x TEXT)");
    const inserts = [
      "INSERT INTO q VALUES ('a');",
      "INSERT INTO q VALUES ('b') -- why",
      "INSERT INTO q VALUES ('c') /* why */ ;; \n\t-- more\n",
      "-- leading\nINSERT INTO q VALUES ('d'); /* never closed",
      "INSERT INTO q VALUES ('e; DELETE FROM q')",
      "INSERT INTO q VALUES (?);\r\n",
    ];
    for (const sql of inserts) {
      const params = sql.includes("?") ? ["f"] : [];
      assert.equal((await db.run(sql, params)).changes, 1);
    }
    assert.deepEqual(
      await db.query("SELECT group_concat(x, '|') AS s FROM q; -- done"),
      [{ s: "a|b|c|d|e; DELETE FROM q|f" }],
    );
    assert.deepEqual(await db.query("SELECT ';' AS s; ;"), [{ s: ";" }]);
  },
);

driverTest(
  "values of other types are refused with a TypeError naming the parameter",
  async (db) => {
    await db.exec("CREATE TABLE q(x ANY) STRICT");
    for (
      const [value, shown] of [
        [{}, "[object Object]"],
        [undefined, "undefined"],
        [true, "true"],
        [new Int8Array([1]), "1"],
      ] as const
    ) {
      for (const params of [[value], ["x", value]]) {
        await assert.rejects(
          db.run("INSERT INTO q VALUES (?), (?)", params as never),
          new TypeError(
            `Cannot bind parameter ${params.length} as its type is not supported: current value is ${shown}`,
          ),
        );
      }
    }
    assert.deepEqual(await db.query("SELECT count(*) AS n FROM q"), [{ n: 0 }]);
  },
);

driverTest("NaN binds as NULL, SQLite's own rule", async (db) => {
  assert.deepEqual(
    await db.query("SELECT ? AS v, typeof(?) AS t, ? AS inf", [
      NaN,
      NaN,
      -Infinity,
    ]),
    [{ v: null, t: "null", inf: -Infinity }],
  );
});
