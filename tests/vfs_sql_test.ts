/**
 * The Deno file VFS seen through SQL on one process: the lock matrix, the
 * journal modes, symlinks, and files shared with native SQLite.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { BusyError, SqliteError } from "../errors.ts";
import { locksOn } from "./fixtures/vfs_locks.ts";
import { libcCalls } from "../deno/libc.ts";
import {
  type DenoSqliteWasmOptions,
  openSqliteWasm,
  type SqliteWasmDriver,
} from "../deno/sqlite_wasm.ts";

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vfs_sql_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Opens in a rollback-journal mode ("truncate" unless told): these tests are about its locks. */
async function open(
  path: string | URL,
  options?: DenoSqliteWasmOptions,
): Promise<SqliteWasmDriver> {
  return await openSqliteWasm(path, { journalMode: "truncate", ...options });
}

Deno.test("lock matrix over SQL: readers during RESERVED, one writer, COMMIT waits for readers, PENDING refuses new readers", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "matrix.db");
    await using writer = await open(path);
    await using reader = await open(path);
    await using other = await open(path);
    await using late = await open(path);
    await writer.exec(
      "CREATE TABLE t(x INTEGER) STRICT; INSERT INTO t VALUES (1)",
    );
    // Each connection learns the schema now: a busy schema reload would
    // report "no such table" rather than SQLITE_BUSY.
    for (const db of [reader, other, late]) await db.query("SELECT x FROM t");

    await writer.exec("BEGIN IMMEDIATE");
    await writer.run("INSERT INTO t VALUES (2)");
    // The journal is live and non-empty: the reader's hot-journal check must
    // see the RESERVED lock and read the committed state.
    assert.deepEqual(await reader.query("SELECT count(*) AS n FROM t"), [{
      n: 1,
    }]);
    await assert.rejects(other.exec("BEGIN IMMEDIATE"), BusyError);

    await reader.exec("BEGIN");
    assert.deepEqual(await reader.query("SELECT count(*) AS n FROM t"), [{
      n: 1,
    }]);
    await assert.rejects(writer.exec("COMMIT"), BusyError);
    // The failed COMMIT left the writer on PENDING: no new reader gets in.
    await assert.rejects(late.query("SELECT count(*) AS n FROM t"), BusyError);
    await reader.exec("COMMIT");
    await writer.exec("COMMIT");

    assert.deepEqual(await late.query("SELECT count(*) AS n FROM t"), [{
      n: 2,
    }]);
    // Every connection is back to NONE: an exclusive transaction succeeds.
    await other.exec("BEGIN EXCLUSIVE");
    await other.exec("COMMIT");
    assert.deepEqual(locksOn(path), []);
  });
});

Deno.test("closing another connection to the file keeps this connection's locks (unlike POSIX locks)", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "close.db");
    await using writer = await open(path);
    await writer.exec("CREATE TABLE t(x)");
    await writer.exec("BEGIN IMMEDIATE");
    await writer.run("INSERT INTO t VALUES (1)");
    const passerby = await open(path);
    assert.deepEqual(await passerby.query("SELECT count(*) AS n FROM t"), [{
      n: 0,
    }]);
    await passerby.close();
    await using other = await open(path);
    await assert.rejects(other.exec("BEGIN IMMEDIATE"), BusyError);
    await writer.exec("COMMIT");
    assert.deepEqual(await other.query("SELECT count(*) AS n FROM t"), [{
      n: 1,
    }]);
  });
});

Deno.test("journal modes: a new file defaults to WAL, an existing file not in WAL mode to truncate", async () => {
  await withDir(async (dir) => {
    const fresh = join(dir, "new.db");
    {
      await using db = await openSqliteWasm(fresh);
      assert.deepEqual(await db.query("PRAGMA journal_mode"), [{
        journal_mode: Deno.build.arch === "x86_64" ? "wal" : "truncate",
      }]);
      assert.deepEqual(await db.query("PRAGMA synchronous"), [{
        synchronous: 2,
      }]);
      await db.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1)");
    }
    const existing = join(dir, "existing.db");
    const native = new DatabaseSync(existing);
    native.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1)");
    native.close();
    await using db = await openSqliteWasm(existing);
    assert.deepEqual(await db.query("PRAGMA journal_mode"), [{
      journal_mode: "truncate",
    }]);
    // Reopened, the new file keeps the mode it was made in.
    await using again = await openSqliteWasm(fresh);
    assert.deepEqual(await again.query("PRAGMA journal_mode"), [{
      journal_mode: Deno.build.arch === "x86_64" ? "wal" : "truncate",
    }]);
    assert.deepEqual(await again.query("SELECT x FROM t"), [{ x: 1 }]);
  });
});

Deno.test("journal modes: truncate truncates the journal, delete removes it, persist keeps it", async () => {
  await withDir(async (dir) => {
    const cases = [
      { journalMode: "truncate", expected: "truncate", journal: 0 },
      { journalMode: "delete", expected: "delete", journal: null },
      { journalMode: "persist", expected: "persist", journal: "kept" },
    ] as const;
    for (const { journalMode, expected, journal } of cases) {
      const path = join(dir, `${expected}.db`);
      await using db = await open(path, { journalMode });
      assert.deepEqual(await db.query("PRAGMA journal_mode"), [{
        journal_mode: expected,
      }]);
      assert.deepEqual(await db.query("PRAGMA synchronous"), [{
        synchronous: 2,
      }]);
      await db.exec("CREATE TABLE t(x); INSERT INTO t VALUES (1)");
      const size = await Deno.stat(`${path}-journal`).then(
        (s) => s.size,
        () => null,
      );
      if (journal === "kept") assert.ok(size !== null && size > 0);
      else assert.equal(size, journal);
    }
  });
});

Deno.test("the directory is fsynced when a journal is created and when SQLite asks at delete", async () => {
  await withDir(async (dir) => {
    // The VFS syncs files with syncDataSync and directories with syncSync.
    const synced: string[] = [];
    const original = Deno.FsFile.prototype.syncSync;
    Deno.FsFile.prototype.syncSync = function (this: Deno.FsFile) {
      synced.push(this.statSync().isDirectory ? "directory" : "file");
      return original.call(this);
    };
    try {
      await using truncate = await open(join(dir, "t.db"));
      await truncate.exec("CREATE TABLE t(x)");
      const created = synced.length;
      assert.ok(created >= 1 && synced.every((kind) => kind === "directory"));
      await truncate.exec("INSERT INTO t VALUES (1)");
      assert.equal(
        synced.length,
        created,
        "an existing journal needs no directory sync",
      );

      const directorySyncs = async (synchronous: "full" | "extra") => {
        await using db = await open(join(dir, `${synchronous}.db`), {
          journalMode: "delete",
          synchronous,
        });
        // Counted from here: opening a new file writes its header (with
        // auto_vacuum) in a transaction of its own.
        synced.length = 0;
        await db.exec("CREATE TABLE t(x)");
        await db.exec("INSERT INTO t VALUES (1)");
        return synced.length;
      };
      // DELETE mode creates a journal per transaction: one directory sync
      // each; EXTRA also syncs the directory after deleting it.
      assert.equal(await directorySyncs("full"), 2);
      assert.equal(await directorySyncs("extra"), 4);
    } finally {
      Deno.FsFile.prototype.syncSync = original;
    }
  });
});

Deno.test("synchronous can be chosen per connection", async () => {
  await withDir(async (dir) => {
    await using db = await open(join(dir, "s.db"), { synchronous: "normal" });
    assert.deepEqual(await db.query("PRAGMA synchronous"), [{
      synchronous: 1,
    }]);
    await assert.rejects(
      open(join(dir, "s.db"), { synchronous: "fast" as never }),
      new RangeError(
        "Cannot open database as 'synchronous' must be one of off, normal, full, extra: current value is fast",
      ),
    );
  });
});

Deno.test("a file connection's page cache is native SQLite's default, not the build's 16 MiB", async () => {
  await withDir(async (dir) => {
    const native = new DatabaseSync(join(dir, "native.db"));
    let expected;
    try {
      expected = native.prepare("PRAGMA cache_size").get()?.["cache_size"];
    } finally {
      native.close();
    }
    assert.equal(expected, -2000);
    for (const journalMode of ["truncate", "wal"] as const) {
      await using db = await open(join(dir, `${journalMode}.db`), {
        journalMode,
      });
      assert.deepEqual(await db.query("PRAGMA cache_size"), [{
        cache_size: expected,
      }]);
    }
  });
});

Deno.test("a vfs that is not a name, or names no VFS SQLite has, throws naming 'vfs' before opening", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "v.db");
    await assert.rejects(
      open(path, { vfs: 5 as never }),
      new TypeError(
        "Cannot open database as 'vfs' must be a VFS name: current value is 5",
      ),
    );
    await assert.rejects(
      open(path, { vfs: "nope" }),
      new RangeError(
        `Cannot open database as 'vfs' must name a VFS registered with SQLite: current value is "nope"`,
      ),
    );
    await assert.rejects(Deno.stat(path), Deno.errors.NotFound);
  });
});

Deno.test("PRAGMA fullfsync makes every sync a full one (F_FULLFSYNC where the system has it), as in os_unix; without it none is", async () => {
  await withDir(async (dir) => {
    await using db = await open(join(dir, "full.db"));
    await db.exec("CREATE TABLE t(x)");
    // Whatever each sync called (fdatasync, fsync or F_FULLFSYNC).
    const made = () =>
      ["fdatasync", "fsync", "F_FULLFSYNC"].reduce(
        (sum, call) => sum + (libcCalls[call] ?? 0),
        0,
      );
    /** The syncs asked full, and those made, by one committed INSERT. */
    const commit = async (): Promise<[number, number]> => {
      const [full, syncs] = [libcCalls.full ?? 0, made()];
      await db.exec("INSERT INTO t VALUES (1)");
      return [(libcCalls.full ?? 0) - full, made() - syncs];
    };
    const [plainFull, plainSyncs] = await commit();
    assert.equal(plainFull, 0);
    assert.ok(plainSyncs > 0);
    await db.exec("PRAGMA fullfsync=ON");
    // Every sync of the commit (journal, database) asks for a full one.
    assert.deepEqual(await commit(), [plainSyncs, plainSyncs]);
  });
});

Deno.test("a path with a NUL character is refused with a TypeError naming it, before anything is opened or created", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "a.db\0.hidden");
    await assert.rejects(
      open(path),
      new TypeError(
        `Cannot open database as 'path' must not contain a NUL character (SQLite would open the file named by the text before it): current value is ${
          JSON.stringify(path)
        }`,
      ),
    );
    const url = new URL(`file://${dir}/b.db%00.hidden`);
    await assert.rejects(open(url), {
      name: "TypeError",
      message: new RegExp(`current value is "file://${dir}/b.db%00.hidden"`),
    });
    await assert.rejects(open(`file:${dir}/c.db%00x`), TypeError);
    assert.deepEqual([...Deno.readDirSync(dir)], []);
  });
});

Deno.test("a path that is not a string is refused with a TypeError showing what it is, not its String()", async () => {
  for (
    const [path, shown] of [
      ["", '""'],
      [["a.db"], "an array"],
      [{ toString: () => "a.db" }, "an object"],
      [Object.create(null), "an object"],
    ] as const
  ) {
    await assert.rejects(
      openSqliteWasm(path as never),
      new TypeError(
        `Cannot open database as 'path' must be a non-empty string: current value is ${shown}`,
      ),
    );
  }
});

Deno.test("opening waits while a writer holds the database exclusively, then succeeds", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "wait.db");
    await using writer = await open(path);
    await writer.exec("CREATE TABLE t(x)");
    await writer.exec("BEGIN EXCLUSIVE");
    const started = performance.now();
    setTimeout(() => writer.exec("COMMIT"), 100);
    await using late = await open(path);
    assert.ok(performance.now() - started >= 90);
    assert.deepEqual(await late.query("PRAGMA journal_mode"), [{
      journal_mode: "truncate",
    }]);
  });
});

Deno.test("a symlink and the real path share one journal and one set of locks", async () => {
  await withDir(async (dir) => {
    const real = join(dir, "real.db");
    const link = join(dir, "link.db");
    await using a = await open(real);
    await a.exec("CREATE TABLE t(x)");
    await Deno.symlink(real, link);
    await using b = await open(link);
    await a.exec("BEGIN IMMEDIATE");
    await assert.rejects(b.exec("BEGIN IMMEDIATE"), BusyError);
    await a.exec("COMMIT");
    await b.exec("INSERT INTO t VALUES (1)");
    assert.deepEqual(await a.query("SELECT count(*) AS n FROM t"), [{ n: 1 }]);
    const names = [...Deno.readDirSync(dir)].map((e) => e.name).sort();
    assert.deepEqual(names, [
      "link.db",
      "real.db",
      "real.db-journal",
    ]);
  });
});

Deno.test("a failed open says why, not only 'unable to open database file'", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "missing", "x.db");
    await assert.rejects(open(path), (error: unknown) => {
      assert.ok(error instanceof SqliteError);
      assert.equal(error.code, 14);
      assert.equal(
        error.message,
        `unable to open database file: No such file or directory (os error 2): open '${path}'`,
      );
      return true;
    });
  });
});

Deno.test("two hard links of one database share its locks: a writer through one name shuts out a writer through the other", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "linked.db");
    const other = join(dir, "other.db");
    await using a = await open(path);
    await a.exec("CREATE TABLE t(x)");
    await Deno.link(path, other);
    await using b = await open(other);
    await a.exec("BEGIN IMMEDIATE");
    await a.run("INSERT INTO t VALUES (1)");
    await assert.rejects(b.exec("BEGIN IMMEDIATE"), BusyError);
    await a.exec("COMMIT");
    await b.run("INSERT INTO t VALUES (2)");
    assert.deepEqual(await a.query("SELECT count(*) AS n FROM t"), [{ n: 2 }]);
  });
});

Deno.test("file: URLs and URIs open files; :memory: and memdb stay in memory", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "url db.db");
    {
      await using db = await open(new URL(`file://${path}`));
      await db.exec("CREATE TABLE t(x); INSERT INTO t VALUES ('url')");
    }
    await using byUri = await open(`file:${encodeURI(path)}?mode=ro`);
    assert.deepEqual(await byUri.query("SELECT x FROM t"), [{ x: "url" }]);
    await assert.rejects(byUri.exec("INSERT INTO t VALUES (1)"), /readonly/);
    await using memory = await open(":memory:");
    assert.deepEqual(await memory.query("PRAGMA journal_mode"), [{
      journal_mode: "memory",
    }]);
    await assert.rejects(
      open(new URL("https://example.com/x.db")),
      new TypeError(
        "Cannot open database as 'path' must be a file: URL: current value is https://example.com/x.db",
      ),
    );
  });
});

Deno.test("nameless temporary files (temp_store=FILE) work and leave nothing on disk", async () => {
  await withDir(async (dir) => {
    await using db = await open(join(dir, "temp.db"));
    await db.exec("PRAGMA temp_store=FILE; PRAGMA cache_size=10");
    await db.exec("CREATE TEMP TABLE scratch(v TEXT)");
    await db.exec("BEGIN");
    for (let i = 0; i < 3000; i++) {
      await db.run("INSERT INTO scratch VALUES (?)", [
        `${(i * 7919) % 3000}`.padStart(200, "0"),
      ]);
    }
    await db.exec("COMMIT");
    const rows = await db.query("SELECT v FROM scratch ORDER BY v LIMIT 2");
    assert.deepEqual(rows.map((row) => Number(row.v)), [0, 1]);
    await db.exec("DELETE FROM scratch WHERE rowid > 10; VACUUM temp");
    assert.deepEqual(await db.query("SELECT count(*) AS n FROM scratch"), [{
      n: 10,
    }]);
    const names = [...Deno.readDirSync(dir)].map((e) => e.name).sort();
    assert.deepEqual(names, [
      "temp.db",
    ]);
  });
});

Deno.test("a file written through the VFS passes integrity_check in native node:sqlite", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "interop.db");
    {
      await using db = await open(path);
      await db.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, body TEXT) STRICT");
      await db.exec("CREATE INDEX t_body ON t(body)");
      await db.exec("BEGIN");
      for (let i = 0; i < 2000; i++) {
        await db.run("INSERT INTO t(body) VALUES (?)", [
          `row ${i} ${"x".repeat(i % 300)}`,
        ]);
      }
      await db.exec("COMMIT");
      await db.run("DELETE FROM t WHERE id % 3 = 0");
    }
    const native = new DatabaseSync(path);
    try {
      assert.deepEqual(
        { ...native.prepare("PRAGMA integrity_check").get() },
        { integrity_check: "ok" },
      );
      assert.deepEqual({
        ...native.prepare("SELECT count(*) AS n FROM t").get(),
      }, { n: 1334 });
    } finally {
      native.close();
    }
  });
});

Deno.test("a file created by native SQLite opens and works through the VFS", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "native.db");
    const native = new DatabaseSync(path);
    native.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT) STRICT");
    const insert = native.prepare("INSERT INTO t(v) VALUES (?)");
    native.exec("BEGIN");
    for (let i = 0; i < 500; i++) insert.run(`native ${i}`);
    native.exec("COMMIT");
    native.close();

    {
      await using db = await open(path);
      assert.deepEqual(await db.query("SELECT count(*) AS n FROM t"), [{
        n: 500,
      }]);
      await db.run("UPDATE t SET v = v || ' wasm' WHERE id <= 100");
      await db.run("INSERT INTO t(v) VALUES ('from wasm')");
      assert.deepEqual(await db.query("PRAGMA integrity_check"), [{
        integrity_check: "ok",
      }]);
    }
    const again = new DatabaseSync(path);
    try {
      assert.deepEqual(
        {
          ...again.prepare(
            "SELECT count(*) AS n FROM t WHERE v LIKE 'native % wasm'",
          )
            .get(),
        },
        { n: 100 },
      );
      assert.deepEqual({ ...again.prepare("PRAGMA integrity_check").get() }, {
        integrity_check: "ok",
      });
    } finally {
      again.close();
    }
  });
});

Deno.test("a native WAL-mode file is switched to the requested rollback mode", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "native_wal.db");
    const native = new DatabaseSync(path);
    native.exec(
      "PRAGMA journal_mode=wal; CREATE TABLE t(x); INSERT INTO t VALUES (1)",
    );
    native.close();
    await using db = await open(path, { journalMode: "delete" });
    assert.deepEqual(await db.query("PRAGMA journal_mode"), [{
      journal_mode: "delete",
    }]);
    assert.deepEqual(await db.query("SELECT x FROM t"), [{ x: 1 }]);
  });
});

Deno.test("without --allow-ffi a file path fails at once naming the flag, and :memory: still works", async () => {
  await withDir(async (dir) => {
    const module = new URL("../deno/sqlite_wasm.ts", import.meta.url).href;
    const script = `
      const { openSqliteWasm } = await import(${JSON.stringify(module)});
      const memory = await openSqliteWasm(":memory:");
      console.log(JSON.stringify(await memory.query("SELECT 1 AS one")));
      await memory.close();
      try {
        await openSqliteWasm(${JSON.stringify(join(dir, "x.db"))});
        console.log("opened");
      } catch (error) {
        console.log(error.message);
      }
    `;
    // `deno eval` would grant every permission.
    const file = join(dir, "script.ts");
    await Deno.writeTextFile(file, script);
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--no-prompt",
        "--allow-read",
        "--allow-write",
        "--allow-env",
        "--config",
        new URL("../deno.json", import.meta.url).pathname,
        file,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const lines = new TextDecoder().decode(output.stdout).trim().split("\n");
    assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
    assert.equal(lines[0], '[{"one":1}]');
    assert.match(lines[1]!, /requires --allow-ffi/);
    assert.deepEqual(
      [...Deno.readDirSync(dir)].map((entry) => entry.name),
      ["script.ts"],
      "no database created",
    );
  });
});

Deno.test("a database whose earlier-release flock sidecar is locked is refused with a message naming it", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "old.db");
    {
      await using db = await open(path);
      await db.exec("CREATE TABLE t(x)");
    }
    const sidecar = `${path}-reserved.lock`;
    {
      using old = await Deno.open(sidecar, { create: true, write: true });
      await old.lock(true);
      await assert.rejects(
        open(path),
        (error: unknown) => {
          assert.ok(error instanceof SqliteError);
          assert.equal(error.code, 14);
          assert.match(error.message, /earlier leased-outbox release/);
          assert.ok(error.message.includes(sidecar));
          return true;
        },
      );
    }
    await using db = await open(path);
    assert.deepEqual(await db.query("SELECT count(*) AS n FROM t"), [{ n: 0 }]);
  });
});
