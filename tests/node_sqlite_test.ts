import assert from "node:assert/strict";
import { join } from "node:path";
import { BusyError, ConstraintError, SqliteError } from "../errors.ts";
import { openNodeSqlite } from "../drivers/node_sqlite.ts";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";

async function tempFile(): Promise<{ path: string } & AsyncDisposable> {
  const dir = await Deno.makeTempDir({ prefix: "node_sqlite_test_" });
  return {
    path: join(dir, "test.db"),
    [Symbol.asyncDispose]: () => Deno.remove(dir, { recursive: true }),
  };
}

Deno.test("integers read back as numbers within ±2^53 and as bigints beyond", async () => {
  await using db = await openNodeSqlite(":memory:");
  await db.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER) STRICT");
  const values = [
    0,
    1_700_000_000_000 + 2 ** 31,
    Number.MAX_SAFE_INTEGER,
    Number.MIN_SAFE_INTEGER,
    2n ** 53n,
    -(2n ** 53n),
    2n ** 63n - 1n,
  ];
  for (const [i, v] of values.entries()) {
    await db.run("INSERT INTO t VALUES (?, ?)", [i, v]);
  }
  const rows = await db.query("SELECT v FROM t ORDER BY id");
  assert.deepEqual(rows.map((row) => row["v"]), values);
});

Deno.test("integer numbers bind as INTEGER and fractions as REAL", async () => {
  await using db = await openNodeSqlite(":memory:");
  assert.deepEqual(
    await db.query("SELECT typeof(?) AS a, typeof(?) AS b, ? + 1 AS c", [
      3,
      1.5,
      2 ** 31,
    ]),
    [{ a: "integer", b: "real", c: 2 ** 31 + 1 }],
  );
});

Deno.test("rows are plain objects carrying null, text, real and blob values", async () => {
  await using db = await openNodeSqlite(":memory:");
  const [row] = await db.query(
    "SELECT NULL AS n, 'tök' AS s, 0.25 AS r, x'0102ff' AS b",
  );
  assert.equal(Object.getPrototypeOf(row), Object.prototype);
  assert.deepEqual(row, {
    n: null,
    s: "tök",
    r: 0.25,
    b: new Uint8Array([1, 2, 255]),
  });
});

Deno.test("run() reports changes and the last inserted rowid", async () => {
  await using db = await openNodeSqlite(":memory:");
  await db.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT) STRICT");
  assert.deepEqual(
    await db.run("INSERT INTO t VALUES (?, ?)", [2n ** 60n, "a"]),
    { changes: 1, lastInsertRowid: 2n ** 60n },
  );
  assert.deepEqual(await db.run("INSERT INTO t(v) VALUES ('b'), ('c')"), {
    changes: 2,
    lastInsertRowid: 2n ** 60n + 2n,
  });
  assert.equal((await db.run("UPDATE t SET v = 'x'")).changes, 3);
});

Deno.test("a second writer gets BusyError at once, from statements and from exec()", async () => {
  await using file = await tempFile();
  await using a = await openNodeSqlite(file.path);
  await using b = await openNodeSqlite(file.path);
  assert.deepEqual(await b.query("PRAGMA busy_timeout"), [{ timeout: 0 }]);
  await a.exec("CREATE TABLE t(x INTEGER)");
  await a.run("BEGIN IMMEDIATE");
  await assert.rejects(b.run("BEGIN IMMEDIATE"), (error) => {
    assert.ok(error instanceof BusyError);
    assert.equal(error.code, 5);
    assert.equal(error.message, "database is locked");
    return true;
  });
  await assert.rejects(b.exec("INSERT INTO t VALUES (1)"), BusyError);
  await a.run("INSERT INTO t VALUES (1)");
  await a.run("COMMIT");
  await b.run("INSERT INTO t VALUES (2)");
  assert.deepEqual(await a.query("SELECT x FROM t ORDER BY x"), [
    { x: 1 },
    { x: 2 },
  ]);
});

Deno.test("constraint failures reject with ConstraintError carrying the extended code", async () => {
  await using db = await openNodeSqlite(":memory:");
  await db.exec("CREATE TABLE t(x INTEGER UNIQUE); INSERT INTO t VALUES (1)");
  await assert.rejects(db.run("INSERT INTO t VALUES (?)", [1]), (error) => {
    assert.ok(error instanceof ConstraintError);
    assert.equal(error.code, 2067);
    assert.equal(error.message, "UNIQUE constraint failed: t.x");
    assert.ok(error.cause instanceof Error);
    return true;
  });
  await assert.rejects(db.exec("INSERT INTO t VALUES (1)"), (error) => {
    assert.ok(error instanceof ConstraintError);
    assert.equal(error.code, 19);
    return true;
  });
});

Deno.test("other engine errors reject with SqliteError and keep the cause", async () => {
  await using db = await openNodeSqlite(":memory:");
  await assert.rejects(db.query("SELECT * FROM missing"), (error) => {
    assert.ok(error instanceof SqliteError);
    assert.ok(!(error instanceof BusyError));
    assert.equal(error.code, 1);
    assert.equal(error.message, "no such table: missing");
    assert.equal((error.cause as { code: string }).code, "ERR_SQLITE_ERROR");
    return true;
  });
});

Deno.test("foreign keys follow SQLite's default (off), like the WASM build", async () => {
  await using db = await openNodeSqlite(":memory:");
  assert.deepEqual(await db.query("PRAGMA foreign_keys"), [{
    foreign_keys: 0,
  }]);
});

Deno.test("a file opens in WAL with synchronous FULL by default", async () => {
  await using file = await tempFile();
  await using db = await openNodeSqlite(file.path);
  assert.deepEqual(await db.query("PRAGMA journal_mode"), [
    { journal_mode: "wal" },
  ]);
  assert.deepEqual(await db.query("PRAGMA synchronous"), [{ synchronous: 2 }]);
});

Deno.test("journalMode and synchronous options set those pragmas", async () => {
  await using file = await tempFile();
  await using db = await openNodeSqlite(new URL(`file://${file.path}`), {
    journalMode: "truncate",
    synchronous: "normal",
  });
  assert.deepEqual(await db.query("PRAGMA journal_mode"), [
    { journal_mode: "truncate" },
  ]);
  assert.deepEqual(await db.query("PRAGMA synchronous"), [{ synchronous: 1 }]);
});

Deno.test("bad paths and options throw before opening", async () => {
  for (
    const [path, shown] of [
      ["", '""'],
      [["a.db"], "an array"],
      [{ toString: () => "a.db" }, "an object"],
      [Object.create(null), "an object"],
    ] as const
  ) {
    await assert.rejects(
      openNodeSqlite(path as never),
      new TypeError(
        `Cannot open database as 'path' must be a non-empty string or URL: current value is ${shown}`,
      ),
    );
  }
  await assert.rejects(
    // @ts-expect-error: the mode is checked at run time too
    openNodeSqlite(":memory:", { journalMode: "WAL" }),
    new RangeError(
      "Cannot open database as 'journalMode' must be one of wal, delete, truncate, persist: current value is WAL",
    ),
  );
  await assert.rejects(
    // @ts-expect-error: the level is checked at run time too
    openNodeSqlite(":memory:", { synchronous: 2 }),
    new TypeError(
      "Cannot open database as 'synchronous' must be a string: current value is 2",
    ),
  );
  await assert.rejects(
    openNodeSqlite(":memory:", { busyTimeoutMs: -1 }),
    new TypeError(
      "Cannot open database as 'busyTimeoutMs' must be a non-negative integer: current value is -1",
    ),
  );
});

Deno.test("journalMode off and memory are refused with a RangeError before the file is opened, as openSqliteWasm refuses them", async () => {
  const dir = await Deno.makeTempDir();
  try {
    for (const journalMode of ["off", "memory"]) {
      const path = join(dir, `${journalMode}.db`);
      const why =
        " (no journal, or one in memory, cannot roll back a transaction safely: a refused acknowledgement's rows would stay, or a crash could corrupt the file)";
      await assert.rejects(
        openNodeSqlite(path, { journalMode: journalMode as never }),
        new RangeError(
          `Cannot open database as 'journalMode' must be one of wal, delete, truncate, persist: current value is ${journalMode}${why}`,
        ),
      );
      await assert.rejects(
        openSqliteWasm(path, { journalMode: journalMode as never }),
        new RangeError(
          `Cannot open database as 'journalMode' must be one of truncate, delete, persist, wal: current value is ${journalMode}${why}`,
        ),
      );
      await assert.rejects(Deno.stat(path), Deno.errors.NotFound);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** A rollback-journal database with one row, made read-only (0444). */
async function readOnlyFile(path: string): Promise<Uint8Array> {
  const db = await openNodeSqlite(path, { journalMode: "delete" });
  await db.exec("CREATE TABLE t(x INTEGER) STRICT; INSERT INTO t VALUES (7)");
  await db.close();
  await Deno.chmod(path, 0o444);
  return await Deno.readFile(path);
}

Deno.test("readOnly opens a 0444 file in its own journal mode, reads it, refuses writes and leaves it unchanged", async () => {
  await using file = await tempFile();
  const before = await readOnlyFile(file.path);
  {
    await using db = await openNodeSqlite(file.path, { readOnly: true });
    assert.deepEqual(await db.query("SELECT x FROM t"), [{ x: 7 }]);
    assert.deepEqual(await db.query("PRAGMA journal_mode"), [{
      journal_mode: "delete",
    }]);
    // SQLITE_OPEN_READONLY refuses writes even to root, who may write 0444.
    await assert.rejects(
      db.run("INSERT INTO t VALUES (8)"),
      (error) => error instanceof SqliteError && error.code === 8,
    );
  }
  assert.deepEqual(await Deno.readFile(file.path), before);
  assert.deepEqual(
    [...Deno.readDirSync(join(file.path, ".."))].map((e) => e.name),
    ["test.db"],
  );
  await assert.rejects(
    // @ts-expect-error: the flag is checked at run time too
    openNodeSqlite(file.path, { readOnly: "yes" }),
    new TypeError(
      "Cannot open database as 'readOnly' must be a boolean: current value is \"yes\"",
    ),
  );
});

Deno.test("a file the process may not write opens with the default options and keeps its journal mode", async () => {
  await using file = await tempFile();
  const before = await readOnlyFile(file.path);
  const dir = join(file.path, "..");
  const code = `
    import { openNodeSqlite } from ${
    JSON.stringify(new URL("../drivers/node_sqlite.ts", import.meta.url).href)
  };
    const db = await openNodeSqlite(${JSON.stringify(file.path)});
    const rows = await db.query("SELECT x FROM t");
    const mode = await db.query("PRAGMA journal_mode");
    const write = await db.run("INSERT INTO t VALUES (8)").then(() => "written", (e) => e.code);
    await db.close();
    console.log(JSON.stringify({ rows, mode, write }));
  `;
  const deno = [Deno.execPath(), "eval", "--no-config", code];
  // chmod 0444 stops no write by root: as root, the reader runs in its own
  // mount namespace where the database's directory is mounted read-only.
  const asRoot = Deno.uid() === 0;
  const { success, stdout, stderr } = await new Deno.Command(
    asRoot ? "unshare" : deno[0]!,
    {
      args: asRoot
        ? [
          "-m",
          "sh",
          "-c",
          'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
          dir,
          ...deno,
        ]
        : deno.slice(1),
      stdout: "piped",
      stderr: "piped",
    },
  ).output();
  assert.ok(success, new TextDecoder().decode(stderr));
  assert.deepEqual(JSON.parse(new TextDecoder().decode(stdout)), {
    rows: [{ x: 7 }],
    mode: [{ journal_mode: "delete" }],
    write: 8,
  });
  assert.deepEqual(await Deno.readFile(file.path), before);
});

Deno.test("opening waits up to busyTimeoutMs while another connection holds the lock the journal mode needs", async () => {
  await using file = await tempFile();
  await using holder = await openNodeSqlite(file.path, {
    journalMode: "delete",
  });
  await holder.exec("CREATE TABLE t (x INTEGER)");
  await holder.exec("BEGIN EXCLUSIVE");
  await holder.run("INSERT INTO t VALUES (1)");
  const started = performance.now();
  await assert.rejects(
    openNodeSqlite(file.path, { journalMode: "delete", busyTimeoutMs: 50 }),
    BusyError,
  );
  assert.ok(performance.now() - started >= 50);
  const opening = openNodeSqlite(file.path, {
    journalMode: "delete",
    busyTimeoutMs: 5_000,
  });
  await new Promise((resolve) => setTimeout(resolve, 100));
  await holder.exec("COMMIT");
  await using opened = await opening;
  assert.deepEqual(await opened.query("SELECT x FROM t"), [{ x: 1 }]);
});

Deno.test("calls after close() reject and closing twice is a no-op", async () => {
  const db = await openNodeSqlite(":memory:");
  await db.close();
  await db.close();
  await assert.rejects(db.query("SELECT 1"), new Error("Database is closed"));
  await assert.rejects(db.run("SELECT 1"), new Error("Database is closed"));
  await assert.rejects(db.exec("SELECT 1"), new Error("Database is closed"));
});

Deno.test("a cached statement sees columns added through run() or exec()", async () => {
  await using db = await openNodeSqlite(":memory:");
  await db.run("CREATE TABLE t(a INTEGER)");
  await db.run("INSERT INTO t VALUES (1)");
  assert.deepEqual(await db.query("SELECT * FROM t"), [{ a: 1 }]);
  await db.run("ALTER TABLE t ADD COLUMN b INTEGER DEFAULT 2");
  assert.deepEqual(await db.query("SELECT * FROM t"), [{ a: 1, b: 2 }]);
  await db.exec("ALTER TABLE t ADD COLUMN c INTEGER DEFAULT 3");
  assert.deepEqual(await db.query("SELECT * FROM t"), [{ a: 1, b: 2, c: 3 }]);
});
